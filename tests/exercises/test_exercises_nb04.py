"""Notebook 04's checkers (copy-on-write): right answers pass, common wrong ones get a message naming the mistake."""

from __future__ import annotations

import kvlab.exercises as ex


def test_04_checkers_name_the_mistake():
    assert ex.check("04.1", [[0, 1, 2, 4], [0, 1, 2, 5], [0, 1, 2, 6], [0, 1, 2, 3]]).right
    assert "right after the fork" in ex.check("04.1", [[0, 1, 2, 3]] * 4).message
    copies_in_order = [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2, 5], [0, 1, 2, 6]]
    assert "which sample keeps" in ex.check("04.1", copies_in_order).message
    assert "4 block tables" in ex.check("04.1", [[0, 1, 2, 3]]).message
    assert ex.check("04.2", lambda p, n, bs: (n - 1) * (p % bs)).right
    every_sample = ex.check("04.2", lambda p, n, bs: n * (p % bs)).message
    assert "returned 24" in every_sample and "writes in place" in every_sample and "n - 1" in every_sample
    assert "different number" in ex.check("04.2", lambda p, n, bs: n * bs).message
    assert ex.check("04.3", {0: 2, 1: 2, 2: 1, 4: 1}).right
    assert "before sample 0 finishes" in ex.check("04.3", {0: 3, 1: 3, 2: 1, 3: 1, 4: 1}).message
    assert "leave it out" in ex.check("04.3", {0: 2, 1: 2, 2: 1, 3: 0, 4: 1}).message
    assert "some count is off" in ex.check("04.3", {0: 3, 1: 3, 2: 1, 4: 1}).message
