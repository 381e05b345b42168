"""Notebook 09's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import kvlab.exercises as ex

STABLE_THEN_STAMP = ["system prompt", "tools", "history", "new message", "timestamp"]


def test_notebook_09_has_three_exercises():
    assert [e.id for e in ex.exercises("09")] == ["09.1", "09.2", "09.3"]


def test_place_the_timestamp():
    assert ex.check("09.1", STABLE_THEN_STAMP).right
    assert ex.check("09.1", ["tools", "system prompt", "history", "new message", "timestamp"]).right  # a tie
    assert ex.check("09.1", tuple(STABLE_THEN_STAMP)).right
    before_message = ["system prompt", "tools", "history", "timestamp", "new message"]
    assert "is close" in ex.check("09.1", before_message).message
    assert "first block" in ex.check("09.1", ["timestamp", *STABLE_THEN_STAMP[:-1]]).message
    assert (
        "fixed part after it"
        in ex.check("09.1", ["system prompt", "history", "tools", "new message", "timestamp"]).message
    )
    assert (
        "before the history"
        in ex.check("09.1", ["system prompt", "tools", "timestamp", "history", "new message"]).message
    )
    assert (
        "new message differs"
        in ex.check("09.1", ["system prompt", "tools", "new message", "history", "timestamp"]).message
    )
    assert "exactly once" in ex.check("09.1", ["system prompt", "tools", "history"]).message
    assert (
        "Unknown segment"
        in ex.check("09.1", ["system", "tools", "history", "new message", "timestamp"]).message
    )
    assert "as strings" in ex.check("09.1", [1, 2, 3, 4, 5]).message


def test_sorted_tools():
    assert ex.check("09.2", 85.4).right
    assert "fraction" in ex.check("09.2", 0.854).message
    assert "shuffled list" in ex.check("09.2", 20.0).message
    assert not ex.check("09.2", 85.5).right


def test_tokens_computed_on_turn_11():
    result = ex.check("09.3", 126)
    assert result.right and "1,904" in result.message
    assert "whole prompt" in ex.check("09.3", 2030).message
    assert "cached part" in ex.check("09.3", 1904).message
    assert "partial block" in ex.check("09.3", 120).message
    assert "some other turn" in ex.check("09.3", 134).message
    assert ex.check("09.3", 126.0).right  # an exact integral float is the whole number a grader would read
    assert ex.check("09.3", 126.5).status == ex.NOT_YET  # a whole number is asked for
