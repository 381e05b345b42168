"""Notebook 13's checkers: right answers pass, wrong ones and student policies get a message that names the mistake."""

from __future__ import annotations

import kvlab.exercises as ex
from kvlab.exercises.nb13 import _arguments, _clock_at_end, _clock_in_prefix
from kvlab.server.agents import AppendOnly, KeepLast, SummarizeOnce, run_agent


def test_notebook_13_has_three_exercises():
    assert [e.id for e in ex.exercises("13")] == ["13.1", "13.2", "13.3"]


def test_keep_last_three():
    total = run_agent(KeepLast(3)).total_processed
    assert ex.check("13.1", total).right
    assert "keeping 5" in ex.check("13.1", 34000).message
    assert "append-only's total" in ex.check("13.1", 10000).message
    first_three = sum(t.processed_tokens for t in run_agent(KeepLast(3)).turns[:3])
    assert "add the first 3 turns" in ex.check("13.1", total - first_three).message
    assert ex.check("13.1", total + 1).status == ex.NOT_YET


def test_clock_placement():
    early = run_agent(_clock_in_prefix).total_processed
    late = run_agent(_clock_at_end).total_processed
    assert early > 10 * late  # the point of the exercise
    assert ex.check("13.2", [early, late]).right
    assert "Swapped" in ex.check("13.2", [late, early]).message
    assert "previous turn's clock" in ex.check("13.2", [early, 10000]).message
    assert "turn 1" in ex.check("13.2", [early - 100, late]).message
    assert "Recount the early clock" in ex.check("13.2", [early + 5, late]).message
    assert "Recount the clock at the end" in ex.check("13.2", [early, late + 5]).message
    assert "two whole numbers" in ex.check("13.2", [early]).message


def compacting(step: int):
    def policy(prefix, results):
        cut = step * ((len(results) - 3) // step) if len(results) > 3 else 0
        summary = list(range(900_000 + 1_000 * cut, 900_000 + 1_000 * cut + 300)) if cut else []
        return [*prefix, *summary, *(t for r in results[cut:] for t in r)]

    return policy


def test_a_rare_large_compaction_passes():
    for step in (4, 5, 6, 7):
        result = ex.check("13.3", compacting(step))
        assert result.right, (step, result.message)
        assert "keep the last 5: 34,000" in result.message


def test_policies_that_break_a_rule_are_told_which():
    assert "budget is 15,000" in ex.check("13.3", compacting(3)).message  # compacts too often
    assert "costliest turns" in ex.check("13.3", KeepLast(3)).message
    assert "the budget is 6,000" in ex.check("13.3", compacting(8)).message
    assert "the budget is 6,000" in ex.check("13.3", AppendOnly()).message
    assert "Turn 11's prompt has 6,400 tokens" in ex.check("13.3", SummarizeOnce(12)).message
    assert (
        "last 3 results" in ex.check("13.3", SummarizeOnce(6)).message
    )  # turn 7 keeps only the newest result
    assert "last 2 results" in ex.check("13.3", KeepLast(1)).message
    assert (
        "whole fixed prefix" in ex.check("13.3", lambda p, r: list(p)[1:] + [t for x in r for t in x]).message
    )
    assert "list of token ids" in ex.check("13.3", lambda p, r: 5).message


def test_student_errors_are_quoted_briefly():
    message = ex.check("13.3", lambda p, r: 1 / 0).message
    assert "ZeroDivisionError" in message and "<prefix: 2,000 tokens>, <results: 1 of 400 tokens>" in message
    assert len(message) < 200

    def unfinished(prefix, results):
        return ...

    assert ex.check("13.3", unfinished).status == ex.NOT_DONE


def test_the_arguments_match_what_run_agent_passes():
    seen = []

    def spy(prefix, results):
        seen.append((tuple(prefix), tuple(results)))
        return list(prefix) + [t for r in results for t in r]

    run_agent(spy, turns=3)
    for turn, (prefix, results) in enumerate(seen, start=1):
        ours = _arguments(turn)
        assert tuple(ours[0]) == prefix and tuple(ours[1]) == results
