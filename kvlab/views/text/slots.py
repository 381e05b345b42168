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
        f"slot {event['slot_id']} keeps {event['n_tokens']:,} tokens"
    )


@describes("slots.restore")
def _restore(event: Event) -> str:
    return f"slot {event['slot_id']} restored with {event['n_tokens']:,} tokens"


@describes("slots.erase")
def _erase(event: Event) -> str:
    return f"slot {event['slot_id']} erased ({event['n_tokens']:,} tokens)"


@describes("slots.refuse")
def _refuse(e: Event) -> str:
    return (
        f"{e['request_id']} refused on slot {e['slot_id']}: {e['prompt_tokens']} tokens do not fit "
        f"n_ctx {e['n_ctx']} (the slot was chosen and released first)"
    )
