"""Exercises of notebook 07, LRU eviction (lesson example 7).

The expected answers come from ``kvlab.models.prefix_cache.PrefixCache``, driven through the lesson's
steps by ``kvlab.lessons.ex07.run_example_7``; nothing here states them.
"""

from __future__ import annotations

import random
from typing import Any

from kvlab.errors import OutOfBlocksError
from kvlab.exercises.core import NotYet, all_whole, call_for_list, exercise, name_in
from kvlab.lessons.ex07 import NUM_BLOCKS, HashLabels, run_example_7
from kvlab.models.prefix_cache import PrefixCache

NEXT_REQUEST = ("a1", "f2", "f3")  # 07.2: request F after the lesson, once D has finished
# 07.3: a pool of 8 blocks of 4 tokens; P (10 tokens) and Q (6 tokens) run, then P and Q finish
SMALL_POOL = (8, 4)
P_TOKENS = list(range(100, 110))
Q_TOKENS = list(range(200, 206))


def _lesson_cache() -> tuple[PrefixCache, HashLabels]:
    """The lesson's pool after its last step (C finished, D still running), with the lesson's hash names."""
    labels = HashLabels(16)
    cache = PrefixCache(NUM_BLOCKS, 16)
    for _ in run_example_7(cache, labels):
        pass
    return cache, labels


@exercise(
    "07.1",
    title="Predict the free queue",
    assesses="tracing vLLM's free: a finished request's blocks join the back of the queue, last block first",
    minutes=4,
    answer_type="list",
    points=1,
    difficulty="intro",
    prerequisites=["06.2"],
    hints=[
        "The queue after the lesson is [5, 1, 0], front first, and D holds blocks [2, 4, 3]. Nothing else shares them.",
        "D's blocks are released last block first, and each one joins the back: the first released ends up "
        "nearest the front of the three.",
    ],
)
def queue_after_d(answer: list[Any]) -> str:
    cache, _ = _lesson_cache()
    table = list(cache.block_table("D"))
    before = cache.free_queue()
    cache.free("D")
    expected = cache.free_queue()
    if not all_whole(answer):
        raise NotYet("Give block ids as whole numbers, front of the queue first, e.g. [1, 2, 3].")
    if answer == expected:
        return (
            f"D's last block, {table[-1]}, leaves first and so sits nearest the front: d3 will be evicted "
            f"before d2 and d1, and the older {before} all go before any of D's blocks."
        )
    if answer == before + table:
        raise NotYet(
            "That frees D's blocks in table order. vLLM releases a request's blocks last block first."
        )
    if sorted(answer) == sorted(expected) and answer[len(before) :] == expected[len(before) :]:
        raise NotYet(
            "D's blocks are right; the blocks that were already free keep their places at the front."
        )
    if sorted(answer) != sorted(expected):
        raise NotYet(f"After D finishes all {len(expected)} blocks of the pool are free; list each once.")
    raise NotYet(f"{answer} is not the order of the free queue after D finishes.")


@exercise(
    "07.2",
    title="Which hashes are evicted next?",
    assesses="predicting LRU eviction: hits leave the queue first, then new blocks come from the front and "
    "drop the hashes they held",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["07.1"],
    hints=[
        "Start from the queue of exercise 07.1. F's first block name, a1, is still cached: F hits it, and that "
        "block leaves the queue before anything is taken from the front.",
        "F then needs two new blocks, taken from the front of what is left. Each of them still holds a hash: "
        "which names are those?",
    ],
)
def next_evictions(answer: list[Any]) -> str:
    cache, labels = _lesson_cache()
    cache.free("D")
    result = cache.allocate("F", labels.tokens(NEXT_REQUEST))
    expected = [labels[h] for h in result.evicted_hashes]
    if not all(isinstance(a, str) for a in answer):
        raise NotYet('Give the evicted hashes by name, as strings, e.g. ["x1", "x2"].')
    answer = [name_in(a, [*expected, "a1"]) for a in answer]  # "A2" names the hash a2
    if answer == expected:
        return (
            f"F reuses a1 but evicts {expected[0]} and {expected[1]}: a2 sat at the front once a1 was taken out, "
            "so a prefix that F shares only in part loses its tail."
        )
    if "a1" in answer:
        raise NotYet("a1 is a hit: F takes it out of the queue and reuses it, so it is not evicted.")
    if sorted(answer) == sorted(expected):
        raise NotYet("The right names, but list them in the order F takes their blocks from the front.")
    if len(answer) != len(expected):
        raise NotYet(f"F needs {len(expected)} new blocks, and each comes from the front of the queue.")
    raise NotYet(f"{answer} are not the hashes F's new blocks drop.")


