"""Captions of ``agents.*`` events: the agent-history runs shown side by side, turn by turn (lesson example 13)."""

from __future__ import annotations

from kvlab.core.snapshots import Event
from kvlab.views.text import describes


@describes("agents.start")
def _start(e: Event) -> str:
    return "before the first turn"


@describes("agents.turn")
def _turn(e: Event) -> str:
    # the count first, then the policy: a name that ends in a number ("one summary at 12") never runs into it
    return f"turn {e['turn']}, tokens processed: " + "; ".join(
        f"{count:,} by {n}" for n, count in e["processed"]
    )
