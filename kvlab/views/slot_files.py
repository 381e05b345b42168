"""Example 11's views: a slot saved to a file, the server stopped, a new one restored and reused.

One figure per ``SaveRestoreState``, five rows that tell the story left to right:

* **server 1 · slot 0** and **server 1 · last request**: what the first server's slot holds, and
  how its latest request split into tokens reused from the slot (``cache_n``) and evaluated
  (``prompt_n``);
* **slot file**: the tokens the file holds once ``POST /slots/0?action=save`` has run;
* **server 2 · slot 0** and **server 2 · last request**: the restarted server, whose slot is
  empty until ``?action=restore`` puts the file's tokens back, and the next request, which
  reuses them.

The states come from the models' own snapshots (``SlotServer.history``'s ``SlotServerState``s) and
the save's result; ``kvlab.lessons.ex11.save_restore_history`` records them. ``slot_file_animation``
(plain plotly, plays in exported HTML) and ``slot_file_stepper`` (a live widget) step through such a
history with the same axes for every step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any

import plotly.graph_objects as go

from kvlab.core.snapshots import History, RequestRecord, SlotServerState, SlotState
from kvlab.errors import InvalidArgumentError, brief, check_int, check_optional_str, check_size
from kvlab.views import theme
from kvlab.views._common import Spec, base_layout, check_title, legend_entry, steps_of, title_text
from kvlab.views.animations import DEFAULT_FRAME_MS, animate, check_frames, step_caption
from kvlab.views.live import Stepper

ROWS = (
    "server 1 · slot 0",
    "server 1 · last request",
    "slot file",
    "server 2 · slot 0",
    "server 2 · last request",
)

#: Bar colours and the legend's words for them.
PART_STYLES: dict[str, dict[str, str]] = {
    "prefix": {"color": theme.BLUE, "label": "the saved prefix's tokens"},
    "after": {"color": theme.PURPLE, "label": "tokens after the prefix"},
    "cached": {"color": theme.GREEN, "label": "reused from the slot (cache_n)"},
    "evaluated": {"color": theme.ORANGE, "label": "evaluated (prompt_n)"},
}
_ROW_PX = 40


@dataclass(frozen=True)
class SaveRestoreState:
    """The two servers and the file at one step: a server is None before it starts or after it stops.

    ``prefix_tokens`` is how long the saved prefix is (the colour changes after it); ``file_tokens``
    is what the file holds (None before the save).
    """

    prefix_tokens: int
    first: SlotServerState | None
    file_tokens: tuple[int, ...] | None
    second: SlotServerState | None


_FROM_HISTORY = "take a history from kvlab.lessons.ex11.save_restore_history()"


def _token_count(name: str, tokens: object) -> tuple[int, ...]:
    """A tuple of tokens the view only counts: a plain tuple or list of at most ``LIMITS.tokens``."""
    if type(tokens) not in (tuple, list):
        raise InvalidArgumentError(
            f"{name} must be a tuple of token ids, got {brief(tokens)}; {_FROM_HISTORY}"
        )
    check_size(f"the length of {name}", len(tokens), "tokens")
    return tuple(tokens)


def _check_request(name: str, last: object) -> RequestRecord | None:
    """The latest request's counters the view draws, as plain ints in range (``cache_n + prompt_n`` tokens)."""
    if last is None:
        return None
    if not isinstance(last, RequestRecord):
        raise InvalidArgumentError(
            f"{name} must be a RequestRecord or None, got {brief(last)}; {_FROM_HISTORY}"
        )
    prompt = check_size(f"{name}.prompt_tokens", last.prompt_tokens, "tokens")
    return dataclasses.replace(
        last,
        prompt_tokens=prompt,
        cache_n=check_int(f"{name}.cache_n", last.cache_n, minimum=0, maximum=prompt),
        prompt_n=check_int(f"{name}.prompt_n", last.prompt_n, minimum=0, maximum=prompt),
        error=check_optional_str(f"{name}.error", last.error),
    )


