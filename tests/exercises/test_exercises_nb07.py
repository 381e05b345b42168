"""Notebook 07's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import kvlab.exercises as ex
from kvlab.exercises.nb07 import _release_cases


def test_notebook_07_has_four_exercises():
    assert [e.id for e in ex.exercises("07")] == ["07.1", "07.2", "07.3", "07.4"]


def test_queue_after_d():
    assert ex.check("07.1", [5, 1, 0, 3, 4, 2]).right
    assert ex.check("07.1", (5, 1, 0, 3, 4, 2)).right
    assert "table order" in ex.check("07.1", [5, 1, 0, 2, 4, 3]).message
    assert "keep their places" in ex.check("07.1", [1, 5, 0, 3, 4, 2]).message
    assert "list each once" in ex.check("07.1", [5, 1, 0, 3, 4]).message
    assert "whole numbers" in ex.check("07.1", ["5", 1, 0, 3, 4, 2]).message


def test_next_evictions():
    assert ex.check("07.2", ["c3", "a2"]).right
    assert "order" in ex.check("07.2", ["a2", "c3"]).message
    assert "a1 is a hit" in ex.check("07.2", ["a1", "c3"]).message
    assert "2 new blocks" in ex.check("07.2", ["c3"]).message
    assert "as strings" in ex.check("07.2", [5, 1]).message


def test_front_rule():
    assert ex.check("07.3", [4, 2, 5, 6, 7, 1, 0, 3]).right
    assert "lesson's program" in ex.check("07.3", [5, 6, 7, 2, 1, 0, 4, 3]).message
    assert "ahead of it" in ex.check("07.3", [2, 4, 5, 6, 7, 1, 0, 3]).message
    assert "all 8 blocks" in ex.check("07.3", [4, 2, 5, 6, 7, 1, 0]).message


def _right(queue, table, counts, hashed):
    freed = [b for b in reversed(table) if counts[b] == 1]
    return [b for b in freed if b not in hashed] + list(queue) + [b for b in freed if b in hashed]


def test_release():
    cases = _release_cases()
    assert any(any(c[2][b] > 1 for b in c[1]) for c in cases), "some release must leave a shared block held"
    assert any(any(b not in c[3] for b in c[1]) for c in cases), "some release must free an unhashed block"
    assert ex.check("07.4", _right).right

    def all_to_back(queue, table, counts, hashed):
        return list(queue) + [b for b in reversed(table) if counts[b] == 1]

    def frees_shared(queue, table, counts, hashed):
        return (
            [b for b in reversed(table) if b not in hashed]
            + list(queue)
            + [b for b in reversed(table) if b in hashed]
        )

    assert "another order" in ex.check("07.4", all_to_back).message
    assert "still held by another request" in ex.check("07.4", frees_shared).message
    assert "as a list" in ex.check("07.4", lambda q, t, c, h: 3).message
    assert "raised" in ex.check("07.4", lambda q, t, c, h: c[99]).message
