"""Exercises of notebook 09, prompt layout (lesson example 9).

The expected answers come from ``kvlab.server.layout.run_layout``; nothing here states them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from kvlab.exercises.core import NotYet, exercise, name_in
from kvlab.lessons.ex09 import LESSON_LAYOUTS, LESSON_SEGMENTS, LESSON_STABLE_ORDER
from kvlab.server.layout import AgentSession, LayoutRun, Segment, run_layout, tool_definitions

FIXED = ["system prompt", "tools"]  # the parts that never change
LONGER_SESSION = 11  # exercise 09.3: the session goes on for an 11th turn


def _run(names: list[str]) -> LayoutRun:
    return run_layout([LESSON_SEGMENTS[n]() for n in names], name=" / ".join(names))


@lru_cache(maxsize=1)
def _best_timestamp_rate() -> float:
    """The highest hit rate over every place the timestamp can take in the stable order."""
    return max(
        _run(LESSON_STABLE_ORDER[:i] + ["timestamp"] + LESSON_STABLE_ORDER[i:]).hit_rate
        for i in range(len(LESSON_STABLE_ORDER) + 1)
    )


@exercise(
    "09.1",
    title="Place the timestamp where it costs least",
    assesses="applying the hash-chain rule to a layout: fixed parts first, what changes as late as possible",
    minutes=8,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["06.1"],
    hints=[
        "Reuse stops at the first block that differs from an earlier prompt. Which segments are the same every turn?",
        "Put the fixed parts first. Then ask which parts of this turn's prompt come back at the start of the next "
        "turn's prompt: the history grows by the user message and the answer.",
    ],
)
def place_timestamp(answer: list[Any]) -> str:
    if not all(isinstance(n, str) for n in answer):
        raise NotYet(f"Give the segment names as strings, e.g. {LESSON_STABLE_ORDER[:2]}.")
    answer = [name_in(n, LESSON_SEGMENTS) for n in answer]  # "History" is the history
    unknown = [n for n in answer if n not in LESSON_SEGMENTS]
    if unknown:
        raise NotYet(f"Unknown segment name(s) {unknown}: use {list(LESSON_SEGMENTS)}.")
    if sorted(answer) != sorted(LESSON_SEGMENTS):
        raise NotYet(f"Use each of the five segments exactly once: {list(LESSON_SEGMENTS)}.")
    rate = _run(answer).hit_rate
    best = _best_timestamp_rate()
    if rate >= best - 1e-12:
        return (
            f"{100 * rate:.1f}%: the timestamp comes after everything the next turn repeats. Even the new "
            "message moves into the history, so the next prompt matches straight through it."
        )
    if answer[0] == "timestamp":
        raise NotYet(f"{100 * rate:.1f}%: a timestamp in the first block changes every later block hash.")
    if answer.index("history") < max(answer.index(n) for n in FIXED):
        raise NotYet(
            f"{100 * rate:.1f}%: the history changes every turn, so a fixed part after it is recomputed every time."
        )
    if answer.index("timestamp") < answer.index("history"):
        raise NotYet(
            f"{100 * rate:.1f}%: the timestamp still sits before the history, so the history is recomputed."
        )
    if answer.index("new message") < answer.index("history"):
        raise NotYet(
            f"{100 * rate:.1f}%: the new message differs every turn; before the history it cuts the match there."
        )
    raise NotYet(
        f"{100 * rate:.1f}% is close, but one place does better. Which of this turn's segments does the next "
        "turn's prompt still contain, and in what order?"
    )


def _sorted_tools() -> Segment:
    """The tools in a new random order each turn, sorted by their first token (their "name") from Z to A
    before sending: a fixed order, but not the stable layout's, so the answer is not read off its table row."""
    shuffled = tool_definitions(shuffled=True)

    def build(session: AgentSession, turn: int) -> list[int]:
        tokens = list(shuffled.build(session, turn))
        size = session.tool_tokens
        tools = [tokens[i : i + size] for i in range(0, len(tokens), size)]
        return [tok for tool in sorted(tools, reverse=True) for tok in tool]

    return Segment("tools", build)


