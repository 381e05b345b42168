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

import dataclasses
from collections.abc import Callable

from kvlab.errors import (
    InvalidArgumentError,
    brief,
    check_int,
    check_items,
    check_optional_str,
    check_size,
)
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


def _check_turn(name: str, turn: object) -> LayoutTurn:
    """A turn the table prints: a LayoutTurn whose counts are plain ints in range (a hand-built one too),
    as a copy holding only the checked plain values."""
    if not isinstance(turn, LayoutTurn):
        raise InvalidArgumentError(f"{name} must be a LayoutTurn (from run_layout), got {brief(turn)}")
    prompt = check_size(f"{name}.prompt_tokens", turn.prompt_tokens, "tokens")
    first = turn.first_change
    return dataclasses.replace(
        turn,
        turn=check_size(f"{name}.turn", turn.turn, "turns"),
        prompt_tokens=prompt,
        cached_tokens=check_int(f"{name}.cached_tokens", turn.cached_tokens, minimum=0, maximum=prompt),
        first_change=None if first is None else check_size(f"{name}.first_change", first, "tokens"),
        changed_segment=check_optional_str(f"{name}.changed_segment", turn.changed_segment),
    )


def _check_runs(runs: object) -> list[list[LayoutTurn]]:
    """The turns of the three lesson layouts' runs in ``runs`` (``example_9()``), checked, in the lesson's order."""
    if not isinstance(runs, dict):
        raise InvalidArgumentError(
            f"runs must be the dict example_9() returns ({', '.join(LESSON_LAYOUTS)}), got {brief(runs)}"
        )
    out = []
    for name in LESSON_LAYOUTS:
        run = dict.get(runs, name)  # dict's own lookup, never a subclass's
        if not isinstance(run, LayoutRun):
            raise InvalidArgumentError(
                f"runs[{name!r}] must be the LayoutRun example_9() gives, got {brief(run)}: pass example_9()"
            )
        turns = check_items(f"runs[{name!r}].turns", run.turns, "turns", what="a tuple of LayoutTurn")
        out.append([_check_turn(f"runs[{name!r}].turns[{i}]", turn) for i, turn in enumerate(turns)])
    if len({len(turns) for turns in out}) != 1:
        raise InvalidArgumentError(
            f"the three runs must have as many turns each, got {[len(turns) for turns in out]}: pass example_9()"
        )
    return out


def turn_table(runs: dict[str, LayoutRun]) -> str:
    """The three layouts turn by turn: the stable one's cached share, where the other two first change."""
    stable, stamped, shuffled = _check_runs(runs)
    lines = [
        f"{'turn':>4}  {'stable: cached / prompt':>23}  {'timestamp first: changed at':>27}  "
        f"{'shuffled: cached, changed at':>28}"
    ]
    for a, b, c in zip(stable, stamped, shuffled, strict=True):
        lines.append(
            f"{a.turn + 1:>4}  {f'{a.cached_tokens:,} / {a.prompt_tokens:,}':>23}  {_changed_at(b):>27}  "
            f"{f'{c.cached_tokens}, {_changed_at(c)}':>28}"
        )
    return "\n".join(lines)
