"""Exercises of notebook 04, copy-on-write (lesson example 4).

The expected answers come from ``kvlab.lessons.ex04.parallel_sampling`` and
``kvlab.models.paged.BlockPool``; nothing here states them.
"""

from __future__ import annotations

import random
from typing import Any

from kvlab.exercises.core import NotYet, call, exercise
from kvlab.lessons.ex04 import example_4, parallel_sampling
from kvlab.models.paged import BlockPool

PROMPT_LEN, SAMPLES = 50, 4  # exercise 04.1


@exercise(
    "04.1",
    title="Predict the block tables",
    assesses="tracing fork and copy-on-write: which blocks stay shared and which samples get copies",
    minutes=6,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["02.3"],
    hints=[
        "50 tokens take blocks 0-3, and block 3 holds only 2 tokens. The first write goes to position 50: which block?",
        "Samples write in order 0, 1, 2, 3. Each finds the last block shared and copies it to the next free block "
        "(4, 5, ...), until one sample is its only holder and writes in place.",
    ],
)
def tables_after_writes(answer: list[Any]) -> str:
    ex = parallel_sampling(PROMPT_LEN, SAMPLES, block_size=16)
    expected = [list(t) for t in ex.tables]
    if len(answer) != SAMPLES or not all(isinstance(t, (list, tuple)) for t in answer):
        raise NotYet(f"Give {SAMPLES} block tables, one list per sample, e.g. [[0, 1], [0, 2], ...].")
    tables = [list(t) for t in answer]
    if tables == expected:
        copies = [w.copy for w in ex.writes if w.copy is not None]
        return (
            f"{len(copies)} copies of the partly filled block, one per sample but the last; the full blocks stay "
            f"shared. {ex.blocks_used} blocks instead of {ex.blocks_without_sharing}."
        )
    if tables == [list(t) for t in ex.tables_after_fork]:
        raise NotYet("Those are the tables right after the fork; now let each sample write its first token.")
    if all(t[:-1] == expected[0][:-1] for t in tables) and len({t[-1] for t in tables}) == SAMPLES:
        raise NotYet(
            "The shared blocks are right. Check which sample keeps the original last block, and the order of the copies."
        )
    raise NotYet("Some table is off: only the block where position 50 falls can differ between samples.")


def _copy_cases(rng: random.Random | None) -> list[tuple[int, int, int]]:
    """The notebook's prompts; with ``rng``, eight fresh ones too (the grader's hidden cases)."""
    cases = [(40, 3, 16), (48, 3, 16), (50, 4, 16), (40, 1, 16), (7, 5, 4), (100, 8, 32), (9, 2, 1)]
    for _ in range(8 if rng else 0):
        cases.append((rng.randint(1, 400), rng.randint(1, 9), rng.choice([1, 2, 4, 8, 16, 32])))
    return cases


@exercise(
    "04.2",
    title="How much does copy-on-write copy?",
    assesses="predicting the cost of copy-on-write for any prompt length, sample count and block size",
    minutes=8,
    answer_type="function",
    cases=_copy_cases,
    points=2,
    difficulty="core",
    prerequisites=["04.1"],
    hints=[
        "Only a partly filled last block is ever copied; a full block is never written again.",
        "The last block holds prompt_len % block_size tokens. Every sample but the last to write copies them.",
    ],
)
def entries_copied(answer: Any, cases: list[tuple[int, int, int]]) -> str:
    for prompt_len, n, block_size in cases:
        ex = parallel_sampling(prompt_len, n, block_size=block_size)
        expected = sum(w.copy.num_tokens for w in ex.writes if w.copy is not None)
        got = call(answer, prompt_len, n, block_size)
        if got != expected:
            every_sample = n * (prompt_len % block_size)
            if type(got) in (int, float) and got == every_sample and n > 1 and every_sample:
                raise NotYet(
                    f"entries_copied({prompt_len}, {n}, {block_size}) returned {got!r}, a copy for every sample. "
                    "The last sample to write is by then the block's only holder and writes in place: "
                    "n - 1 samples copy."
                )
            raise NotYet(
                f"entries_copied({prompt_len}, {n}, {block_size}) returned {got!r}; "
                "the block pool copies a different number of KV entries."
            )
    return f"It agrees with kvlab's parallel_sampling on {len(cases)} cases (the lesson's copies 16 entries)."


@exercise(
    "04.3",
    title="One sample finishes",
    assesses="following reference counts when a sharer leaves: which blocks become free and which stay shared",
    minutes=5,
    answer_type="dict",
    points=2,
    difficulty="core",
    prerequisites=["04.1"],
    hints=[
        "Sample 0's table is [0, 1, 3]. Freeing it lowers the count of each of those blocks by one.",
        "A block whose count reaches 0 returns to the free list; list only the blocks still in use.",
    ],
)
def ref_counts_after_free(answer: dict[Any, Any]) -> str:
    ex = example_4()
    pool = BlockPool(ex.history[0].state.num_blocks, 16)
    pool.allocate("sample 0", 40)
    for s in ("sample 1", "sample 2"):
        pool.fork("sample 0", s)
    for s in ("sample 0", "sample 1", "sample 2"):
        pool.append(s, 1)
    assert pool.ref_counts == ex.ref_counts
    freed = pool.free("sample 0")
    expected = pool.ref_counts
    if not all(isinstance(k, int) and isinstance(v, int) for k, v in answer.items()):
        raise NotYet("Give block ids and counts as whole numbers, e.g. {0: 2, 5: 1}.")
    if answer == expected:
        return f"Block {freed[0]} was sample 0's alone, so it returns to the free list; the rest lose one holder each."
    if answer == ex.ref_counts:
        raise NotYet("Those are the counts before sample 0 finishes.")
    if any(v == 0 for v in answer.values()):
        raise NotYet("A block with count 0 is free: leave it out of the dict.")
    if set(answer) != set(expected):
        raise NotYet(
            "The set of blocks still in use is not right: which of sample 0's blocks had no other holder?"
        )
    raise NotYet("The right blocks, but some count is off: sample 0 held each of its blocks once.")
