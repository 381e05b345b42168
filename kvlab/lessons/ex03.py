"""Lesson example 3: 40 requests from Java's ``new Random(5)`` fill an 8,192-slot pool two ways.

Reserving 2,048 slots each admits 4 requests and stores 37.6 % of the pool; 16-token blocks on
demand admit 8 and store 92.0 % (the lesson's figures; ``tests/test_utilization.py`` pins them).
``example_3_rows`` lines kvlab's figures up with the lesson's (``LESSON_FIGURES``), for
``compare_table``; ``block_size_table`` refills the pool with other block sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.errors import InvalidArgumentError, check_items, check_size
from kvlab.models.utilization import Utilization, compare_utilization, fill_paged, request_lengths

SEED = 5
REQUESTS = 40
POOL_SIZE = 8192
BLOCK_SIZE = 16
MAX_LEN = 2048
MAX_SWEEP = 12  # block sizes one table compares

LESSON_FIGURES = {
    "contiguous, 2,048 each: requests": 4,
    "contiguous: tokens stored": 3077,
    "contiguous: share of the pool": "37.6%",
    "paged, 16-token blocks: requests": 8,
    "paged: tokens stored": 7533,
    "paged: share of the pool": "92.0%",
    "paged: slots wasted in last blocks": 51,
    "paged: waste per request": "6.4",
}
"""The figures the lesson's program printed, by the name of their row."""


def example_3(*, record: bool = True) -> Utilization:
    """Lesson example 3: 40 requests from ``new Random(5)`` in an 8,192-slot pool."""
    return compare_utilization(
        request_lengths(SEED, REQUESTS),
        pool_size=POOL_SIZE,
        block_size=BLOCK_SIZE,
        max_len=MAX_LEN,
        record=record,
    )


def example_3_rows(lesson: Utilization) -> list[tuple[str, object, object]]:
    """Both fills' figures, kvlab's beside the lesson's: (what, kvlab value, lesson value) rows."""
    if not isinstance(lesson, Utilization):
        raise InvalidArgumentError(f"expected the result of example_3(), got {type(lesson).__name__}")
    reserving, paged = lesson.reserving, lesson.paged
    ours = {
        "contiguous, 2,048 each: requests": reserving.requests,
        "contiguous: tokens stored": reserving.tokens_stored,
        "contiguous: share of the pool": f"{reserving.stored_percent:.1f}%",
        "paged, 16-token blocks: requests": paged.requests,
        "paged: tokens stored": paged.tokens_stored,
        "paged: share of the pool": f"{paged.stored_percent:.1f}%",
        "paged: slots wasted in last blocks": paged.wasted_slots,
        "paged: waste per request": f"{paged.waste_per_request:.1f}",
    }
    return [(what, ours[what], figure) for what, figure in LESSON_FIGURES.items()]


def block_size_table(block_sizes: Sequence[int] = (1, 4, 16, 64, 128)) -> str:
    """The lesson's 40 requests in its 8,192-slot pool, one line per block size (each a ``fill_paged``).

    At most ``MAX_SWEEP`` block sizes, each at most ``LIMITS.block_size`` and at most the pool.
    """
    sizes = check_items("block_sizes", block_sizes, what="a list of block sizes")
    if not 1 <= len(sizes) <= MAX_SWEEP:
        raise InvalidArgumentError(f"block_sizes must hold 1 to {MAX_SWEEP} sizes, got {len(sizes)}")
    sizes = [check_size("each block size", b, "block_size", minimum=1) for b in sizes]
    for b in sizes:
        if b > POOL_SIZE:
            raise InvalidArgumentError(f"a block size of {b} is larger than the {POOL_SIZE:,}-slot pool")
    lengths = request_lengths(SEED, REQUESTS)
    lines = [f"{'block size':>10}  {'requests':>8}  {'stored':>7}  {'wasted in last blocks':>21}"]
    for b in sizes:
        fill = fill_paged(lengths, pool_size=POOL_SIZE, block_size=b)
        lines.append(f"{b:>10}  {fill.requests:>8}  {fill.stored_percent:>6.1f}%  {fill.wasted_slots:>21}")
    return "\n".join(lines)
