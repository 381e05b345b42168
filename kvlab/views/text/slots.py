"""Captions of ``kvlab.server.slots.SlotServer``'s events (llama-server slots, examples 10 and 11)."""

from __future__ import annotations

from kvlab.core.snapshots import Event
from kvlab.views.text import describes


@describes("slots.init")
def _init(event: Event) -> str:
    return "start"


@describes("slots.place")
def _place(event: Event) -> str:
    return (
        f"{event['request_id']} on slot {event['slot_id']} ({event['selected_by']}): "
        f"cache_n {event['cache_n']}, prompt_n {event['prompt_n']}"
    )


@describes("slots.finish")
def _finish(event: Event) -> str:
    return (
        f"{event['request_id']} done: {event['n_generated']} sampled, "
        f"slot {event['slot_id']} keeps {event['n_tokens']} tokens"
    )


@describes("slots.restore")
def _restore(event: Event) -> str:
    return f"slot {event['slot_id']} restored with {event['n_tokens']} tokens"


@describes("slots.erase")
def _erase(event: Event) -> str:
    return f"slot {event['slot_id']} erased ({event['n_tokens']} tokens)"
