"""Notebook 11's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import kvlab.exercises as ex
from kvlab.exercises.nb11 import SIZE_SHAPE, _refused
from kvlab.server.slot_files import header_bytes


def test_notebook_11_has_three_exercises():
    assert [e.id for e in ex.exercises("11")] == ["11.1", "11.2", "11.3"]


def test_file_size():
    assert header_bytes(SIZE_SHAPE) == 64 + 16 * 28
    assert ex.check("11.1", 114_720_512).right
    assert "do not grow" in ex.check("11.1", 114_720_000).message
    assert "id (4 B)" in ex.check("11.1", 114_688_000).message
    assert "both K and V" in ex.check("11.1", 57_376_512).message
    assert "8B shape" in ex.check("11.1", 2000 * 131_072).message


def test_break_even_disk():
    assert ex.check("11.2", 0.674).right
    assert ex.check("11.2", 0.67).right
    assert "MB/s" in ex.check("11.2", 674).message
    assert "GiB/s" in ex.check("11.2", 0.628).message
    assert "against the CPU" in ex.check("11.2", 0.0083).message
    assert not ex.check("11.2", 3.0).right


def test_refused_restores_are_found_by_trying_them():
    assert _refused() == [4, 5, 6]
    assert ex.check("11.3", [6, 5, 4]).right
    assert "restore fine" in ex.check("11.3", [1, 4, 5, 6]).message
    assert "misses 1 refused restore" in ex.check("11.3", [4, 6]).message
    assert "misses 2 refused restores" in ex.check("11.3", [4]).message
    assert "once" in ex.check("11.3", [4, 4, 5, 6]).message
    assert "whole numbers" in ex.check("11.3", ["4", 5, 6]).message
