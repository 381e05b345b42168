"""Exercises of notebook 02, block tables (lesson example 2).

The expected answers come from ``kvlab.models.paged.BlockPool`` and ``kvlab.lessons.ex02``; nothing here states them.
"""

from __future__ import annotations

import random
from typing import Any

from kvlab.errors import brief
from kvlab.exercises.core import NotYet, all_whole, call, exercise, name_in, whole
from kvlab.lessons.ex02 import example_2
from kvlab.models.paged import BlockPool

BLOCK = 16
LENGTHS = [1, 16, 17, 64, 100, 2048]  # exercise 02.2
SLOT_OF = ("A", 30)  # exercise 02.1: token 30 of sequence A
WHOSE_SLOT = 37  # exercise 02.4


def _lesson_pool() -> BlockPool:
    """The pool of lesson example 2 (as ``example_2`` builds it), kept so the checkers can ask it questions."""
    ex = example_2()
    busy = [b for b in range(12) if b not in ex.free_queue and all(b not in t for t in ex.tables.values())]
    order = busy + [b for seq in ex.tables for b in ex.tables[seq]] + list(ex.free_queue)
    pool = BlockPool(12, BLOCK, free_order=order)
    pool.allocate("others", len(busy) * BLOCK)
    for seq, n in ex.lengths.items():
        pool.allocate(seq, n)
    assert {s: pool.block_table(s) for s in ex.tables} == ex.tables
    return pool


@exercise(
    "02.1",
    title="Predict the slot of a token",
    assesses="translating a token position through a block table: logical block, offset, physical block, slot",
    minutes=4,
    answer_type="int",
    points=1,
    difficulty="intro",
    hints=[
        "Split the position into a logical block (position // 16) and an offset (position % 16).",
        "Look the logical block up in A's block table [7, 2, 9]; the slot is physical block * 16 + offset.",
    ],
)
def slot_of_token(answer: int) -> str:
    seq, pos = SLOT_OF
    t = _lesson_pool().translate(seq, pos)
    if answer == t.slot:
        return (
            f"Token {pos} is logical block {t.logical_block}, offset {t.offset}; the table sends it to "
            f"physical block {t.physical_block}, so slot {t.physical_block} × 16 + {t.offset} = {t.slot}."
        )
    if answer == pos:
        raise NotYet("That is the token's position in the sequence; the slot is its place in the whole pool.")
    if answer == t.physical_block:
        raise NotYet(
            "That is the physical block; the slot also counts the offset inside it, one slot per token."
        )
    if answer in (t.logical_block * BLOCK + t.offset, t.logical_block):
        raise NotYet("You used the logical block number; the block table turns it into a physical one first.")
    if answer in {b * BLOCK + t.offset for b in _lesson_pool().block_table(seq)}:
        raise NotYet("Right offset, wrong block: which logical block does the position fall into?")
    raise NotYet(f"Slot {answer} is not where token {pos} of {seq} lives.")


