"""Notebook 16's checkers: right answers pass; the common mistakes and the routers the notebook shows do not."""

from __future__ import annotations

import kvlab.exercises as ex
from kvlab.lessons import capstone
from kvlab.traces import read_trace


def test_notebook_16_has_four_exercises():
    assert [e.id for e in ex.exercises("16")] == ["16.1", "16.2", "16.3", "16.4"]


def test_trace_prediction_is_a_guess_and_its_reveal_names_the_slip():
    from kvlab.exercises import core
    from kvlab.exercises.core import predict, reveal

    trace = read_trace(capstone.sample_trace_path())
    first, second = trace.exchanges[0], trace.exchanges[1]
    cached = (len(first.prompt) + len(first.output) - 1) // 16 * 16
    cap = (len(second.prompt) - 1) // 16 * 16
    assert (
        cached > len(first.prompt) // 16 * 16
    )  # the reply crosses a block boundary: the point of the exercise
    assert cap > cached  # the last-token cap is not the answer: a guess of it is a slip worth naming
    assert ex.get("16.1").kind == "prediction" and ex.get("16.1").points == 2
    core._predictions.clear()
    core._revealed.clear()
    assert predict("16.1", 0).right and not predict("16.1", len(second.prompt) + 1).right
    predict("16.1", cap)
    assert "last-token cap" in reveal("16.1", cached).text()
    core._revealed.clear()
    predict("16.1", len(first.prompt) // 16 * 16)
    assert "prompt only" in reveal("16.1", cached).text()
    core._revealed.clear()
    predict("16.1", cached)
    assert reveal("16.1", cached).on_mark is True
    core._predictions.clear()
    core._revealed.clear()


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
