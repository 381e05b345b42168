"""Lesson example 9: one agent session sent in three prompt layouts, ten turns each.

The lesson's program builds each turn's prompt from a system prompt, ten tool
definitions, the history and the new message, with 16-token blocks: in a stable
order, with a timestamp in front, and with the tools reshuffled every turn. A
hit run stops at the first block that changed, so the first layout reuses 85.4%,
the second nothing and the third 20.0%. The layouts are lists of
``kvlab.server.layout`` segments; ``run_layout`` counts the hits.
"""

from __future__ import annotations

from collections.abc import Callable

from kvlab.server.layout import (
    LayoutRun,
    Segment,
    history,
    new_message,
    run_layout,
    system_prompt,
    timestamp,
    tool_definitions,
)

LESSON_SEGMENTS: dict[str, Callable[[], Segment]] = {
    "timestamp": timestamp,
    "system prompt": system_prompt,
    "tools": tool_definitions,
    "history": history,
    "new message": new_message,
}
"""The lesson's five segments by the name each carries (``Segment.name``), so a layout can be given as names."""

LESSON_STABLE_ORDER = ["system prompt", "tools", "history", "new message"]
"""The lesson's stable layout by segment name: the fixed parts first, then what changes each turn."""

LESSON_LAYOUTS: dict[str, Callable[[], list[Segment]]] = {
    "stable prefix": lambda: [LESSON_SEGMENTS[name]() for name in LESSON_STABLE_ORDER],
    "timestamp first": lambda: [timestamp(), system_prompt(), tool_definitions(), history(), new_message()],
    "tools in random order": lambda: [
        system_prompt(),
        tool_definitions(shuffled=True),
        history(),
        new_message(),
    ],
}


def example_9(scheme: str = "lesson") -> dict[str, LayoutRun]:
    """The lesson's three layouts over 10 turns with 16-token blocks."""
    return {name: run_layout(make(), name=name, scheme=scheme) for name, make in LESSON_LAYOUTS.items()}
