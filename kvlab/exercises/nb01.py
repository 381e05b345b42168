"""Exercises of notebook 01, contiguous allocation (lesson example 1).

The expected answers come from ``kvlab.models.contiguous``; nothing here states them.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from kvlab.exercises.core import NotYet, all_whole, call, exercise
from kvlab.lessons.ex01 import exact_fit, reserve_max
from kvlab.models.contiguous import ContiguousPool

LENGTHS = [300, 1200, 150, 700, 500]  # part one: real lengths of r0..r4
SIZES = [1500, 600, 1800, 400, 2000, 1000]  # part two: exact sizes of q0..q5
POOL = 8192


@exercise(
    "01.1",
    title="Reserve less, store more?",
    assesses="predicting internal fragmentation: how the reservation size sets how much of the pool holds KV",
    minutes=5,
    answer_type="number",
    points=2,
    difficulty="core",
    hints=[
        "First count how many 1,500-slot regions fit in 8,192 slots, then which requests get them.",
        "Add the real lengths of the requests that were placed and divide by the pool size (8,192).",
    ],
)
def reserve_1500(answer: float) -> str:
    result = reserve_max(LENGTHS, pool_size=POOL, max_len=1500)
    expected = result.stored_percent
    if 0 < answer <= 1 and abs(100 * answer - expected) < 0.05:
        raise NotYet(f"{answer} looks like a fraction; give a percentage (a number from 0 to 100).")
    if abs(answer - expected) >= 0.05:
        raise NotYet(f"{answer}% is not what the pool stores with 1,500-slot reservations.")
    return (
        f"{len(result.placed)} requests fit and {result.stored:,} slots hold KV: {expected:.1f}%. "
        f"Still {result.internal_fragmentation:,} reserved slots hold nothing."
    )


@exercise(
    "01.2",
    title="Predict the gaps",
    assesses="applying first fit by hand and reading external fragmentation from the gap list",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    hints=[
        "First fit takes the gap with the lowest start that is large enough, not the best-sized one.",
        "The gaps before q6 arrives are [600, 400, 892], lowest start first. Which is the first one that holds 500?",
    ],
)
def gaps_after_500(answer: list[Any]) -> str:
    pool = ContiguousPool(POOL)
    for i, size in enumerate(SIZES):
        pool.reserve(f"q{i}", size)
    pool.release("q1")
    pool.release("q3")
    before = pool.gap_sizes()
    pool.reserve("q6", 500)
    expected = pool.gap_sizes()
    if not all_whole(answer):
        raise NotYet("Give the gap sizes as whole numbers, e.g. [10, 20, 30].")
    if answer == expected:
        return f"q6 went into the first gap; the free space is now split {expected}."
    if answer == before:
        raise NotYet("Those are the gaps before q6 arrives; place its 500 slots first.")
    if sum(answer) != sum(expected):
        raise NotYet(f"Your gaps add up to {sum(answer):,} free slots; after q6 there are {sum(expected):,}.")
    if sorted(answer) == sorted(expected):
        raise NotYet("Right sizes, wrong order: list the gaps by where they start, lowest first.")
    raise NotYet(f"{answer} is not where first fit leaves the free space.")


def _wasted_cases(rng: random.Random | None) -> list[tuple[list[int], int, int]]:
    """The notebook's pools; with ``rng``, eight fresh ones too (the grader's hidden cases)."""
    cases = [
        (LENGTHS, POOL, 2048),
        ([100, 200], POOL, 2048),
        ([2048] * 5, POOL, 2048),
        ([1000, 900, 50], 3000, 1000),
        ([10] * 10, 100, 30),
    ]
    for _ in range(8 if rng else 0):
        max_len = rng.randint(1, 3000)
        pool_size = rng.randint(1, 5) * max_len + rng.randrange(max_len)
        cases.append(([rng.randint(1, max_len) for _ in range(rng.randint(0, 9))], pool_size, max_len))
    return cases


@exercise(
    "01.3",
    title="Count the reserved-but-empty slots",
    assesses="turning the definition of internal fragmentation into code for any pool, reservation and lengths",
    minutes=10,
    answer_type="function",
    cases=_wasted_cases,
    points=3,
    difficulty="stretch",
    prerequisites=["01.1"],
    hints=[
        "All regions have the same size and none is released, so the first pool_size // max_len requests fit.",
        "Waste = (slots reserved by the placed requests) - (tokens those requests really hold).",
        "Careful when there are fewer requests than places: only the requests that exist reserve anything.",
    ],
)
def wasted_slots(answer: Any, cases: list[tuple[list[int], int, int]]) -> str:
    for lengths, pool_size, max_len in cases:
        expected = reserve_max(lengths, pool_size=pool_size, max_len=max_len).internal_fragmentation
        got = call(answer, list(lengths), pool_size, max_len)
        if got != expected:
            raise NotYet(
                f"wasted_slots({lengths}, {pool_size}, {max_len}) returned {got!r}; "
                "the pool model finds a different number of reserved slots that hold no token."
            )
    return f"It agrees with kvlab on {len(cases)} pools, including the lesson's (5,842 empty reserved slots)."


@exercise(
    "01.4",
    title="An order that avoids the rejection",
    assesses="explaining external fragmentation: whether freed regions become one usable gap depends on where they sit",
    minutes=10,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["01.2"],
    hints=[
        "Two freed regions form one gap only when nothing lies between them.",
        "Put the 600 and the 400 next to each other, or put one of them last, next to the free tail of 892 slots.",
    ],
)
def arrival_order(answer: list[Any]) -> str:
    if Counter(answer) != Counter(SIZES):
        raise NotYet(f"Use each of the six sizes {SIZES} exactly once, in any order.")
    finished = [answer.index(600), answer.index(400)]
    result = exact_fit(answer, finished=finished, new_request=900, pool_size=POOL)
    if not result.new_request_placed:
        raise NotYet(f"In this order the free slots lie in gaps {list(result.gaps)}; none holds 900.")
    return (
        f"The free slots lie in gaps {list(result.gaps)}, so the 900-slot request fits: "
        "the same free total, in one piece."
    )
