"""One contiguous region of KV slots per request, placed first-fit (lesson example 1).

This is the design paging replaced. It wastes memory in two ways that the
pool measures:

* internal fragmentation: slots reserved for a request but not holding tokens
  (``used`` < ``size``), because the output length is unknown up front;
* external fragmentation: free slots split into gaps between live regions, so
  a request can be refused while the total free space would hold it.

``reserve`` places a request in the lowest gap large enough (first fit). A
request no gap can hold is refused: ``reserve`` returns ``None`` and the only
change is that the request id joins ``rejected``. Moving live regions to close
the gaps (compaction) is deliberately not offered: on a GPU it would copy
gigabytes of KV under running requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.snapshots import ContiguousState, History, Region
from kvlab.errors import DuplicateRequestError, InvalidArgumentError, UnknownRequestError, check_int


def _check_request_id(request_id: object) -> str:
    if not isinstance(request_id, str) or not request_id:
        raise InvalidArgumentError(f"request_id must be a non-empty string, got {request_id!r}")
    return request_id


class ContiguousPool:
    """A pool of ``pool_size`` token slots handed out as one region per request.

    With ``record=True`` the pool keeps a ``History`` of ``ContiguousState``:
    step 0 is the empty pool, and each reserve (placed or refused) or release
    adds one step.
    """

    def __init__(self, pool_size: int, *, record: bool = False) -> None:
        self.pool_size = check_int("pool_size", pool_size, minimum=1)
        if not isinstance(record, bool):
            raise InvalidArgumentError(f"record must be True or False, got {record!r}")
        self._regions: list[Region] = []  # sorted by start
        self._rejected: list[str] = []
        self.history: History[ContiguousState] | None = History() if record else None
        self._record(f"empty pool of {pool_size} slots")

    # ------------------------------------------------------------------ queries

    @property
    def regions(self) -> tuple[Region, ...]:
        """Live regions, lowest start first."""
        return tuple(self._regions)

    @property
    def rejected(self) -> tuple[str, ...]:
        """Request ids refused so far, in order."""
        return tuple(self._rejected)

    def region(self, request_id: str) -> Region:
        _check_request_id(request_id)
        for r in self._regions:
            if r.owner == request_id:
                return r
        raise UnknownRequestError(f"no region for request {request_id!r}; held: {self._held_ids()}")

    def gaps(self) -> list[tuple[int, int]]:
        """Free gaps as (start, size), lowest first."""
        return list(self.snapshot().gaps)

    def gap_sizes(self) -> list[int]:
        return [size for _, size in self.gaps()]

    @property
    def reserved(self) -> int:
        """Slots inside live regions."""
        return sum(r.size for r in self._regions)

    @property
    def stored(self) -> int:
        """Slots that actually hold a token's KV."""
        return sum(r.used for r in self._regions)

    @property
    def free(self) -> int:
        return self.pool_size - self.reserved

    @property
    def internal_fragmentation(self) -> int:
        """Reserved but unused slots."""
        return self.reserved - self.stored

    @property
    def external_fragmentation(self) -> int:
        """Free slots outside the largest gap: free space a single request cannot use."""
        sizes = self.gap_sizes()
        return sum(sizes) - max(sizes, default=0)

    @property
    def largest_gap(self) -> int:
        return max(self.gap_sizes(), default=0)

    @property
    def stored_fraction(self) -> float:
        """Share of the whole pool that holds KV."""
        return self.stored / self.pool_size

    def find_gap(self, size: int) -> int | None:
        """Start of the lowest gap that holds ``size`` slots (first fit), or None."""
        check_int("size", size, minimum=1)
        return self._first_fit(size)

    # ------------------------------------------------------------------ operations

    def reserve(self, request_id: str, size: int, used: int | None = None) -> Region | None:
        """Place ``size`` slots for ``request_id`` in the lowest gap that fits.

        ``used`` is how many of them will hold tokens (default: all). Returns
        the new Region, or None when no gap is large enough; a refusal changes
        nothing but the ``rejected`` list.
        """
        _check_request_id(request_id)
        check_int("size", size, minimum=1)
        used = size if used is None else check_int("used", used, minimum=0)
        if used > size:
            raise InvalidArgumentError(
                f"used ({used}) cannot exceed size ({size}): a region holds at most its size"
            )
        if any(r.owner == request_id for r in self._regions):
            raise DuplicateRequestError(f"request {request_id!r} already holds a region; release it first")
        start = self._first_fit(size)
        if start is None:
            self._rejected.append(request_id)
            self._record(f"{request_id}: {size} slots refused, largest gap {self.largest_gap}")
            return None
        region = Region(request_id, start, size, used)
        self._regions.append(region)
        self._regions.sort(key=lambda r: r.start)
        self._record(f"{request_id}: {size} slots at [{start}, {start + size}), {used} used")
        return region

    def release(self, request_id: str) -> Region:
        """Free the region of ``request_id`` (the request finished); return it."""
        region = self.region(request_id)
        self._regions.remove(region)
        self._record(f"{request_id} finishes: [{region.start}, {region.end}) is free")
        return region

    def snapshot(self) -> ContiguousState:
        return ContiguousState(self.pool_size, tuple(self._regions), tuple(self._rejected))

    # ------------------------------------------------------------------ internals

    def _first_fit(self, size: int) -> int | None:
        pos = 0
        for r in self._regions:
            if r.start - pos >= size:
                return pos
            pos = r.end
        return pos if self.pool_size - pos >= size else None

    def _held_ids(self) -> str:
        return ", ".join(repr(r.owner) for r in self._regions) or "none"

    def _record(self, caption: str) -> None:
        if self.history is not None:
            self.history.add(caption, self.snapshot())


# ---------------------------------------------------------------- lesson example 1


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
    check_int("max_len", max_len, minimum=1)
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
    finished = list(finished)
    for i in finished:
        check_int("finished index", i, minimum=0)
        if i >= len(sizes):
            raise InvalidArgumentError(f"finished index {i} is out of range: there are {len(sizes)} requests")
    if len(set(finished)) != len(finished):
        raise InvalidArgumentError(f"finished lists a request twice: {finished}")
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


def _check_lengths(name: str, values: Sequence[int]) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidArgumentError(f"{name} must be a list of positive integers, got {type(values).__name__}")
    out = list(values)
    for i, v in enumerate(out):
        check_int(f"{name}[{i}]", v, minimum=1)
    return out
