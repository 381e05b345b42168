"""Notebook 02's checkers (block tables): right answers pass, common wrong ones get a message naming the mistake."""

from __future__ import annotations

import kvlab.exercises as ex


def test_02_checkers_name_the_mistake():
    assert ex.check("02.1", 46).right
    assert "position in the sequence" in ex.check("02.1", 30).message
    assert "physical block" in ex.check("02.1", 2).message
    assert "wrong block" in ex.check("02.1", 9 * 16 + 14).message
    assert ex.check("02.2", [1, 1, 2, 4, 7, 128]).right
    assert "rounded down" in ex.check("02.2", [0, 1, 1, 4, 6, 128]).message
    assert "multiple of 16" in ex.check("02.2", [1, 2, 2, 5, 7, 129]).message
    assert "one number per length" in ex.check("02.2", [1, 1, 2]).message
    assert ex.check("02.3", lambda t, bs, n: [t[p // bs] * bs + p % bs for p in range(n)]).right
    short = ex.check("02.3", lambda t, bs, n: [t[p // bs] * bs + p % bs for p in range(n - 1)])
    assert "one per token" in short.message
    assert "other slots" in ex.check("02.3", lambda t, bs, n: list(range(n))).message
    assert ex.check("02.4", ["A", 21]).right
    assert "offset inside the block" in ex.check("02.4", ["A", 5]).message
    assert "not in B's block table" in ex.check("02.4", ["B", 21]).message
    assert "sequence name and a position" in ex.check("02.4", [21]).message
    past_end = ex.check("02.4", ["A", 37]).message
    assert "positions 0-36" in past_end and "past its end" in past_end and "slot's number" in past_end
    assert "another slot" not in past_end
