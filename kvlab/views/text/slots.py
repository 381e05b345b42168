"""Captions of ``kvlab.server.slots.SlotServer``'s events (llama-server slots, examples 10 and 11)."""

from __future__ import annotations

import re

from kvlab.core.snapshots import Event
from kvlab.views.text import describes


@describes("slots.init")
def _init(event: Event) -> str:
    return "start"


#: How the server chose the slot, in words (the events record llama-server's own short names).
CHOSEN = {"lru": "the least recently used", "lcp": "chosen by similarity", "id": "asked for by id_slot"}


def request_name(request_id: object) -> str:
    """The server's ``req-K`` (counted from 0) as "request K+1", as the notebooks count requests; any other
    id as it is."""
    match = re.fullmatch(r"req-([0-9]{1,9})", str(request_id))
    return f"request {int(match.group(1)) + 1}" if match else str(request_id)


@describes("slots.place")
def _place(event: Event) -> str:
    how = CHOSEN.get(event["selected_by"], event["selected_by"])
    return (
        f"{request_name(event['request_id'])} on slot {event['slot_id']} ({how}): "
        f"cache_n {event['cache_n']}, prompt_n {event['prompt_n']}"
    )


@describes("slots.finish")
def _finish(event: Event) -> str:
    return (
        f"{request_name(event['request_id'])} done: {event['n_generated']} sampled, "
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
        f"{request_name(e['request_id'])} refused on slot {e['slot_id']}: {e['prompt_tokens']} tokens do not fit "
        f"n_ctx {e['n_ctx']} (the slot was chosen and released first)"
    )
