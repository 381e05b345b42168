"""Lesson example 1: reserve the maximum (internal fragmentation), then exact sizes (external).

Part one gives each of five requests a ``max_len``-slot region of a ``ContiguousPool`` although it
uses only its real length; part two reserves exact sizes, lets two requests finish and shows a new
request refused while the free total would hold it. The runners take the lesson's numbers as
defaults of ``example_1`` and any others as arguments, so the exercises can replay a student's own.
``part_one_rows`` and ``part_two_rows`` line kvlab's figures up with the ones the lesson printed
(``LESSON_PART_ONE``, ``LESSON_PART_TWO``), for ``compare_table``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.snapshots import ContiguousState, History
from kvlab.errors import InvalidArgumentError, brief, check_int, check_items, check_size
from kvlab.models.contiguous import ContiguousPool

LESSON_PART_ONE = {
    "where each region starts": [0, 2048, 4096, 6144],
    "requests placed": 4,
    "request refused": ["r4"],
    "slots reserved": 8192,
    "tokens stored": 2350,
    "share of the pool holding KV": "28.7%",
}
"""Part one's figures as the lesson's program printed them."""

LESSON_PART_TWO = {
    "free slots after q1 and q3 finish": 1892,
    "free gaps, lowest first": [600, 400, 892],
    "900-slot request": "rejected",
}
"""Part two's figures as the lesson's program printed them."""


@dataclass(frozen=True)
class ReserveMaxResult:
    """Part one: every request reserves ``max_len`` slots but uses only its real length."""

    pool_size: int
    max_len: int
    placed: tuple[str, ...]
    rejected: tuple[str, ...]
    reserved: int
    stored: int
    internal_fragmentation: int
    history: History[ContiguousState]

    @property
    def stored_percent(self) -> float:
        return 100.0 * self.stored / self.pool_size


@dataclass(frozen=True)
class ExactFitResult:
    """Part two: exact-size regions, some requests finish, a new request looks for a gap."""

    pool_size: int
    free: int
    gaps: tuple[int, ...]  # gap sizes, lowest start first
    largest_gap: int
    new_request: int
    new_request_placed: bool
    external_fragmentation: int
    history: History[ContiguousState]


@dataclass(frozen=True)
class Example1:
    reserve_max: ReserveMaxResult
    exact_fit: ExactFitResult


def reserve_max(lengths: Sequence[int], *, pool_size: int = 8192, max_len: int = 2048) -> ReserveMaxResult:
    """Reserve ``max_len`` slots for each request (real lengths ``lengths``), in order, first fit."""
    lengths = _check_lengths("lengths", lengths)
    max_len = check_size("max_len", max_len, "tokens", minimum=1)
    for i, n in enumerate(lengths):
        if n > max_len:
            raise InvalidArgumentError(f"lengths[{i}] = {n} exceeds max_len = {max_len}: raise max_len")
    pool = ContiguousPool(pool_size, record=True)
    placed = []
    for i, n in enumerate(lengths):
        if pool.reserve(f"r{i}", max_len, used=n) is not None:
            placed.append(f"r{i}")
    assert pool.history is not None
    return ReserveMaxResult(
        pool_size, max_len, tuple(placed), pool.rejected, pool.reserved, pool.stored,
        pool.internal_fragmentation, pool.history,
    )  # fmt: skip


def exact_fit(
    sizes: Sequence[int], finished: Sequence[int], new_request: int, *, pool_size: int = 8192
) -> ExactFitResult:
    """Reserve exactly ``sizes`` (requests q0, q1, ...), release the ``finished`` indices, then try ``new_request``."""
    sizes = _check_lengths("sizes", sizes)
    finished = [
        check_int("finished index", i, minimum=0)
        for i in check_items("finished", finished, what="a list of request indices")
    ]
    for i in finished:
        if i >= len(sizes):
            raise InvalidArgumentError(
                f"finished index {brief(i)} is out of range: there are {len(sizes)} requests (0..{len(sizes) - 1})"
            )
    if len(set(finished)) != len(finished):
        raise InvalidArgumentError(f"finished lists a request twice: {brief(finished)}")
    check_int("new_request", new_request, minimum=1)
    pool = ContiguousPool(pool_size, record=True)
    for i, size in enumerate(sizes):
        pool.reserve(f"q{i}", size)
    for i in finished:
        if f"q{i}" not in pool.rejected:
            pool.release(f"q{i}")
    free, gaps, largest, external = (
        pool.free,
        tuple(pool.gap_sizes()),
        pool.largest_gap,
        pool.external_fragmentation,
    )
    placed = pool.reserve(f"q{len(sizes)}", new_request) is not None
    assert pool.history is not None
    return ExactFitResult(pool_size, free, gaps, largest, new_request, placed, external, pool.history)


def example_1() -> Example1:
    """Lesson example 1: reserve-the-maximum, then exact sizes with external fragmentation."""
    return Example1(
        reserve_max([300, 1200, 150, 700, 500], pool_size=8192, max_len=2048),
        exact_fit([1500, 600, 1800, 400, 2000, 1000], finished=[1, 3], new_request=900, pool_size=8192),
    )


def part_one_rows(result: ReserveMaxResult) -> list[tuple[str, object, object]]:
    """Part one's figures, kvlab's beside the lesson's: (what, kvlab value, lesson value) rows."""
    if not isinstance(result, ReserveMaxResult):
        raise InvalidArgumentError(f"expected the result of reserve_max, got {type(result).__name__}")
    regions = result.history[-1].state.regions
    ours = {
        "where each region starts": [r.start for r in regions],
        "requests placed": len(result.placed),
        "request refused": list(result.rejected),
        "slots reserved": result.reserved,
        "tokens stored": result.stored,
        "share of the pool holding KV": f"{result.stored_percent:.1f}%",
    }
    return [(what, ours[what], lesson) for what, lesson in LESSON_PART_ONE.items()]


def part_two_rows(result: ExactFitResult) -> list[tuple[str, object, object]]:
    """Part two's figures, kvlab's beside the lesson's: (what, kvlab value, lesson value) rows."""
    if not isinstance(result, ExactFitResult):
        raise InvalidArgumentError(f"expected the result of exact_fit, got {type(result).__name__}")
    ours = {
        "free slots after q1 and q3 finish": result.free,
        "free gaps, lowest first": list(result.gaps),
        "900-slot request": "placed" if result.new_request_placed else "rejected",
    }
    return [(what, ours[what], lesson) for what, lesson in LESSON_PART_TWO.items()]


def _check_lengths(name: str, values: Sequence[int]) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidArgumentError(f"{name} must be a list of positive integers, got {type(values).__name__}")
    from kvlab.models.utilization import (
        _check_lengths as check_lengths,  # LIMITS.count lengths of LIMITS.tokens
    )

    try:
        return check_lengths(values)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(str(exc).replace("lengths", name)) from None
