"""Notebook 08's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import kvlab.exercises as ex


def test_notebook_08_has_four_exercises():
    assert [e.id for e in ex.exercises("08")] == ["08.1", "08.2", "08.3", "08.4"]


def test_matched_lengths():
    assert ex.check("08.1", [10, 3, 8, 0]).right
    message = ex.check("08.1", [10, 0, 6, 0]).message  # whole runs only
    assert "Requests 2 and 3" in message and "middle of a run" in message
    assert "first token that differs" in ex.check("08.1", [11, 3, 8, 0]).message
    assert "4 whole numbers" in ex.check("08.1", [10, 3, 8]).message


def test_evicted_runs():
    right = ex.check("08.2", [[30, 31], [10, 11]])
    # the match refreshed [20, 21, 22] to the newest leaf, so the remark must not call it older
    assert right.right and "older" not in right.message and "newest leaf" in right.message
    assert ex.check("08.2", ((30, 31), (10, 11))).right
    assert "fewer than the 3" in ex.check("08.2", [[30, 31]]).message
    assert "never takes a locked node" in ex.check("08.2", [[20, 21, 22]]).message
    assert "wrong order" in ex.check("08.2", [[10, 11], [30, 31]]).message
    assert "list of runs" in ex.check("08.2", [30, 31]).message


def test_stored_tokens():
    def right(prompts):
        return len({tuple(p[:i]) for p in prompts for i in range(1, len(p) + 1)})

    assert ex.check("08.3", right).right
    assert "every prompt token" in ex.check("08.3", lambda prompts: sum(map(len, prompts))).message
    assert "another number" in ex.check("08.3", lambda prompts: 13).message


def test_page_size_four():
    assert ex.check("08.4", [8, 12]).right
    assert "page size 1" in ex.check("08.4", [9, 12]).message
    assert "page-size-1 count" in ex.check("08.4", [8, 13]).message
    assert "two whole numbers" in ex.check("08.4", [8]).message