@exercise(
    "07.3",
    title="Partial blocks go to the front",
    assesses="applying vLLM's rule for unhashed blocks: a partial last block is freed to the front of the queue",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["07.1"],
    hints=[
        "P's 10 tokens fill blocks 0 and 1 and put 2 tokens in block 2; Q's 6 tokens fill block 3 and half of 4. "
        "Full blocks have a hash, partial ones do not.",
        "Free P, then Q. Each time: hashed blocks join the back (last block first), the unhashed block goes to "
        "the very front.",
    ],
)
def front_rule(answer: list[Any]) -> str:
    num_blocks, block_size = SMALL_POOL
    cache = PrefixCache(num_blocks, block_size)
    cache.allocate("P", P_TOKENS)
    cache.allocate("Q", Q_TOKENS)
    waiting = cache.free_queue()
    tables = [list(cache.block_table("P")), list(cache.block_table("Q"))]
    cache.free("P")
    cache.free("Q")
    expected = cache.free_queue()
    if not all_whole(answer):
        raise NotYet("Give block ids as whole numbers, front of the queue first.")
    if answer == expected:
        return (
            "The partial blocks are at the front, so the next allocation reuses them first: they hold no hash, "
            "so no cached prefix is lost. The hashed ones wait at the back."
        )
    lesson_rule = list(waiting)
    for table in tables:
        lesson_rule += table[::-1]
    if answer == lesson_rule:
        raise NotYet(
            "That is the lesson's program, which puts every freed block at the back. "
            "vLLM puts blocks without a hash at the front."
        )
    if sorted(answer) != sorted(expected):
        raise NotYet(f"After both finish, all {num_blocks} blocks are free; list each once.")
    if answer[:2] == expected[:2][::-1]:
        raise NotYet(
            "Q finishes after P, so Q's partial block is put at the front after P's is: it is ahead of it."
        )
    raise NotYet(f"{answer} is not the order of the free queue after P and Q finish.")


@exercise(
    "07.4",
    title="Write vLLM's free",
    assesses="turning the free rules into code: reverse order, reference counts, hashed to the back, "
    "unhashed to the front",
    minutes=10,
    answer_type="function",
    cases=lambda rng: _release_cases(rng),  # defined below, with the runs it records
    points=3,
    difficulty="stretch",
    prerequisites=["07.2", "07.3"],
    hints=[
        "Freed blocks join one of two ends: those in `hashed` go to the back of the queue, the others (a "
        "partial last block) to the front, in front of every block already there.",
        "Walk the block table from its last block to its first. Subtract 1 from each block's count; the blocks "
        "that reach 0 become free, in that order, and join their end of the queue in that order.",
        "A block that another request still holds (its count was above 1) does not join the queue at all.",
    ],
)
def release(
    answer: Any, cases: list[tuple[list[int], list[int], dict[int, int], set[int], list[int]]]
) -> str:
    for queue, table, ref_counts, hashed, expected in cases:
        got = call_for_list(
            answer,
            "the new free queue as a list of block ids",
            list(queue),
            list(table),
            dict(ref_counts),
            set(hashed),
        )
        if got == expected:
            continue
        shown = f"release({queue}, {table}, {ref_counts}, {_as_set(hashed)})"
        shared = [b for b in table if ref_counts[b] > 1]
        if any(b in got for b in shared):
            one = len(shared) == 1
            held = f"block {shared[0]} is" if one else f"blocks {', '.join(map(str, shared))} are"
            stays = "it stays" if one else "they stay"
            raise NotYet(
                f"{shown} returned {got}: {held} still held by another request, so {stays} out of the queue."
            )
        unhashed = [b for b in expected if b in table and b not in hashed]
        if sorted(got) == sorted(expected) and unhashed and got[: len(unhashed)] != unhashed:
            one = len(unhashed) == 1
            named = f"Block {unhashed[0]} carries" if one else f"Blocks {', '.join(map(str, unhashed))} carry"
            goes = "it goes" if one else "they go"
            raise NotYet(
                f"{shown} returned {got}: the right blocks, in another order than vLLM's {expected}. {named} "
                f"no hash, so {goes} to the front of the queue, not the back."
            )
        if sorted(got) == sorted(expected):
            raise NotYet(
                f"{shown} returned {got}: the right blocks, in another order than vLLM's {expected}. Freed "
                "blocks join last block first."
            )
        raise NotYet(f"{shown} returned {got}; kvlab's PrefixCache leaves the queue as {expected}.")
    return f"It agrees with kvlab's PrefixCache on all {len(cases)} releases, shared and partial blocks included."


