"""Exercises of notebook 03, utilization (lesson example 3).

The expected answers come from ``kvlab.models.utilization``; nothing here states them.
"""

from __future__ import annotations

import random
from typing import Any

from kvlab.errors import brief
from kvlab.exercises.core import NotYet, call, exercise
from kvlab.models.utilization import fill_paged, request_lengths

TAIL_LENGTHS = [17, 32, 100, 1500, 9]  # exercise 03.1
BIG_BLOCK = 256  # exercise 03.2


@exercise(
    "03.1",
    title="Waste in the last blocks",
    assesses="computing the only waste paging leaves: the unused tail of each sequence's last block",
    minutes=4,
    answer_type="int",
    points=1,
    difficulty="intro",
    prerequisites=["02.2"],
    hints=[
        "Each sequence takes ceil(length / 16) blocks; its waste is blocks * 16 - length.",
        "A length that is a multiple of 16 wastes nothing; 17 tokens waste 15 slots.",
    ],
)
def tail_waste(answer: int) -> str:
    fill = fill_paged(TAIL_LENGTHS, pool_size=1 << 16, block_size=16)
    expected = fill.wasted_slots
    if answer == expected:
        return f"{expected} slots: on average {fill.waste_per_request:.1f} per sequence, never more than 15 each."
    if answer == sum(16 - n % 16 for n in TAIL_LENGTHS):
        raise NotYet("A sequence whose length is a multiple of 16 fills its last block: it wastes 0, not 16.")
    if answer == sum(n % 16 for n in TAIL_LENGTHS):
        raise NotYet("You added the tokens in each last block; the waste is the empty slots there.")
    raise NotYet(f"{answer} is not the number of empty slots in the last blocks of {TAIL_LENGTHS}.")


@exercise(
    "03.2",
    title="Bigger blocks",
    assesses="seeing the block-size trade-off: larger blocks waste more in each last block, so fewer requests fit",
    minutes=5,
    answer_type="int",
    points=2,
    difficulty="core",
    prerequisites=["03.1"],
    hints=[
        "Each of the lesson's requests now rounds up to a multiple of 256 slots; the pool has 8,192 / 256 = 32 blocks.",
        "Admit the requests in order, each taking ceil(length / 256) blocks, and stop at the first that does not fit.",
    ],
)
def requests_with_big_blocks(answer: int) -> str:
    lengths = request_lengths(5, 40)
    fill = fill_paged(lengths, pool_size=8192, block_size=BIG_BLOCK)
    lesson = fill_paged(lengths, pool_size=8192, block_size=16)
    if answer == fill.requests:
        return (
            f"{fill.requests} requests: the last blocks now waste {fill.wasted_slots:,} slots "
            f"(against {lesson.wasted_slots} with 16-token blocks), so only {fill.stored_percent:.1f}% of the pool holds KV."
        )
    if answer == lesson.requests:
        raise NotYet(
            f"That is the count with 16-token blocks. With {BIG_BLOCK}-token blocks each request wastes up to "
            f"{BIG_BLOCK - 1} slots: add up the blocks the requests take."
        )
    raise NotYet(f"{answer} requests is not how many fit in 8,192 slots of {BIG_BLOCK}-token blocks.")


def _fill_cases(rng: random.Random | None) -> list[tuple[list[int], int, int]]:
    """The notebook's pools; with ``rng``, eight fresh ones too (the grader's hidden cases)."""
    cases = [
        (request_lengths(5, 40), 8192, 16),
        ([17, 32, 100, 1500, 9], 4096, 16),
        ([100, 200, 300], 256, 64),
        ([5, 5, 5, 500, 5], 64, 8),
        ([33] * 10, 100, 32),
    ]
    for _ in range(8 if rng else 0):
        block_size = rng.choice([1, 4, 8, 16, 32, 64])
        lengths = [rng.randint(1, 1500) for _ in range(rng.randint(0, 12))]
        cases.append((lengths, block_size * rng.randint(1, 400), block_size))
    return cases


def _shown(lengths: list[int]) -> str:
    """The lengths as a message names them: the lesson's 40 by name, others in full."""
    return "the lesson's 40 requests" if len(lengths) == 40 else f"{lengths}"


@exercise(
    "03.3",
    title="Write the paged fill",
    assesses="turning on-demand block allocation into code: blocks per request, admission in order, and waste",
    minutes=10,
    answer_type="function",
    cases=_fill_cases,
    points=3,
    difficulty="stretch",
    prerequisites=["02.2", "03.1"],
    hints=[
        "The pool has pool_size // block_size blocks. Go through the lengths in order; each needs ceil(length / block_size).",
        "Stop at the first request that needs more blocks than are left (do not skip ahead to a smaller one).",
        "Waste is the slots of the blocks taken minus the tokens stored: blocks * block_size - length, summed.",
    ],
)
def paged_fill(answer: Any, cases: list[tuple[list[int], int, int]]) -> str:
    for lengths, pool_size, block_size in cases:
        fill = fill_paged(lengths, pool_size=pool_size, block_size=block_size)
        expected = [fill.requests, fill.tokens_stored, fill.wasted_slots]
        got = call(answer, list(lengths), pool_size, block_size)
        if not isinstance(got, (list, tuple)) or len(got) != 3:
            raise NotYet(f"Return three numbers (requests, tokens_stored, wasted_slots); got {brief(got)}.")
        if list(got) != expected:
            if isinstance(got[2], (int, float)) and not isinstance(got[2], bool) and got[2] < 0:
                raise NotYet(
                    f"paged_fill({_shown(lengths)}, {pool_size}, {block_size}) returned {tuple(got)}: negative "
                    "waste means the blocks hold fewer slots than the tokens stored, the sign of a block count "
                    "rounded down. A request takes ceil(length / block_size) blocks, rounded up."
                )
            names = ["requests", "tokens_stored", "wasted_slots"]
            wrong = [n for n, g, e in zip(names, got, expected, strict=True) if g != e]
            raise NotYet(
                f"paged_fill({_shown(lengths)}, {pool_size}, {block_size}) returned {tuple(got)}; "
                f"kvlab's fill_paged finds a different {', '.join(wrong)}."
            )
    return f"It agrees with kvlab's fill_paged on {len(cases)} pools, the lesson's 40 requests among them."
