"""Exercises of notebook 05, a shared system prompt (lesson example 5).

The expected answers come from ``kvlab.lessons.ex05.shared_prefix``; nothing here states them.
"""

from __future__ import annotations

import random
from typing import Any

from kvlab.exercises.core import NotYet, all_whole, call, exercise
from kvlab.lessons.ex05 import shared_prefix, system_prompt_request

SYSTEM = 70
REQUEST_1 = (SYSTEM, 20, 5000)  # (system prompt tokens, question tokens, first question token id)
REQUEST_2 = (SYSTEM, 33, 6000)


def _lesson_prompts() -> list[list[int]]:
    return [system_prompt_request(*REQUEST_1), system_prompt_request(*REQUEST_2)]


@exercise(
    "05.1",
    title="The same question again",
    assesses="applying the reuse rule to a repeated prompt: every full block of a matching prefix is shared, the partial one is not",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["02.2"],
    hints=[
        "Request 3 is request 1's 90 tokens again. Which of request 1's blocks are full, and so registered for reuse?",
        "Blocks 0-4 of request 1 are full; its block 5 holds 10 tokens and is never shared. "
        "The pool hands out new blocks from the next unused id.",
    ],
)
def repeated_request_table(answer: list[Any]) -> str:
    ex = shared_prefix([*_lesson_prompts(), system_prompt_request(*REQUEST_1)], block_size=16)
    third = ex.requests[2]
    expected = list(third.block_table)
    if not all_whole(answer):
        raise NotYet("Give the block table as a list of block ids, e.g. [0, 1, 2].")
    if answer == expected:
        return (
            f"It reuses {third.num_cached_tokens} of its {third.num_tokens} tokens, blocks {list(third.hit_block_ids)}; "
            "only the partly filled last block is new."
        )
    if answer == list(ex.requests[0].block_table):
        raise NotYet(
            "That would share request 1's partly filled last block, which was never registered for reuse."
        )
    if len(answer) != len(expected):
        raise NotYet(f"Count the blocks: {third.num_tokens} tokens take {len(expected)} blocks of 16.")
    if answer[:4] == expected[:4] and answer[4:5] != expected[4:5]:
        raise NotYet(
            "Request 1's block 4 holds system-prompt tokens and request 1's question: request 3 has the same ones."
        )
    raise NotYet(f"{answer} is not the table the pool gives request 3.")


@exercise(
    "05.2",
    title="Smaller blocks, more reuse?",
    assesses="seeing that only whole blocks are matched, so reuse is the system prompt rounded down to a block",
    minutes=4,
    answer_type="int",
    points=1,
    difficulty="intro",
    prerequisites=["05.1"],
    hints=[
        "With 8-token blocks, how many blocks hold only system-prompt tokens (70 of them)?",
        "The block after them mixes the last system-prompt tokens with the question, so it misses; "
        "request 2 computes its 103 tokens minus the reused ones.",
    ],
)
def computed_with_8_token_blocks(answer: int) -> str:
    ex = shared_prefix(_lesson_prompts(), block_size=8)
    second = ex.requests[1]
    lesson = shared_prefix(_lesson_prompts(), block_size=16).requests[1]
    if answer == second.num_computed_tokens:
        same = "the same as" if second.num_cached_tokens == lesson.num_cached_tokens else "unlike"
        return (
            f"{SYSTEM} // 8 = {second.num_cached_tokens // 8} full blocks, {second.num_cached_tokens} tokens reused, "
            f"{same} with 16-token blocks: the system prompt ends {SYSTEM % 8} tokens into a block either way."
        )
    if answer == second.num_cached_tokens:
        raise NotYet("That is how many tokens request 2 reuses; the question asks how many it computes.")
    if answer == second.num_tokens - SYSTEM:
        raise NotYet(
            "That assumes all 70 system-prompt tokens are reused, but only whole blocks are matched."
        )
    ends_at = -(-SYSTEM // 8) * 8  # the end of the block where the system prompt ends
    if answer == second.num_tokens - ends_at:
        raise NotYet(
            f"That counts the block of positions {ends_at - 8}-{ends_at - 1} as reused. It holds the last "
            f"{SYSTEM % 8} system-prompt tokens but also {ends_at - SYSTEM} question tokens, which differ "
            "between the two requests, so the walk stops there."
        )
    raise NotYet(f"With 8-token blocks request 2 does not compute {answer} tokens.")


def _reuse_cases(rng: random.Random | None) -> list[tuple[int, int]]:
    """The notebook's prompts; with ``rng``, eight fresh ones too (the grader's hidden cases)."""
    cases = [(70, 16), (80, 16), (70, 8), (70, 4), (70, 1), (5, 16), (70, 32), (70, 128), (96, 32)]
    cases += [
        (rng.randint(1, 500), rng.choice([1, 2, 4, 8, 16, 32, 64, 128])) for _ in range(8 if rng else 0)
    ]
    return cases


@exercise(
    "05.3",
    title="Reuse for any system prompt and block size",
    assesses="stating the whole-block reuse rule as a formula and checking it against the pool",
    minutes=6,
    answer_type="function",
    cases=_reuse_cases,
    points=2,
    difficulty="core",
    prerequisites=["05.2"],
    hints=[
        "Only blocks made of system-prompt tokens alone can match, and they must be full.",
        "Count the blocks that hold system-prompt tokens only, and are full; each of them reuses block_size tokens.",
    ],
)
def reused_tokens(answer: Any, cases: list[tuple[int, int]]) -> str:
    for system_len, block_size in cases:
        prompts = [system_prompt_request(system_len, 20, 5000), system_prompt_request(system_len, 33, 6000)]
        expected = shared_prefix(prompts, block_size=block_size).requests[1].num_cached_tokens
        got = call(answer, system_len, block_size)
        if got != expected:
            if (
                type(got) in (int, float)
                and got > expected
                and got == -(-system_len // block_size) * block_size
            ):
                raise NotYet(
                    f"reused_tokens({system_len}, {block_size}) returned {got!r}: that rounds up, and a partly "
                    "filled block is never shared. The block where the system prompt ends also holds question "
                    "tokens, which differ between the two requests."
                )
            raise NotYet(
                f"reused_tokens({system_len}, {block_size}) returned {got!r}; "
                "the pool reuses a different number of request 2's tokens."
            )
    return f"It agrees with kvlab's shared_prefix on {len(cases)} system prompts and block sizes."
