"""Lesson example 9: one agent session sent in three prompt layouts, ten turns each.

The lesson's program builds each turn's prompt from a system prompt, ten tool
definitions, the history and the new message, with 16-token blocks: in a stable
order, with a timestamp in front, and with the tools reshuffled every turn. A
hit run stops at the first block that changed, so the first layout reuses 85.4%,
the second nothing and the third 20.0%. The layouts are lists of
``kvlab.server.layout`` segments; ``run_layout`` counts the hits, and ``turn_table`` prints, turn
by turn, where each layout's prompt first changed.
"""

from __future__ import annotations

from collections.abc import Callable

from kvlab.server.layout import (
    LayoutRun,
    LayoutTurn,
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


def _changed_at(turn: LayoutTurn) -> str:
    """Where a turn's prompt first differs from the one before: "300 (tools)", or "-" where it does not."""
    return "-" if turn.first_change is None else f"{turn.first_change} ({turn.changed_segment})"


def turn_table(runs: dict[str, LayoutRun]) -> str:
    """The three layouts turn by turn: the stable one's cached share, where the other two first change."""
    stable, stamped, shuffled = (runs[name] for name in LESSON_LAYOUTS)
    lines = [
        f"{'turn':>4}  {'stable: cached / prompt':>23}  {'timestamp first: changed at':>27}  "
        f"{'shuffled: cached, changed at':>28}"
    ]
    for a, b, c in zip(stable.turns, stamped.turns, shuffled.turns, strict=True):
        lines.append(
            f"{a.turn + 1:>4}  {f'{a.cached_tokens:,} / {a.prompt_tokens:,}':>23}  {_changed_at(b):>27}  "
            f"{f'{c.cached_tokens}, {_changed_at(c)}':>28}"
        )
    return "\n".join(lines)