@exercise(
    "02.2",
    title="How many blocks?",
    assesses="rounding a sequence length up to whole blocks",
    minutes=3,
    answer_type="list",
    points=1,
    difficulty="intro",
    hints=[
        "A block holds 16 tokens; a sequence that needs even one slot of a block takes the whole block.",
        "Divide and round up: ceil(length / 16), or -(-length // 16) in Python.",
    ],
)
def blocks_for_lengths(answer: list[Any]) -> str:
    pool = BlockPool(1, BLOCK)
    expected = [pool.blocks_needed(n) for n in LENGTHS]
    if len(answer) != len(LENGTHS):
        raise NotYet(f"Give one number per length: {len(LENGTHS)} numbers for {LENGTHS}.")
    if not all_whole(answer):
        raise NotYet("Give whole numbers of blocks, e.g. [1, 2, 3].")
    if answer == expected:
        return (
            "A length that is a multiple of 16 fills its last block; any other wastes the rest of one block."
        )
    if answer == [n // BLOCK for n in LENGTHS]:
        raise NotYet("You rounded down: a 17-token sequence cannot leave its 17th token out.")
    if answer == [n // BLOCK + 1 for n in LENGTHS]:
        raise NotYet(
            "You added a block even when the length is a multiple of 16; such a sequence fills its last block."
        )
    wrong = [n for n, a, e in zip(LENGTHS, answer, expected, strict=True) if a != e]
    raise NotYet(f"Look again at the lengths {wrong}.")


def _mapping_cases(rng: random.Random | None) -> list[tuple[list[int], int, int]]:
    """The notebook's tables; with ``rng``, eight fresh ones too (the grader's hidden cases)."""
    cases = [([7, 2, 9], 16, 37), ([4, 0], 16, 20), ([3, 1], 4, 5), ([5], 8, 8), ([10, 0, 6], 2, 5)]
    for _ in range(8 if rng else 0):
        n = rng.randint(1, 6)
        table = rng.sample(range(2 * n + 6), n)
        block_size = rng.choice([1, 2, 4, 8, 16, 32])
        cases.append((table, block_size, rng.randint((n - 1) * block_size + 1, n * block_size)))
    return cases


@exercise(
    "02.3",
    title="Write the slot mapping",
    assesses="turning the translation rule into code: vLLM's slot mapping for any block table and block size",
    minutes=8,
    answer_type="function",
    cases=_mapping_cases,
    points=2,
    difficulty="core",
    prerequisites=["02.1"],
    hints=[
        "Position p lives in block_table[p // block_size] at offset p % block_size.",
        "Return one slot per token, positions 0 to num_tokens - 1 in order: physical * block_size + offset.",
    ],
)
def slot_mapping(answer: Any, cases: list[tuple[list[int], int, int]]) -> str:
    for table, block_size, num_tokens in cases:
        num_blocks = max(table) + 1
        pool = BlockPool(
            num_blocks, block_size, free_order=table + [b for b in range(num_blocks) if b not in table]
        )
        pool.allocate("s", num_tokens)
        expected = pool.slot_mapping("s")
        got = call(answer, list(table), block_size, num_tokens)
        got = list(got) if isinstance(got, (list, tuple)) else got
        if got != expected:
            if isinstance(got, list) and len(got) != num_tokens:
                raise NotYet(
                    f"slot_mapping({table}, {block_size}, {num_tokens}) returned {len(got)} slots; "
                    f"give one per token, {num_tokens} in all."
                )
            raise NotYet(
                f"slot_mapping({table}, {block_size}, {num_tokens}) returned {brief(got)}; "
                "the block pool puts those tokens in other slots."
            )
    return f"It matches kvlab's BlockPool.slot_mapping on {len(cases)} tables, including A's and B's."


@exercise(
    "02.4",
    title="Whose token is in this slot?",
    assesses="running the translation backwards: from a slot in the pool to a sequence and a position",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["02.1"],
    hints=[
        "Slot s is in physical block s // 16 at offset s % 16. Which block table holds that physical block?",
        "The block's place in that table is its logical number; the position is logical * 16 + offset.",
    ],
)
def whose_slot(answer: list[Any]) -> str:
    pool = _lesson_pool()
    owner = next(
        ((s, p) for s in ("A", "B") for p, slot in enumerate(pool.slot_mapping(s)) if slot == WHOSE_SLOT)
    )
    if len(answer) != 2 or not isinstance(answer[0], str) or not whole(answer[1]):
        raise NotYet("Give a sequence name and a position, e.g. ['B', 3].")
    seq, pos = name_in(answer[0], ("A", "B")), answer[1]  # "a" names sequence A
    if [seq, pos] == list(owner):
        return f"Slot {WHOSE_SLOT} is in physical block {WHOSE_SLOT // BLOCK}, which is logical block {pos // BLOCK} of {seq}."
    if seq not in ("A", "B"):
        raise NotYet("The pool holds sequences 'A' and 'B'.")
    if seq != owner[0]:
        raise NotYet(f"Physical block {WHOSE_SLOT // BLOCK} is not in {seq}'s block table.")
    if pos == WHOSE_SLOT % BLOCK:
        raise NotYet("That is the offset inside the block; add the tokens of the logical blocks before it.")
    held = pool.num_tokens(seq)
    if not 0 <= pos < held:
        slot = f" ({WHOSE_SLOT} is the slot's number, not a position)" if pos == WHOSE_SLOT else ""
        raise NotYet(
            f"{seq} holds positions 0-{held - 1}, so position {pos} is past its end{slot}. "
            "Find the slot's physical block first, then its place in the block table."
        )
    raise NotYet(f"Position {pos} of {seq} lives in another slot; translate it forward to see where.")
