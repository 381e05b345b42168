"""Exercises of notebook 13, agent history (lesson example 13).

The expected answers come from ``kvlab.server.agents.run_agent`` with the lesson's
setup (20 turns, a 2,000-token prefix, 400-token tool results); nothing here
states them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvlab.errors import KvlabError
from kvlab.exercises.core import NotYet, call, exercise, expect_two_whole
from kvlab.server.agents import AppendOnly, KeepLast, run_agent

TURNS, PREFIX, RESULT = 20, 2000, 400
KEEP = 3  # 13.1: keep the last 3 results
CLOCK_TOKENS, CLOCK_AT = (
    10,
    100,
)  # 13.2: a 10-token clock, after the first 100 prefix tokens or at the very end
CLOCK_FIRST_ID = 800_000
BUDGET_PROMPT = 6000  # 13.3: no prompt longer than this
BUDGET_FACTOR = 1.5  # 13.3: total processed at most this times the least any policy can process
LAST_KEPT = 3  # 13.3: the last three results stay in full


@exercise(
    "13.1",
    title="What does keeping the last 3 cost?",
    assesses="predicting the cost of trimming at the front: each trimmed turn reprocesses the whole kept history",
    minutes=6,
    answer_type="int",
    points=2,
    difficulty="core",
    prerequisites=["09.1"],
    hints=[
        "Until the history is full (3 results) the prompt only grows: 2,400 on turn 1, then 400 a turn.",
        "From turn 4 on, the oldest result leaves from the front, so the prompt differs right after the 2,000-token "
        "prefix: everything after it (3 results) is processed again, every turn.",
    ],
)
def keep_last_three(answer: int) -> str:
    run = run_agent(KeepLast(KEEP))
    expected = run.total_processed
    if answer == expected:
        append = run_agent(AppendOnly()).total_processed
        return (
            f"{expected:,} tokens, {expected / append:.2f} times append-only's {append:,}, for a final prompt of "
            f"{run.final_prompt:,} tokens."
        )
    keep5 = run_agent(KeepLast(5)).total_processed
    if answer == keep5:
        raise NotYet(f"{keep5:,} is the lesson's figure for keeping 5; redo it for 3.")
    if answer == run_agent(AppendOnly()).total_processed:
        raise NotYet("That is append-only's total; trimming the front costs more than that.")
    trimmed = sum(t.processed_tokens for t in run.turns[KEEP:])
    if answer == trimmed:
        raise NotYet(f"That counts turns {KEEP + 1} to {TURNS} only; add the first {KEEP} turns.")
    if answer == run.final_prompt * TURNS:
        raise NotYet("That is the whole final prompt on every turn; the prefix still comes from the cache.")
    raise NotYet(f"{answer:,} is not what keeping the last {KEEP} results processes over {TURNS} turns.")


def _clock(turn: int) -> list[int]:
    start = CLOCK_FIRST_ID + CLOCK_TOKENS * turn
    return list(range(start, start + CLOCK_TOKENS))


def _clock_in_prefix(prefix: Sequence[int], results: Sequence[Sequence[int]]) -> list[int]:
    return [*prefix[:CLOCK_AT], *_clock(len(results)), *prefix[CLOCK_AT:], *(t for r in results for t in r)]


def _clock_at_end(prefix: Sequence[int], results: Sequence[Sequence[int]]) -> list[int]:
    return [*prefix, *(t for r in results for t in r), *_clock(len(results))]


@exercise(
    "13.2",
    title="Where the clock goes",
    assesses="measuring how far one changing value in the prompt reaches: everything after it is processed again",
    minutes=8,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["13.1"],
    hints=[
        "The cache keeps the longest common prefix with the previous prompt. Where is the first token that differs?",
        "Clock early: each turn processes everything after token 100 (the clock, the rest of the prefix, all "
        "results). Clock last: each turn processes the new result and the new clock.",
    ],
)
def clock_placement(answer: list[Any]) -> str:
    early = run_agent(_clock_in_prefix, name="clock in the system prompt").total_processed
    late = run_agent(_clock_at_end, name="clock in the newest message").total_processed
    expect_two_whole(answer, "[tokens processed with the clock early, with the clock last]")
    if answer == [early, late]:
        return (
            f"{early:,} against {late:,}: the same 10 changing tokens cost {early / late:.0f} times more near "
            "the start, because the cache only reuses what comes before the first difference."
        )
    if answer == [late, early]:
        raise NotYet("Swapped: the clock inside the system prompt is the expensive one.")
    append = run_agent(AppendOnly()).total_processed
    if answer[1] == append:
        raise NotYet("With the clock last, the previous turn's clock is also replaced: count its tokens too.")
    if answer[0] == early - CLOCK_AT:
        raise NotYet("Nearly: on turn 1 nothing is cached, so that turn processes its whole prompt.")
    if answer[0] != early:
        raise NotYet("Recount the early clock: from token 100 on, nothing matches the previous prompt.")
    raise NotYet("Recount the clock at the end: the previous clock sits right after the previous result.")


class _Shown(tuple):
    """A tuple whose repr is a short description, so an error quoting the call stays readable."""

    label = ""

    def __repr__(self) -> str:
        return self.label


def _shown(items: Any, label: str) -> _Shown:
    out = _Shown(items)
    out.label = label
    return out


FIRST_RESULT_ID = 100_000  # run_agent's default first result id


def _arguments(turn: int, first: int = FIRST_RESULT_ID) -> tuple[_Shown, _Shown]:
    """The (prefix, results) run_agent passes the policy on ``turn`` (1-based), results numbered from ``first``."""
    results = [tuple(range(first + RESULT * k, first + RESULT * (k + 1))) for k in range(turn)]
    return (
        _shown(range(PREFIX), f"<prefix: {PREFIX:,} tokens>"),
        _shown(results, f"<results: {turn} of {RESULT} tokens>"),
    )


@exercise(
    "13.3",
    title="Trim the history without breaking the cache",
    assesses="designing a context policy: compact rarely and in large steps, keep the prefix and recent work intact",
    minutes=15,
    answer_type="function",
    cases=lambda rng: _policy_cases(rng),
    points=3,
    difficulty="stretch",
    prerequisites=["13.2"],
    hints=[
        "Dropping a little from the front every turn reprocesses the whole kept history every turn (that is keep-last-N). "
        "Change the front rarely instead.",
        "Let the history grow append-only; when it gets long, replace many old results at once with a fixed summary "
        "(e.g. list(range(900_000, 900_300))) and keep the newest three after it. Then append again.",
        "Count the cost of your rule before you run it: a turn that compacts processes the summary and every "
        "result kept after it, any other turn only its new result (400). How often may it compact, and how "
        "many results may it keep, for the total to stay under 15,000 and every prompt under 6,000?",
    ],
)
def trimming_policy(answer: Any, cases: list[tuple[int, int]]) -> str:
    remarks = [_play_policy(answer, turns, first) for turns, first in cases]
    return remarks[0] + (
        "" if len(remarks) == 1 else f" It also held on {len(remarks) - 1} other agent run(s)."
    )


def _play_policy(answer: Any, turns: int, first: int) -> str:
    for turn in range(1, turns + 1):
        prefix, results = _arguments(turn, first)
        got = call(answer, prefix, results)
        if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__"):
            raise NotYet(
                f"On turn {turn} your policy returned {type(got).__name__}; return a list of token ids."
            )
        prompt = list(got)
        if prompt[:PREFIX] != list(prefix):
            raise NotYet(
                f"Turn {turn}'s prompt does not start with the whole fixed prefix (rule 1: never change it)."
            )
        kept = [t for r in results[-LAST_KEPT:] for t in r]
        if prompt[len(prompt) - len(kept) :] != kept:
            raise NotYet(
                f"Turn {turn}'s prompt does not end with the last {min(turn, LAST_KEPT)} results in full, "
                "oldest first; the agent needs its latest work."
            )
        if len(prompt) > BUDGET_PROMPT:
            raise NotYet(
                f"Turn {turn}'s prompt has {len(prompt):,} tokens; the budget is {BUDGET_PROMPT:,}. "
                "Trim the history before that."
            )
    try:
        run = run_agent(answer, turns=turns, first_result_id=first, name="your policy")
    except KvlabError as exc:  # e.g. a policy that answers differently when called again
        raise NotYet(f"run_agent could not play your policy: {exc}") from None
    least = PREFIX + turns * RESULT
    budget = int(BUDGET_FACTOR * least)
    if run.total_processed > budget:
        worst = sorted(run.turns, key=lambda t: -t.processed_tokens)[:3]
        where = ", ".join(
            f"turn {t.turn} ({t.processed_tokens:,})" for t in sorted(worst, key=lambda t: t.turn)
        )
        raise NotYet(
            f"Your policy processes {run.total_processed:,} tokens over {turns} turns; the budget is "
            f"{budget:,}. The costliest turns: {where}. Compact less often, in larger steps."
        )
    append = run_agent(AppendOnly(), turns=turns, first_result_id=first).total_processed
    keep5 = run_agent(KeepLast(5), turns=turns, first_result_id=first).total_processed
    return (
        f"{run.total_processed:,} tokens processed (append-only: {append:,}, keep the last 5: {keep5:,}), "
        f"largest prompt {max(t.prompt_tokens for t in run.turns):,}, final prompt {run.final_prompt:,}."
    )


def _policy_cases(rng: Any) -> list[tuple[int, int]]:
    """(turns, first result id): the lesson's run, and with ``rng`` a fresh one (the grader's, hidden).

    A hidden run has another length and other token ids, so a policy that only knows the lesson's
    twenty turns (or their ids) does not pass.
    """
    cases = [(TURNS, FIRST_RESULT_ID)]
    if rng is not None:
        cases.append((rng.randint(14, 30), rng.randrange(200_000, 10_000_000)))
    return cases
