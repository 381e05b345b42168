"""Notebook 16's checkers: right answers pass; the common mistakes and the routers the notebook shows do not."""

from __future__ import annotations

import kvlab.exercises as ex
from kvlab.lessons import capstone
from kvlab.traces import read_trace


def test_notebook_16_has_four_exercises():
    assert [e.id for e in ex.exercises("16")] == ["16.1", "16.2", "16.3", "16.4"]


def test_trace_prediction_tells_the_reply_apart():
    first = read_trace(capstone.sample_trace_path()).exchanges[0]
    cached = (len(first.prompt) + len(first.output) - 1) // 16 * 16
    assert (
        cached > len(first.prompt) // 16 * 16
    )  # the reply crosses a block boundary: the point of the exercise
    assert ex.check("16.1", cached).right
    assert "prompt only" in ex.check("16.1", len(first.prompt) // 16 * 16).message
    assert "multiple of 16" in ex.check("16.1", cached + 3).message


def test_naive_cached_tokens():
    cost = capstone.price_session(capstone.agent_session(), capstone.naive_layout)
    assert cost.cached_tokens == 47 * 16  # the first block of every turn but the first
    assert ex.check("16.2", cost.cached_tokens).right
    assert "Not quite nothing" in ex.check("16.2", 0).message
    assert "first turn finds nothing" in ex.check("16.2", 48 * 16).message
    assert "multiple of 16" in ex.check("16.2", 47 * 22).message


def test_layouts_the_notebook_shows_do_not_pass():
    assert "80%" in ex.check("16.3", capstone.append_only_layout).message
    assert ex.check("16.3", capstone.naive_layout).status == ex.NOT_YET

    def drops_tools(session, turn):
        return [{"role": "system", "content": session.system}, {"role": "user", "content": session.task}]

    assert "tool definition" in ex.check("16.3", drops_tools).message
    assert "list of" in ex.check("16.3", lambda s, t: "not messages").message


def test_routers_the_notebook_shows_do_not_pass():
    assert "1.1" in ex.check("16.4", capstone.user_hash).message
    assert "below user-hash" in ex.check("16.4", capstone.most_cached).message
    assert ex.check("16.4", capstone.round_robin).status == ex.NOT_YET
    assert "replica index" in ex.check("16.4", lambda r, v: "0").message
    assert ex.check("16.4", capstone.longest_prefix).right
