"""Checkers of notebook 01 (and the start page's): right answers, and feedback on the usual mistakes."""

from __future__ import annotations

import kvlab.exercises as ex
from kvlab.lessons.ex01 import reserve_max


def test_start_page_check():
    assert ex.check("00.1", 4).right
    assert "% sign" in ex.check("01.1", "34.8%").message  # the sign goes as well as the quotes
    assert "12,288 slots, but the pool has 8,192" in ex.check("00.1", 6).message
    assert "1 region of 2,048 slots takes" in ex.check("00.1", 1).message  # one region, singular


def test_wrong_answers_get_specific_feedback():
    fraction = reserve_max([300, 1200, 150, 700, 500], max_len=1500).stored_percent / 100
    assert "fraction" in ex.check("01.1", fraction).message
    assert "not what the pool stores" in ex.check("01.1", 28.7).message
    assert "before q6 arrives" in ex.check("01.2", [600, 400, 892]).message
    assert "add up to" in ex.check("01.2", [100, 400]).message
    assert "wrong order" in ex.check("01.2", [892, 400, 100]).message
    assert "whole numbers" in ex.check("01.2", ["100", 400, 892]).message
    assert "exactly once" in ex.check("01.4", [1500, 600, 400, 1800, 2000]).message
    result = ex.check("01.4", [1500, 600, 1800, 400, 2000, 1000])  # the lesson's order: rejected
    assert result.status == ex.NOT_YET and "gaps [600, 400, 892]" in result.message


def test_percent_answers_within_rounding_are_right():
    expected = reserve_max([300, 1200, 150, 700, 500], max_len=1500).stored_percent
    assert ex.check("01.1", round(expected, 1)).right
    assert ex.check("01.1", expected).right
    assert not ex.check("01.1", round(expected, 1) + 0.1).right


def test_other_orders_that_avoid_the_rejection_are_right_too():
    assert ex.check("01.4", [1500, 1800, 2000, 1000, 600, 400]).right  # both finishers at the end
    assert ex.check("01.4", [1500, 600, 1800, 2000, 1000, 400]).right  # the 400 beside the free tail
    assert not ex.check("01.4", [600, 1500, 400, 1800, 2000, 1000]).right


def test_a_right_answer_shows_the_checkers_remark():
    result = ex.check("01.2", (100, 400, 892))
    assert result.right and result.status == ex.RIGHT and result.hint is None
    assert "[100, 400, 892]" in result.message
