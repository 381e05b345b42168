"""Notebook 12's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import kvlab.exercises as ex
from kvlab.server.swa import checkpoint_plan


def test_notebook_12_has_four_exercises():
    assert [e.id for e in ex.exercises("12")] == ["12.1", "12.2", "12.3", "12.4"]


def test_usable_or_not():
    assert ex.check("12.1", [True, False, True, False]).right
    assert ex.check("12.1", (True, False, True, False)).right
    assert (
        "B: it ends at 1836, after the reuse point 1400"
        in ex.check("12.1", [True, True, True, False]).message
    )
    assert "C: it starts at position 0" in ex.check("12.1", [True, False, False, False]).message
    said_d = ex.check("12.1", [True, False, True, True]).message
    assert "D: it starts at 300, not below the threshold 222" in said_d
    assert "reads positions 222 to 348" in said_d
    assert "True or False" in ex.check("12.1", [1, 0, 1, 0]).message
    assert "True or False" in ex.check("12.1", [True, False, True]).message


def test_checkpoint_placement():
    right = [c.n_tokens for c in checkpoint_plan(3000)]
    assert ex.check("12.3", right).right
    assert "one more than pos_max" in ex.check("12.3", [c.pos_max for c in checkpoint_plan(3000)]).message
    assert "oldest first" in ex.check("12.3", right[::-1]).message
    assert "gets 2 checkpoints" in ex.check("12.3", right[1:]).message
    assert "4 tokens" in ex.check("12.3", [2488, 3000]).message
    assert "whole numbers" in ex.check("12.3", ["2484", 2996]).message
    # a cut at n_batch (2,048) gets no checkpoint, and the feedback says so
    assert "2,048 is where the first batch ends" in ex.check("12.3", [2048, *right]).message


def test_chat_cache_n(feedback):
    feedback("12.4", [344, 76], "taken at 345 tokens", [
        ([400, 20], "--swa-full"),
        ([345, 75], "restarts at its last position, 344"),
        ([0, 420], "Not a full re-processing"),
        ([344, 70], "always the prompt's length, 420"),
        ([344], "[cache_n, prompt_n]"),
    ])  # fmt: skip
