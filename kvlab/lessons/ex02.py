"""Lesson example 2: two sequences take blocks from a shuffled free list; five positions are translated.

A (37 tokens) gets blocks [7, 2, 9] and B (20) gets [4, 0] from the free list
[7, 2, 9, 4, 0, 5, 11, 3], leaving [5, 11, 3]; A's token 36 is logical block 2,
offset 4, physical block 9, slot 148 (the lesson's figures; ``tests/test_paged.py`` pins them).
``block_table_rows`` and ``translation_rows`` line kvlab's figures up with the lesson's
(``LESSON_TABLES``, ``LESSON_TRANSLATIONS``), for ``compare_table``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.snapshots import BlockPoolState, History
from kvlab.errors import InvalidArgumentError
from kvlab.models.paged import BlockPool, Translation

BLOCK_SIZE = 16
FREE_LIST = (7, 2, 9, 4, 0, 5, 11, 3)
BUSY = (1, 6, 8, 10)  # the lesson's other 4 of 12 block ids, which it does not list as free
LENGTHS = {"A": 37, "B": 20}
QUERIES = (("A", 0), ("A", 15), ("A", 16), ("A", 36), ("B", 19))

LESSON_TABLES = {"A": [7, 2, 9], "B": [4, 0], "free": [5, 11, 3]}
"""The block tables and the free blocks left, as the lesson's program printed them."""

LESSON_TRANSLATIONS = {
    ("A", 0): [0, 0, 7, 112],
    ("A", 15): [0, 15, 7, 127],
    ("A", 16): [1, 0, 2, 32],
    ("A", 36): [2, 4, 9, 148],
    ("B", 19): [1, 3, 0, 3],
}
"""(sequence, position): [logical block, offset, physical block, slot], as the lesson printed them."""


@dataclass(frozen=True)
class Example2:
    """Two sequences take blocks from a shuffled free list; five positions are translated."""

    tables: dict[str, tuple[int, ...]]
    lengths: dict[str, int]
    translations: tuple[Translation, ...]
    free_queue: tuple[int, ...]
    history: History[BlockPoolState]


def example_2() -> Example2:
    """Lesson example 2: A (37 tokens) and B (20) on 16-token blocks, free list [7, 2, 9, 4, 0, 5, 11, 3].

    The lesson's pool has 12 block ids but lists only 8 as free; here the
    other 4 (1, 6, 8, 10) are held by a sequence called ``others`` so that
    every block is accounted for.
    """
    pool = BlockPool(12, BLOCK_SIZE, free_order=[*BUSY, *FREE_LIST], record=True)
    pool.allocate("others", len(BUSY) * BLOCK_SIZE)
    lengths = dict(LENGTHS)
    for request_id, n in lengths.items():
        pool.allocate(request_id, n)
    translations = tuple(pool.translate(request_id, pos) for request_id, pos in QUERIES)
    assert pool.history is not None
    tables = {request_id: pool.block_table(request_id) for request_id in lengths}
    return Example2(tables, lengths, translations, tuple(pool.free_queue()), pool.history)


def _check_example(lesson: object) -> Example2:
    if not isinstance(lesson, Example2):
        raise InvalidArgumentError(f"expected the result of example_2(), got {type(lesson).__name__}")
    return lesson


def block_table_rows(lesson: Example2) -> list[tuple[str, object, object]]:
    """Each sequence's block table and the free blocks left, kvlab's beside the lesson's."""
    lesson = _check_example(lesson)
    rows: list[tuple[str, object, object]] = [
        (
            f"{name} ({lesson.lengths[name]} tokens): block table",
            list(lesson.tables[name]),
            LESSON_TABLES[name],
        )
        for name in LENGTHS
    ]
    return [*rows, ("free blocks left", list(lesson.free_queue), LESSON_TABLES["free"])]


def translation_rows(lesson: Example2) -> list[tuple[str, object, object]]:
    """Each translated position as [logical block, offset, physical block, slot], kvlab's beside the lesson's."""
    lesson = _check_example(lesson)
    return [
        (
            f"{t.request_id} token {t.position:>2}: logical, offset, physical, slot",
            [t.logical_block, t.offset, t.physical_block, t.slot],
            LESSON_TRANSLATIONS[(t.request_id, t.position)],
        )
        for t in lesson.translations
    ]
