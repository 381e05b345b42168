"""Captions of the steps ``kvlab.models.utilization.fill_paged`` adds to its block pool's history."""

from __future__ import annotations

from kvlab.core.snapshots import Event
from kvlab.views.text import describes


@describes("utilization.wait")
def _wait(e: Event) -> str:
    return (
        f"{e['request_id']} ({e['tokens']:,} tokens) needs {e['blocks_needed']:,} blocks, "
        f"{e['free_blocks']:,} free: it waits"
    )
