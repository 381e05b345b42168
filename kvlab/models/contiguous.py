"""One contiguous region of KV slots per request, placed first-fit (the pool of lesson example 1).

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

A recording pool adds one step per operation with an ``Event`` (kinds ``contiguous.create``,
``contiguous.reserve`` with ``start`` None when refused, ``contiguous.release``); the words are in
``kvlab.views.text.contiguous``. The lesson's two runs are ``kvlab.lessons.ex01``. (This is the layout of
the systems the PagedAttention paper compares vLLM against, such as FasterTransformer and Orca.)
"""

from __future__ import annotations

from kvlab.core.snapshots import ContiguousState, Event, History, Region
from kvlab.errors import (
    DuplicateRequestError,
    InvalidArgumentError,
    UnknownRequestError,
    check_bool,
    check_id,
    check_int,
    check_size,
)


def _check_request_id(request_id: object) -> str:
    return check_id("request_id", request_id)


class ContiguousPool:
    """A pool of ``pool_size`` token slots handed out as one region per request.

    With ``record=True`` the pool keeps a ``History`` of ``ContiguousState``:
    step 0 is the empty pool, and each reserve (placed or refused) or release
    adds one step. ``pool_size`` and every ``size`` are at most ``LIMITS.tokens`` slots (a pool
    larger than any context window gains a lesson nothing and only costs time).
    """

    def __init__(self, pool_size: int, *, record: bool = False) -> None:
        self.pool_size = check_size("pool_size", pool_size, "tokens", minimum=1)
        check_bool("record", record)
        self._regions: list[Region] = []  # sorted by start
        self._rejected: list[str] = []
        self.history: History[ContiguousState] | None = History() if record else None
        self._record("contiguous.create", pool_size=self.pool_size)

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
        request_id = _check_request_id(request_id)
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
        size = check_size("size", size, "tokens", minimum=1)
        return self._first_fit(size)

    # ------------------------------------------------------------------ operations

    def reserve(self, request_id: str, size: int, used: int | None = None) -> Region | None:
        """Place ``size`` slots for ``request_id`` in the lowest gap that fits.

        ``used`` is how many of them will hold tokens (default: all). Returns
        the new Region, or None when no gap is large enough; a refusal changes
        nothing but the ``rejected`` list.
        """
        request_id = _check_request_id(request_id)
        size = check_size("size", size, "tokens", minimum=1)
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
            if self.history is not None:
                self._record(
                    "contiguous.reserve", request_id=request_id, size=size, used=used, start=None,
                    largest_gap=self.largest_gap,
                )  # fmt: skip
            return None
        region = Region(request_id, start, size, used)
        self._regions.append(region)
        self._regions.sort(key=lambda r: r.start)
        self._record("contiguous.reserve", request_id=request_id, size=size, used=used, start=start)
        return region

    def release(self, request_id: str) -> Region:
        """Free the region of ``request_id`` (the request finished); return it."""
        region = self.region(request_id)
        self._regions.remove(region)
        self._record("contiguous.release", request_id=request_id, start=region.start, end=region.end)
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

    def _record(self, kind: str, **facts: object) -> None:
        if self.history is not None:
            self.history.add(Event.of(kind, **facts), self.snapshot())
