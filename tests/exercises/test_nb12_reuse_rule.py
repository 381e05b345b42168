"""Exercise 12.2, the reuse rule as a function: right on the notebook's and the hidden runs, and
each common slip (<= at the boundary, oldest checkpoint first, the first window) named."""

from __future__ import annotations

import random
import runpy
from pathlib import Path

import pytest

import kvlab.exercises as ex
from kvlab.exercises.nb12 import DECIDE_CASES, _run_decide_case
from kvlab.exercises.sandbox import SandboxFunction, without_checks
from kvlab.lessons import ex12, real_llama

ROOT = Path(__file__).resolve().parents[2]


def _solution() -> object:
    source = runpy.run_path(str(ROOT / "solutions" / "12_sliding_window_checkpoints.py"))["SOLUTIONS"]["12.2"]
    namespace: dict = {"check": lambda *_: None}
    exec(source, namespace)
    return namespace["decide"]


def _rule(*, at_or_below: bool = False, newest_first: bool = True, first_window: bool = True):
    """The rule with one slip switched on, to see the message it gets."""

    def decide(n_past, oldest_held, checkpoints, n_swa):
        threshold = max(0, n_past - n_swa)
        if oldest_held < threshold or (at_or_below and oldest_held == threshold):
            return "cells"
        if not first_window and threshold == 0:
            return "cells"
        for pos_min, pos_max in reversed(checkpoints) if newest_first else checkpoints:
            if pos_max <= n_past and (pos_min < threshold or pos_min == 0):
                return (pos_min, pos_max)
        return "start over"

    return decide


def test_the_notebook_runs_cover_every_outcome_and_the_boundary():
    outcomes = [_run_decide_case(c) for c in DECIDE_CASES]
    assert [d.outcome for d in outcomes] == [
        "start over", "cells", "start over", "cells", (0, 344), (516, 1283), (0, 83),
    ]  # fmt: skip
    edge, past_edge = outcomes[2], outcomes[3]
    assert (edge.n_past, edge.oldest_held) == (1201, 1073) and past_edge.n_past == 1202


def test_the_solution_is_right_on_the_notebooks_runs_and_on_hidden_ones():
    decide = _solution()
    assert ex.check("12.2", decide).right
    e = ex.get("12.2")
    for seed in range(4):
        hidden = e.draw_cases(random.Random(seed))
        assert len(hidden) == len(DECIDE_CASES) + 8
        assert ex.evaluate(e, decide, hidden).status == ex.RIGHT


def test_the_grader_runs_it_in_its_sandbox_on_hidden_runs():
    # the grader's child process hands the checkpoints over as lists and returns pairs as lists
    source = runpy.run_path(str(ROOT / "solutions" / "12_sliding_window_checkpoints.py"))["SOLUTIONS"]["12.2"]
    e = ex.get("12.2")
    for text, status in ((source, ex.RIGHT), (source.replace("< threshold:", "<= threshold:"), ex.NOT_YET)):
        function = SandboxFunction(without_checks(text), "decide", seconds=4.0, memory_mib=1024)
        try:
            verdict = ex.evaluate(e, function, e.draw_cases(random.Random(5)))
        finally:
            function.close()
        assert verdict.status == status, verdict.message


def test_the_registry_keeps_its_teaching_data():
    e = ex.get("12.2")
    assert (e.points, e.difficulty, e.prerequisites, e.answer_type) == (2, "core", ("12.1",), "function")


@pytest.mark.parametrize(
    ("slip", "words"),
    [
        ({"at_or_below": True}, "strictly below"),
        ({"newest_first": False}, "takes the newest"),
        ({"first_window": False}, "the threshold is 0"),
    ],
    ids=["<=", "oldest first", "first window"],
)
def test_each_slip_gets_a_message_that_names_it(slip, words):
    verdict = ex.check("12.2", _rule(**slip))
    assert verdict.status == ex.NOT_YET and words in verdict.message, verdict.message


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (lambda *a: "reuse", 'return "cells", "start over"'),
        (lambda *a: (1, 2), "not one of the checkpoints"),
        (lambda *a: "cells", "not below 222"),
        (lambda *a: "start over", "the cells serve"),
    ],
)
def test_wrong_answers_say_what_to_look_at(body, words):
    verdict = ex.check("12.2", body)
    assert verdict.status == ex.NOT_YET and words in verdict.message, verdict.message


def test_a_function_that_raises_is_not_yet():
    def decide(n_past, oldest_held, checkpoints, n_swa):
        raise ValueError("no")

    assert "raised ValueError" in ex.check("12.2", decide).message


@pytest.mark.slow
@pytest.mark.skipif(
    not real_llama.available("gemma3"), reason="no llama-server built (see tools/conformance)"
)
def test_the_boundary_the_exercise_states_is_the_real_servers():
    # notebook 12 shows these as what llama-server 0c1e57098 did: one position decides
    long_prompt = tuple(3 + (7 * i) % 509 for i in range(ex12.LESSON_PROMPT))
    rows = []
    for shared in ex12.BOUNDARY:
        branch = long_prompt[:shared] + tuple(3 + (1 + 7 * i) % 509 for i in range(4))
        real, ours = real_llama.run_swa(
            [real_llama.Request(long_prompt), real_llama.Request(branch)], ctx_checkpoints=0
        )
        rows.append(((real[1]["cache_n"], real[1]["prompt_n"]), (ours[1]["cache_n"], ours[1]["prompt_n"])))
    assert rows == [((0, 1205), (0, 1205)), ((1202, 4), (1202, 4))]
