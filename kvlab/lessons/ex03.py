"""Lesson example 3: 40 requests from Java's ``new Random(5)`` fill an 8,192-slot pool two ways.

Reserving 2,048 slots each admits 4 requests and stores 37.6 % of the pool; 16-token blocks on
demand admit 8 and store 92.0 % (the lesson's figures; ``tests/test_utilization.py`` pins them).
"""

from __future__ import annotations

from kvlab.models.utilization import Utilization, compare_utilization, request_lengths

SEED = 5
REQUESTS = 40
POOL_SIZE = 8192
BLOCK_SIZE = 16
MAX_LEN = 2048


def example_3(*, record: bool = True) -> Utilization:
    """Lesson example 3: 40 requests from ``new Random(5)`` in an 8,192-slot pool."""
    return compare_utilization(
        request_lengths(SEED, REQUESTS),
        pool_size=POOL_SIZE,
        block_size=BLOCK_SIZE,
        max_len=MAX_LEN,
        record=record,
    )
