"""How much of a pool holds KV: reserve-the-maximum against on-demand blocks (lesson example 3's model).

Both fills admit requests in arrival order and stop at the first request that
does not fit, as a first-come-first-served scheduler does (it does not skip
ahead to a smaller request). Requests only arrive here; none finishes.

* Reserving: every request gets a ``max_len``-slot region in a
  ``kvlab.models.contiguous.ContiguousPool``; the unused part of each region is waste.
* Paged: every request takes ceil(length / block_size) blocks of a
  ``kvlab.models.paged.BlockPool`` of ``pool_size // block_size`` blocks; the only
  waste is the unused tail of each request's last block (at most
  block_size - 1 slots).

The lesson's run (40 requests from ``new Random(5)``) is ``kvlab.lessons.ex03``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import islice

from kvlab.core.snapshots import BlockPoolState, ContiguousState, Event, History
from kvlab.core.workloads import JavaRandom
from kvlab.errors import LIMITS, InvalidArgumentError, brief, check_bool, check_size
from kvlab.models.contiguous import ContiguousPool
from kvlab.models.paged import BlockPool


@dataclass(frozen=True)
class Fill:
    """The outcome of filling one pool with requests."""

    method: str
    pool_size: int
    requests: int  # admitted before the first refusal
    tokens_stored: int
    wasted_slots: int  # held by admitted requests but holding no token
    history: History | None = None  # ContiguousState or BlockPoolState steps, when recorded

    @property
    def stored_percent(self) -> float:
        return 100.0 * self.tokens_stored / self.pool_size

    @property
    def waste_per_request(self) -> float:
        return self.wasted_slots / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Utilization:
    lengths: tuple[int, ...]
    reserving: Fill
    paged: Fill


def request_lengths(seed: int = 5, count: int = 40, *, shortest: int = 100, spread: int = 1400) -> list[int]:
    """``count`` lengths ``shortest + nextInt(spread)`` from Java's ``new Random(seed)``, as the lesson drew them.

    ``count`` is at most ``LIMITS.count`` draws; ``shortest + spread - 1`` (the longest length) at
    most ``LIMITS.tokens``, one request's tokens.
    """
    count = check_size("count", count, "count")
    shortest = check_size("shortest", shortest, "tokens", minimum=1)
    spread = check_size("spread", spread, "tokens", minimum=1)
    if shortest + spread - 1 > LIMITS.tokens:
        raise InvalidArgumentError(
            f"shortest + spread - 1 = {shortest + spread - 1:,} is longer than one request may be "
            f"({LIMITS.tokens:,} tokens, kvlab's limit LIMITS.tokens); lower shortest or spread"
        )
    rng = JavaRandom(seed)
    return [shortest + rng.next_int(spread) for _ in range(count)]


def fill_reserving(
    lengths: Sequence[int], *, pool_size: int = 8192, max_len: int = 2048, record: bool = False
) -> Fill:
    """Reserve ``max_len`` slots per request, first fit, until one is refused."""
    lengths = _check_lengths(lengths)
    pool_size = check_size("pool_size", pool_size, "tokens", minimum=1)
    max_len = check_size("max_len", max_len, "tokens", minimum=1)
    check_bool("record", record)
    for i, n in enumerate(lengths):
        if n > max_len:
            raise InvalidArgumentError(f"lengths[{i}] = {n} exceeds max_len = {max_len}: raise max_len")
    pool = ContiguousPool(pool_size, record=record)
    for i, n in enumerate(lengths):
        if pool.reserve(f"r{i}", max_len, used=n) is None:
            break
    history: History[ContiguousState] | None = pool.history
    return Fill(
        f"reserve {max_len} each",
        pool_size,
        len(pool.regions),
        pool.stored,
        pool.internal_fragmentation,
        history,
    )


def fill_paged(
    lengths: Sequence[int], *, pool_size: int = 8192, block_size: int = 16, record: bool = False
) -> Fill:
    """Give each request ceil(length / block_size) blocks on demand until one does not fit.

    The pool has ``pool_size // block_size`` blocks (slots that do not make a
    whole block are not usable). When recording, the last step repeats the
    final state with a ``utilization.wait`` event naming the request that did not fit.
    """
    lengths = _check_lengths(lengths)
    pool_size = check_size("pool_size", pool_size, "tokens", minimum=1)
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    check_bool("record", record)
    if pool_size < block_size:
        raise InvalidArgumentError(
            f"pool_size ({pool_size}) is smaller than one block ({block_size}); raise it"
        )
    pool = BlockPool(pool_size // block_size, block_size, record=record)
    for i, n in enumerate(lengths):
        need = pool.blocks_needed(n)
        if need > pool.num_free_blocks:
            if pool.history is not None:
                wait = Event.of(
                    "utilization.wait", request_id=f"r{i}", tokens=n, blocks_needed=need,
                    free_blocks=pool.num_free_blocks,
                )  # fmt: skip
                # the pool as it stands, with no op's marks: the wait allocates nothing
                pool.history.add(wait, replace(pool.snapshot(), hit_block_ids=(), new_block_ids=(),
                                               evicted_block_ids=(), copied_blocks=()))  # fmt: skip
            break
        pool.allocate(f"r{i}", n)
    stored = sum(pool.num_tokens(r) for r in pool.requests)
    wasted = pool.num_used_blocks * block_size - stored
    history: History[BlockPoolState] | None = pool.history
    return Fill(f"{block_size}-token blocks", pool_size, len(pool.requests), stored, wasted, history)


def compare_utilization(
    lengths: Sequence[int],
    *,
    pool_size: int = 8192,
    block_size: int = 16,
    max_len: int = 2048,
    record: bool = False,
) -> Utilization:
    """Fill the same pool both ways with the same requests."""
    checked = _check_lengths(lengths)  # read once: an iterator is not drained twice
    return Utilization(
        tuple(checked),
        fill_reserving(checked, pool_size=pool_size, max_len=max_len, record=record),
        fill_paged(checked, pool_size=pool_size, block_size=block_size, record=record),
    )


def _check_lengths(lengths: object) -> list[int]:
    """At most ``LIMITS.count`` request lengths, each a positive int of at most ``LIMITS.tokens``."""
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise InvalidArgumentError(
            f"lengths must be a list of positive integers, got {type(lengths).__name__}"
        )
    try:
        out = list(islice(lengths, LIMITS.count + 1))  # type: ignore[call-overload]
    except Exception:
        raise InvalidArgumentError(
            f"lengths must be a list of positive integers, got {brief(lengths)}"
        ) from None
    if len(out) > LIMITS.count:
        raise InvalidArgumentError(
            f"more than {LIMITS.count:,} lengths (kvlab's limit LIMITS.count); "
            "for a deliberately larger run use kvlab.errors.raised_limits(count=...)"
        )
    for i, n in enumerate(out):
        out[i] = check_size(f"lengths[{i}]", n, "tokens", minimum=1)
    return out