def _as_set(blocks: set[int]) -> str:
    """A set of block ids written as Python writes it, in order: {0, 1, 2}, or set()."""
    return "{" + ", ".join(map(str, sorted(blocks))) + "}" if blocks else "set()"


def _release_cases(
    rng: random.Random | None = None,
) -> list[tuple[list[int], list[int], dict[int, int], set[int], list[int]]]:
    """(queue, table, ref counts, hashed blocks, queue after) for every free of a few recorded runs.

    With ``rng``, the frees of one more random run drawn from it too (the grader's hidden cases).
    """
    cases = []

    def before_free(cache: PrefixCache, rid: str) -> tuple[list[int], list[int], dict[int, int], set[int]]:
        table = list(cache.block_table(rid))
        counts = {b: cache.ref_count(b) for b in table}
        hashed = {b for b in table if cache.block_hash(b) is not None}
        return cache.free_queue(), table, counts, hashed

    def record_free(cache: PrefixCache, rid: str) -> None:
        found = before_free(cache, rid)
        cache.free(rid)
        cases.append((*found, cache.free_queue()))

    lesson = PrefixCache(NUM_BLOCKS, 16)
    found: list[tuple[list[int], list[int], dict[int, int], set[int]]] = []

    def look(op: str, rid: str) -> None:
        if op == "free":
            found.append(before_free(lesson, rid))

    for op, _, _ in run_example_7(lesson, HashLabels(16), before=look):
        if op == "free":
            cases.append((*found.pop(), lesson.free_queue()))
    small = PrefixCache(*SMALL_POOL)
    small.allocate("P", P_TOKENS)
    small.allocate("Q", Q_TOKENS)
    record_free(small, "P")
    record_free(small, "Q")

    for run_rng in [random.Random(7)] + ([rng] if rng else []):
        _random_run(run_rng, record_free)
    return cases


def _random_run(rng: random.Random, record_free: Any) -> None:
    """Allocate and free random requests that share topic prefixes; ``record_free`` frees one."""
    cache = PrefixCache(12, 4)
    live: list[str] = []
    fresh = 10_000
    for step in range(60):
        if live and (rng.random() < 0.45 or len(live) > 4):
            record_free(cache, live.pop(rng.randrange(len(live))))
            continue
        topic = rng.randrange(3)
        shared = rng.randrange(0, 13)
        own = rng.randrange(0 if shared else 1, 7)
        tokens = [1000 * (topic + 1) + i for i in range(shared)] + list(range(fresh, fresh + own))
        fresh += own
        try:
            cache.allocate(f"r{step}", tokens)
            live.append(f"r{step}")
        except OutOfBlocksError:
            pass
