"""Captions of ``kvlab.server.swa.SwaSlot``'s events (sliding-window ring and checkpoints, example 12)."""

from __future__ import annotations

from kvlab.core.snapshots import Event
from kvlab.views.text import describes, plural


@describes("swa.init")
def _init(event: Event) -> str:
    return f"empty slot: {event['cells']} SWA cells"


@describes("swa.reuse")
def _reuse(event: Event) -> str:
    restored = event["restored"]
    if event["forced_full"]:
        what = "forcing full prompt re-processing, its checkpoints erased"
    elif restored is not None:
        what = f"restored checkpoint [{restored[0]}, {restored[1]}]"
    elif event["cache_n"] == 0:
        what = "nothing cached to reuse"
    else:
        what = "cache reused"
    return (
        f"common prefix {event['common_prefix']}, threshold {event['threshold']}: "
        f"{what}; cache_n {event['cache_n']}"
    )


@describes("swa.batch")
def _batch(event: Event) -> str:
    cp = event["checkpoint"]
    note = f"; checkpoint [{cp[0]}, {cp[1]}] at {cp[2]} tokens" if cp is not None else ""
    return f"decoded batch [{event['start']}, {event['end']}){note}"


@describes("swa.sample")
def _sample(event: Event) -> str:
    return f"sampled {plural(event['n_sampled'], 'token')}; the slot keeps {event['n_tokens']:,}"