def _check_server(name: str, server: object) -> SlotServerState | None:
    """A server's snapshot as the view reads it: slot 0's tokens and the latest request, checked."""
    if server is None:
        return None
    if not isinstance(server, SlotServerState):
        raise InvalidArgumentError(
            f"{name} must be a SlotServerState (SlotServer.snapshot()) or None, got {brief(server)}; {_FROM_HISTORY}"
        )
    slots = server.slots
    if type(slots) not in (tuple, list) or not slots or not isinstance(slots[0], SlotState):
        raise InvalidArgumentError(
            f"{name}.slots must be a tuple of SlotState, got {brief(slots)}; {_FROM_HISTORY}"
        )
    slot = dataclasses.replace(slots[0], tokens=_token_count(f"{name}.slots[0].tokens", slots[0].tokens))
    return dataclasses.replace(
        server, slots=(slot, *slots[1:]), last=_check_request(f"{name}.last", server.last)
    )


def _check_state(name: str, state: object) -> SaveRestoreState:
    """``state`` with every field the view draws checked (a hand-built one too), as a copy of plain values."""
    if not isinstance(state, SaveRestoreState):
        raise InvalidArgumentError(
            f"{name} must be a SaveRestoreState, got {type(state).__name__}; {_FROM_HISTORY}"
        )
    file_tokens = state.file_tokens
    return SaveRestoreState(
        check_size(f"{name}.prefix_tokens", state.prefix_tokens, "tokens"),
        _check_server(f"{name}.first", state.first),
        None if file_tokens is None else _token_count(f"{name}.file_tokens", file_tokens),
        _check_server(f"{name}.second", state.second),
    )


def _extent(state: SaveRestoreState) -> int:
    """The longest token run any row of ``state`` draws."""
    sizes = [state.prefix_tokens, len(state.file_tokens or ())]
    for server in (state.first, state.second):
        if server is not None:
            sizes.append(len(server.slots[0].tokens))
            if server.last is not None:
                sizes.append(server.last.prompt_tokens)
    return max(sizes)


def _rows(state: SaveRestoreState) -> dict[str, dict[str, tuple[float, float]]]:
    """Per bar kind, per row: (start, length) of the bar (rows without one are left out)."""
    bars: dict[str, dict[str, tuple[float, float]]] = {kind: {} for kind in PART_STYLES}
    n = state.prefix_tokens

    def tokens(row: str, count: int) -> None:
        bars["prefix"][row] = (0, min(count, n))
        if count > n:
            bars["after"][row] = (n, count - n)

    for server, slot_row, request_row in ((state.first, ROWS[0], ROWS[1]), (state.second, ROWS[3], ROWS[4])):
        if server is None:
            continue
        tokens(slot_row, len(server.slots[0].tokens))
        last = server.last
        if last is not None and last.error is None:
            bars["cached"][request_row] = (0, last.cache_n)
            bars["evaluated"][request_row] = (last.cache_n, last.prompt_n)
    if state.file_tokens is not None:
        tokens(ROWS[2], len(state.file_tokens))
    return bars


def _status(state: SaveRestoreState) -> str:
    def server(name: str, s: SlotServerState | None, gone: str) -> str:
        if s is None:
            return f"{name}: {gone}"
        held = len(s.slots[0].tokens)
        last = "" if s.last is None else f", last request cache_n {s.last.cache_n} prompt_n {s.last.prompt_n}"
        return f"{name}: slot 0 holds {held:,} tokens{last}"

    file = "no file yet" if state.file_tokens is None else f"file: {len(state.file_tokens):,} tokens"
    return " · ".join(
        [server("server 1", state.first, "stopped"), file, server("server 2", state.second, "not started")]
    )