@exercise(
    "09.2",
    title="Predict the hit rate when tools are sorted",
    assesses="seeing that a deterministic order, not a particular order, is what keeps a prefix cacheable",
    minutes=4,
    answer_type="number",
    points=1,
    difficulty="intro",
    prerequisites=["09.1"],
    hints=[
        "Compare the tokens the server receives on two turns once the list is sorted. Do they differ?",
        "Sorting after shuffling gives the same order every turn, Z to A or not. Does the cache compare a prompt "
        "with the stable layout's order, or with this session's earlier prompts?",
    ],
)
def sorted_tools_rate(answer: float) -> str:
    sorted_layout = [
        _sorted_tools() if name == "tools" else LESSON_SEGMENTS[name]() for name in LESSON_STABLE_ORDER
    ]
    expected = 100 * run_layout(sorted_layout).hit_rate
    shuffled = 100 * run_layout(LESSON_LAYOUTS["tools in random order"]()).hit_rate
    if 0 < answer <= 1 and abs(100 * answer - expected) < 0.05:
        raise NotYet(f"{answer} looks like a fraction; give a percentage (a number from 0 to 100).")
    if abs(answer - expected) < 0.05:
        return (
            f"{expected:.1f}%, the same as the stable layout although the order is reversed: the cache only "
            "compares a prompt with earlier prompts, and sorting makes the order the same every turn. Any "
            "fixed order works; a fresh random one does not."
        )
    if abs(answer - shuffled) < 0.05:
        raise NotYet(
            "That is the hit rate of the shuffled list. What does the server receive once the list is sorted?"
        )
    stable = 100 * run_layout(LESSON_LAYOUTS["stable prefix"]()).hit_rate
    if answer < stable:
        raise NotYet(
            f"{answer}% is lower than the sorted layout reaches. Which tokens would differ between two turns "
            "once the list is sorted, even in an order other than the stable layout's?"
        )
    raise NotYet(
        f"{answer}% is higher than the sorted layout reaches: whatever the order, the first turn and each "
        "turn's new tail are computed."
    )


@exercise(
    "09.3",
    title="Tokens computed on turn 11",
    assesses="tracing one turn of a stable layout: the previous prompt is cached up to its last full block",
    minutes=6,
    answer_type="int",
    points=2,
    difficulty="core",
    prerequisites=["09.1"],
    hints=[
        "The previous prompt (turn index 9) is a prefix of this one. Which of its tokens sit in full 16-token blocks?",
        "Prompt sizes are 830 + 120 × turn index. Cached = the previous prompt rounded down to a multiple of 16; "
        "computed = this prompt − cached.",
    ],
)
def tokens_computed_turn_11(answer: int) -> str:
    run = run_layout(LESSON_LAYOUTS["stable prefix"](), turns=LONGER_SESSION)
    turn, previous = run.turns[-1], run.turns[-2]
    if answer == turn.computed_tokens:
        return (
            f"The previous prompt had {previous.prompt_tokens:,} tokens: {turn.cached_tokens:,} of them in full "
            f"blocks, served from the cache. This prompt has {turn.prompt_tokens:,}, so "
            f"{turn.prompt_tokens:,} − {turn.cached_tokens:,} = {turn.computed_tokens} are computed."
        )
    if answer == turn.prompt_tokens:
        raise NotYet("That is the whole prompt; most of it was in the previous prompt and is cached.")
    if answer == turn.cached_tokens:
        raise NotYet("That is the cached part; the question asks for the tokens the server computes.")
    if answer == turn.prompt_tokens - previous.prompt_tokens:
        raise NotYet(
            "That counts only the tokens added since the previous prompt. Its last partial block was never "
            "hashed, so those tokens are computed again too."
        )
    if answer in {t.computed_tokens for t in run.turns[1:-1]}:
        raise NotYet(
            "That is what some other turn computes; check the block boundary of the previous prompt."
        )
    raise NotYet(f"{answer} is not what the server computes on turn 11.")
