"""Notebook 16's checkers: right answers pass; the common mistakes and the routers the notebook shows do not."""

from __future__ import annotations

import random

import pytest

import kvlab.exercises as ex
from kvlab.exercises import nb16
from kvlab.exercises.core import evaluate
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
    assert "1.10" in ex.check("16.4", capstone.user_hash).message
    assert "4.00 times the mean load" in ex.check("16.4", capstone.most_cached).message
    assert (
        "below 0.770, what routing by cached tokens reaches" in ex.check("16.4", capstone.round_robin).message
    )
    assert "replica index" in ex.check("16.4", lambda r, v: "0").message
    assert ex.check("16.4", capstone.longest_prefix).right


def _solution_router():
    """The router of solutions/16_*, run as the notebook runs it."""
    from pathlib import Path

    path = next((Path(__file__).parents[2] / "solutions").glob("16_*.py"))
    source = {}
    exec(compile(path.read_text(), str(path), "exec"), source)
    cell = {"check": lambda *args: None}
    exec(source["SOLUTIONS"]["16.4"], cell)
    return cell["router"]


def _by_user_modulo(request, replicas):
    return request.user % len(replicas)


def test_cache_blind_sticky_routing_fails_where_users_split_unevenly():
    # user % 4 is perfectly balanced on the lesson's 48 users: the notebook's second traffic catches it
    exercise = ex.get("16.4")
    lesson, uneven = exercise.draw_cases(None)
    assert not lesson.splits_unevenly and uneven.splits_unevenly and uneven.replicas != 4
    alone = nb16.prefix_router(_by_user_modulo, [lesson])
    assert alone.startswith("Good routing")  # on the lesson's traffic alone it would pass
    verdict = ex.check("16.4", _by_user_modulo)
    assert verdict.status == ex.NOT_YET
    assert "13 users do not split evenly over 3 replicas" in verdict.message
    assert "times the mean load" in verdict.message and "seed=2" in verdict.message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hidden_traffics_pass_the_reference_and_fail_cache_blind_routers(seed):
    exercise = ex.get("16.4")
    cases = exercise.draw_cases(random.Random(seed))
    assert len(cases) == 4 and {c.replicas for c in cases[2:]} == {3, 5}
    assert all(c.splits_unevenly for c in cases[1:])  # no whole-user split keeps the load bound
    for reference in (capstone.longest_prefix, _solution_router()):
        assert evaluate(exercise, reference, cases).status == ex.RIGHT
        for traffic in cases:
            result = capstone.route_fleet(reference, **traffic.options())
            assert result.imbalance <= nb16.LOAD_BOUND
            mean = sum(result.requests) / len(result.requests)
            assert max(result.requests) <= nb16.LOAD_BOUND * mean  # within the bound, not by rounding
    for blind in (capstone.user_hash, _by_user_modulo):
        for traffic in cases[1:]:
            verdict = evaluate(exercise, blind, [traffic])
            assert verdict.status == ex.NOT_YET and "do not split evenly" in verdict.message
    verdict = evaluate(exercise, capstone.round_robin, cases[2:])
    assert verdict.status == ex.NOT_YET and "below" in verdict.message


def test_a_right_layout_names_both_sessions():
    cell = {"check": lambda *args: None}
    from pathlib import Path

    path = next((Path(__file__).parents[2] / "solutions").glob("16_*.py"))
    source = {}
    exec(compile(path.read_text(), str(path), "exec"), source)
    exec(source["SOLUTIONS"]["16.3"], cell)
    verdict = ex.check("16.3", cell["layout"])
    assert verdict.right
    assert "this session (seed 16): $" in verdict.message and "agent_session(7): $" in verdict.message
