"""Notebook 05's checkers (a shared system prompt): right answers pass, common wrong ones get a message naming the mistake."""

from __future__ import annotations

import kvlab.exercises as ex


def test_05_checkers_name_the_mistake():
    assert ex.check("05.1", [0, 1, 2, 3, 4, 9]).right
    assert "never registered" in ex.check("05.1", [0, 1, 2, 3, 4, 5]).message
    assert "take 6 blocks" in ex.check("05.1", [0, 1, 2, 3, 4]).message
    assert "block 4 holds" in ex.check("05.1", [0, 1, 2, 3, 9, 10]).message
    assert ex.check("05.2", 39).right
    assert "reuses" in ex.check("05.2", 64).message
    assert "whole blocks" in ex.check("05.2", 33).message
    rounded_up = ex.check("05.2", 31).message  # 103 - 72: the mixed block 64-71 taken as reused
    assert "64-71 as reused" in rounded_up and "2 question tokens" in rounded_up
    assert ex.check("05.3", lambda s, bs: s // bs * bs).right
    assert "different number" in ex.check("05.3", lambda s, bs: s).message
    rounded_up = ex.check("05.3", lambda s, bs: -(-s // bs) * bs)
    assert "returned 80" in rounded_up.message and "rounds up" in rounded_up.message
    assert "never shared" in rounded_up.message
    for _ in range(3):  # no hint, however many tries, hands over the formula
        hint = ex.check("05.3", lambda s, bs: -(-s // bs) * bs).hint or ""
        assert "//" not in hint and "rounded down" not in hint