def slot_file_spec(
    state: SaveRestoreState,
    previous: SaveRestoreState | None = None,
    *,
    title: str | None = None,
    caption: str | None = None,
    x_max: int | None = None,
) -> Spec:
    """One step as plain dicts: five rows of token bars (see the module's docstring).

    ``x_max`` (token positions on the axis) defaults to what this state needs; the animation and the
    stepper pass the largest over a history so every step has the same axes.
    """
    state = _check_state("state", state)
    if previous is not None:
        _check_state("previous", previous)
    title, caption = check_title(title), check_title(caption)
    x_max = _extent(state) if x_max is None else check_size("x_max", x_max, "tokens", minimum=1)
    bars = _rows(state)
    data = []
    for kind, style in PART_STYLES.items():
        rows = [r for r in ROWS if bars[kind].get(r, (0, 0))[1] > 0]  # an empty slot draws no bar
        data.append({
            "type": "bar", "orientation": "h", "name": style["label"], "y": rows,
            "x": [bars[kind][r][1] for r in rows], "base": [bars[kind][r][0] for r in rows],
            "marker": {"color": style["color"], "line": {"color": theme.INK, "width": 0.5}},
            "hovertemplate": "%{y}: %{x} tokens from position %{base}<extra>" + style["label"] + "</extra>",
            "showlegend": False,
        })  # fmt: skip
    # the legend lists every kind at every step (a bar trace with no bars would drop out of it)
    data += [legend_entry(style["label"], style["color"]) for style in PART_STYLES.values()]
    ttl = title_text(caption or title or "Save, restart, restore, reuse", _status(state))
    head_lines = ttl["text"].split("</b>")[0].count("<br>") + 1
    sub_lines = ttl["text"].split("</b>", 1)[1].count("<br>")
    top = 30 + 21 * head_lines + 17 * sub_lines + 10
    plot_h = _ROW_PX * len(ROWS) + 30
    bottom = 110
    layout = base_layout(
        ttl, barmode="overlay", height=top + plot_h + bottom, showlegend=True,
        legend={"orientation": "h", "y": -60 / plot_h, "x": 0, "yanchor": "top", "font": {"size": 12}},
        xaxis={"range": [0, x_max * 1.02], "title": {"text": "token position", "standoff": 4}, "zeroline": False},
        yaxis={"categoryorder": "array", "categoryarray": list(ROWS), "range": [len(ROWS) - 0.5, -0.5],
               "fixedrange": True, "automargin": True, "type": "category"},
        margin={"l": 20, "r": 20, "t": top, "b": bottom},
    )  # fmt: skip
    return {"data": data, "layout": layout}


def slot_file_figure(state: SaveRestoreState, *, title: str | None = None) -> go.Figure:
    """Example 11: one step of the save, restart, restore and reuse sequence."""
    return go.Figure(slot_file_spec(state, title=title))


def _states(history: object, *, frames: bool = False) -> list[tuple[str, SaveRestoreState]]:
    """Every step's caption and checked state; with ``frames``, at most ``LIMITS.frames`` of them."""
    steps = steps_of(history, SaveRestoreState)
    if frames:
        check_frames(len(steps))
    return [(c, _check_state(f"step {i}", s)) for i, (c, s) in enumerate(steps)]


def slot_file_animation(
    history: History[SaveRestoreState] | list, *, title: str | None = None, frame_ms: int = DEFAULT_FRAME_MS
) -> go.Figure:
    """The sequence step by step, with play and a slider (plain plotly: it plays in exported HTML too)."""
    title = check_title(title)
    steps = _states(history, frames=True)
    x_max = max(_extent(s) for _, s in steps)
    specs = []
    for i, (caption, state) in enumerate(steps):
        head = step_caption(i, len(steps), caption)
        specs.append(slot_file_spec(state, caption=f"{title} · {head}" if title else head, x_max=x_max))
    return animate(specs, [c for c, _ in steps], frame_ms=frame_ms)


def slot_file_stepper(history: History[SaveRestoreState] | list, *, interval_ms: int = 900) -> Stepper:
    """A ``Stepper`` over the sequence (needs a running kernel; the animation is its static twin)."""
    steps = _states(history)
    view = partial(_stepper_view, x_max=max(_extent(s) for _, s in steps))
    return Stepper(history, [view], interval_ms=interval_ms)


def _stepper_view(state: SaveRestoreState, previous: SaveRestoreState | None, **hints: Any) -> Spec:
    return slot_file_spec(state, previous, title="Save, restart, restore, reuse", **hints)
