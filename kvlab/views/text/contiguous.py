"""Captions of ``kvlab.models.contiguous.ContiguousPool`` events (lesson example 1)."""

from __future__ import annotations

from kvlab.core.snapshots import Event
from kvlab.views.text import describes


@describes("contiguous.create")
def _create(e: Event) -> str:
    return f"empty pool of {e['pool_size']:,} slots"


@describes("contiguous.reserve")
def _reserve(e: Event) -> str:
    rid, size, start = e["request_id"], e["size"], e["start"]
    if start is None:
        return f"{rid}: {size:,} slots refused, largest gap {e['largest_gap']:,}"
    return f"{rid}: {size:,} slots at [{start}, {start + size}), {e['used']:,} used"


@describes("contiguous.release")
def _release(e: Event) -> str:
    return f"{e['request_id']} finishes: [{e['start']}, {e['end']}) is free"
