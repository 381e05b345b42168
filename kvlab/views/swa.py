"""Example 12's views: the SWA ring, the positions it covers, and the context checkpoints.

One figure per ``kvlab.core.snapshots.SwaState`` snapshot (``kvlab.server.swa`` records them), in two panels that share the
story of a sliding-window slot:

* **top, the SWA cells**: every cell of the local layers' cache, coloured by the
  token position it holds (grey: empty), with the ring's head marked. After a
  long prompt the colours show the ring's wrap-around: old positions were
  overwritten in place.
* **bottom, token positions**: what the full-attention layers hold (every
  position so far), which positions the SWA cells still cover, the batch the
  step decoded, and one row per context checkpoint with its [pos_min, pos_max]
  span (taken in this step: hatched; restored in this step: green).

``reuse=(n_past, threshold)`` draws a reuse point and the first position the
local layers need to continue there, so a figure can show *why* a checkpoint
or the ring can or cannot serve it. ``swa_animation`` (plain plotly, plays in
exported HTML) and ``swa_stepper`` (a live widget) step through a slot's
``history`` with the same axes for every step.

``swa_decision_figure(history, request)`` is the reuse rule as a picture, for a
reader who has not met the ring yet: one row for what the SWA cells hold, one
per checkpoint, the positions the continuation needs shaded, and each row's
verdict in words. The verdicts are read from the model's ``swa.reuse`` event
(which checkpoint it restored, whether it started over); the figure only says why.

Kept as one module (about 580 lines): the slot figure, its animation, its stepper and the
decision picture draw the same snapshot type with the same rows and colours.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import plotly.graph_objects as go

from kvlab.core.snapshots import EMPTY, Event, History, SwaState
from kvlab.errors import InvalidArgumentError, check_int
from kvlab.views import theme
from kvlab.views._common import (
    Spec,
    base_layout,
    check_title,
    legend_entry,
    steps_of,
    text_px,
    title_text,
    top_margin,
)
from kvlab.views.animations import DEFAULT_FRAME_MS, animate, step_caption
from kvlab.views.live import Stepper

FULL = "full-attention layers"
RING = "SWA cells cover"
BATCH = "batch decoded"

#: Bar colours and the legend's words for them.
PART_STYLES: dict[str, dict[str, Any]] = {
    "full": {"color": theme.GREY, "label": "positions the full-attention layers hold"},
    "ring": {"color": theme.BLUE, "label": "positions the SWA cells still hold"},
    "batch": {"color": theme.PURPLE, "label": "batch decoded in this step"},
    "checkpoint": {"color": theme.ORANGE, "label": "context checkpoint (copy of the SWA cells)"},
    "created": {"color": theme.VERMILLION, "label": "checkpoint taken in this step (hatched)"},
    "restored": {"color": theme.GREEN, "label": "checkpoint restored in this step"},
}
_EMPTY_CELL = theme.LIGHT_GREY
_STRIP_PX = 90
_ROW_PX = 34


def _check_swa_state(name: str, state: object) -> None:
    if not isinstance(state, SwaState):
        raise InvalidArgumentError(
            f"{name} must be a kvlab.server.swa.SwaState, got {type(state).__name__}; take one from SwaSlot(...).history"
        )


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Sorted positions as [start, end) runs of consecutive values."""
    out: list[tuple[int, int]] = []
    for p in sorted(positions):
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return out


def _cell_runs(cells: list[int]) -> list[tuple[int, int, int, int]]:
    """(first cell, last cell, first position, last position) of each run of cells holding consecutive positions."""
    out: list[list[int]] = []
    for i, p in enumerate(cells):
        if p == EMPTY:
            continue
        if out and out[-1][1] == i - 1 and out[-1][3] == p - 1:
            out[-1][1], out[-1][3] = i, p
        else:
            out.append([i, i, p, p])
    return [(a, b, c, d) for a, b, c, d in out]


def _extent(state: SwaState) -> int:
    return max(state.n_tokens, state.pos_max + 1, *(c.pos_max + 1 for c in state.checkpoints), 1)


def _check_reuse(reuse: object) -> tuple[int, int] | None:
    if reuse is None:
        return None
    if not isinstance(reuse, (tuple, list)) or len(reuse) != 2:
        raise InvalidArgumentError(f"reuse must be a pair (n_past, threshold), got {reuse!r}")
    n_past, threshold = reuse
    check_int("reuse n_past", n_past, minimum=0)
    check_int("reuse threshold", threshold, minimum=0)
    if threshold > n_past:
        raise InvalidArgumentError(f"the threshold ({threshold}) cannot lie after the reuse point ({n_past})")
    return int(n_past), int(threshold)


_Bars = dict[str, dict[str, list]]


def _axes(
    state: SwaState, x_max: int | None, checkpoint_rows: int | None, reuse: object
) -> tuple[int, int, tuple[int, int] | None]:
    """(positions on the axis, checkpoint rows, the reuse point) after checking what the caller asked for."""
    need = _extent(state)
    if x_max is None:
        x_max = need
    check_int("x_max", x_max, minimum=1)
    if checkpoint_rows is None:
        checkpoint_rows = len(state.checkpoints)
    check_int("checkpoint_rows", checkpoint_rows, minimum=0)
    if checkpoint_rows < len(state.checkpoints):
        raise InvalidArgumentError(
            f"checkpoint_rows is {checkpoint_rows}, but the state holds {len(state.checkpoints)} checkpoints"
        )
    marks = _check_reuse(reuse)
    if marks is not None:
        x_max = max(x_max, marks[0] + 1)
    return max(x_max, need), checkpoint_rows, marks


def _checkpoint_bars(state: SwaState, bar: Any) -> None:
    """One bar per checkpoint, coloured by whether this step took it, restored it, or kept it."""
    restored_at = next((i for i, c in enumerate(state.checkpoints) if c == state.restored), None)
    created_at = len(state.checkpoints) - 1 if state.created is not None and state.checkpoints else None
    for i, cp in enumerate(state.checkpoints):
        kind = "created" if i == created_at else "restored" if i == restored_at else "checkpoint"
        what = {
            "created": "taken before this batch",
            "restored": "restored in this step",
            "checkpoint": "kept",
        }[kind]
        bar(
            kind,
            f"checkpoint {i + 1}",
            cp.pos_min,
            cp.pos_max + 1,
            f"[{cp.pos_min}, {cp.pos_max}]",
            f"checkpoint {i + 1} ({what}): SWA cells for positions {cp.pos_min}..{cp.pos_max},"
            f"<br>taken when {cp.n_tokens:,} prompt tokens were processed",
        )


def _bars(state: SwaState, held: list[int]) -> _Bars:
    """The positions panel's bars by kind: what the full layers hold, the ring covers, the batch, checkpoints."""
    bars: _Bars = {k: {"x": [], "base": [], "y": [], "text": [], "hover": []} for k in PART_STYLES}

    def bar(kind: str, row: str, start: int, end: int, text: str, hover: str) -> None:
        b = bars[kind]
        b["x"].append(end - start)
        b["base"].append(start)
        b["y"].append(row)
        b["text"].append(text)
        b["hover"].append(hover)

    if state.n_tokens:
        bar(
            "full",
            FULL,
            0,
            state.n_tokens,
            f"0 … {state.n_tokens - 1}",
            f"the slot holds {state.n_tokens:,} tokens: every position in the full-attention layers",
        )
    for start, end in _runs(held):
        bar(
            "ring",
            RING,
            start,
            end,
            f"[{start}, {end - 1}]",
            f"SWA cells hold positions {start}..{end - 1} ({end - start:,} cells)",
        )
    if state.batch is not None:
        b0, b1 = state.batch
        bar(
            "batch",
            BATCH,
            b0,
            b1,
            f"[{b0}, {b1})",
            f"this step decoded positions {b0}..{b1 - 1} ({b1 - b0:,} tokens)",
        )
    _checkpoint_bars(state, bar)
    return bars


def _run_labels(cells: list[int]) -> tuple[list[float], list[str]]:
    """Runs of neighbouring cells that hold consecutive positions, labelled where the label fits.

    The strip is about ``_STRIP_TEXT_PX`` wide in a notebook (700 px, less the row labels and the
    colour bar). Every run gets the long label ("cells 305–767: positions 1073–1535") when all of
    them fit, else the short one ("1073–1535") where it fits, so the labels of one strip match.
    """
    n_cells = len(cells)
    runs = [((c0 + c1) / 2, (c1 - c0 + 1) / n_cells * _STRIP_TEXT_PX - 8, c0, c1, p0, p1)
            for c0, c1, p0, p1 in _cell_runs(cells)]  # fmt: skip
    long = [(x, room, f"cells {c0}–{c1}: positions {p0}–{p1}") for x, room, c0, c1, p0, p1 in runs]
    short = [(x, room, f"{p0}–{p1}") for x, room, _, _, p0, p1 in runs]
    fits = [(x, text) for x, room, text in long if text_px(text, 11) <= room]
    if len(fits) < len(runs):
        fits = [(x, text) for x, room, text in short if text_px(text, 11) <= room]
    return [x for x, _ in fits], [text for _, text in fits]


_STRIP_TEXT_PX = 400


def _cell_traces(state: SwaState, x_max: int) -> list[dict[str, Any]]:
    """The SWA cells (one heatmap row, coloured by position, grey where empty) and the head's marker."""
    cells = list(state.cells)
    n_cells = len(cells)
    return [{
        "type": "heatmap", "name": "SWA cells", "x": list(range(n_cells)), "y": [0],
        "z": [[None if p == EMPTY else p for p in cells]],
        "zmin": 0, "zmax": max(x_max - 1, 1), "colorscale": "Cividis", "showscale": True,
        "colorbar": {"title": {"text": "position", "side": "right"}, "len": 0.3, "y": 1, "yanchor": "top",
                     "x": 1.02, "xanchor": "left",
                     "thickness": 12},
        "hovertemplate": "cell %{x}: position %{z}<extra></extra>", "xaxis": "x2", "yaxis": "y2",
        "hoverongaps": False,
    }, {
        "type": "scatter", "mode": "markers", "name": "head", "x": [state.head % n_cells], "y": [0.62],
        "marker": {"symbol": "triangle-down", "size": 13, "color": theme.VERMILLION, "line": {"color": theme.INK,
                   "width": 1}}, "cliponaxis": False,
        "hovertemplate": "head: the next ubatch is placed from cell %{x}<extra></extra>", "showlegend": False,
        "xaxis": "x2", "yaxis": "y2",
    }]  # fmt: skip


def _bar_traces(bars: _Bars) -> list[dict[str, Any]]:
    data = []
    for kind, b in bars.items():
        style = PART_STYLES[kind]
        marker: dict[str, Any] = {"color": style["color"], "line": {"color": "white", "width": 1}}
        if kind == "created":
            marker["pattern"] = {"shape": "/", "fgcolor": theme.INK, "fgopacity": 0.45, "size": 8}
        data.append({
            "type": "bar", "orientation": "h", "name": style["label"], "x": b["x"], "base": b["base"], "y": b["y"],
            "text": b["text"], "textposition": "auto", "insidetextanchor": "middle", "cliponaxis": False,
            "insidetextfont": {"color": "white" if kind in ("ring", "restored", "batch", "full") else theme.INK},
            "outsidetextfont": {"color": theme.INK},
            "hovertext": b["hover"], "hovertemplate": "%{hovertext}<extra></extra>", "marker": marker,
            "showlegend": False, "width": 0.7, "xaxis": "x", "yaxis": "y",
        })  # fmt: skip
    return data


def _traces(
    state: SwaState, bars: _Bars, x_max: int, legend_kinds: set[str] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every trace, and the bar kinds the legend lists."""
    label_x, label_text = _run_labels(list(state.cells))
    data = _cell_traces(state, x_max) + _bar_traces(bars)
    data.append({
        "type": "scatter", "mode": "text", "name": "cell runs", "x": label_x, "y": [0] * len(label_x),
        "text": label_text, "textfont": {"size": 11, "color": "white", "shadow": "0px 0px 3px #000000, 0px 0px 2px #000000"},
        "hoverinfo": "skip",
        "showlegend": False, "xaxis": "x2", "yaxis": "y2",
    })  # fmt: skip
    if legend_kinds is None:
        legend_kinds = {k for k, b in bars.items() if b["x"]}
    shown = [k for k in PART_STYLES if k in legend_kinds]
    data.append(legend_entry("empty SWA cell (▼ marks the head: the next cell to fill)", _EMPTY_CELL))
    for kind, style in PART_STYLES.items():
        data.append(legend_entry(style["label"], style["color"], visible=kind in shown))
    return data, shown


def _reuse_shapes(
    n_cells: int, marks: tuple[int, int] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(shapes, annotations): the SWA strip's grey ground and, with ``marks``, the reuse point and the
    first position the local layers need from there, with the span between them shaded."""
    shapes: list[dict[str, Any]] = [
        {"type": "rect", "xref": "x2", "yref": "y2", "x0": -0.5, "x1": n_cells - 0.5, "y0": -0.5, "y1": 0.5,
         "fillcolor": _EMPTY_CELL, "line": {"width": 0}, "layer": "below"},
    ]  # fmt: skip
    annotations: list[dict[str, Any]] = []
    if marks is None:
        return shapes, annotations
    n_past, threshold = marks
    shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": threshold, "x1": n_past, "y0": 0,
                   "y1": _BOTTOM_TOP, "fillcolor": theme.YELLOW, "opacity": 0.35, "line": {"width": 0},
                   "layer": "below"})  # fmt: skip
    for x, dash, text, anchor in (
        (n_past, "solid", f"reuse point {n_past}", "left"),
        (threshold, "dash", f"needs from {threshold}", "right"),
    ):
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": _BOTTOM_TOP,
                       "line": {"color": theme.INK, "dash": dash, "width": 2}})  # fmt: skip
        annotations.append({"x": x, "y": _BOTTOM_TOP, "xref": "x", "yref": "paper", "text": text,
                            "showarrow": False, "xanchor": anchor, "yanchor": "bottom",
                            "font": {"size": 12}})  # fmt: skip
    return shapes, annotations


def _subtitle(state: SwaState, held: list[int], marks: tuple[int, int] | None) -> str:
    n_cp = len(state.checkpoints)
    sub = (
        f"{len(state.cells):,} SWA cells, {len(held):,} in use"
        + (f" (positions {state.pos_min}..{state.pos_max})" if held else "")
        + f"; the slot holds {state.n_tokens:,} tokens; {n_cp} checkpoint{'s' if n_cp != 1 else ''}"
    )
    if marks is not None:
        sub += f"<br>to continue at {marks[0]}, the local layers need positions {marks[1]}..{marks[0] - 1} (shaded)"
    return sub


def swa_spec(
    state: SwaState,
    previous: SwaState | None = None,
    *,
    title: str | None = None,
    caption: str | None = None,
    x_max: int | None = None,
    checkpoint_rows: int | None = None,
    reuse: tuple[int, int] | None = None,
    legend_kinds: set[str] | None = None,
) -> Spec:
    """The slot after one step as plain dicts: SWA cells on top, token positions below.

    ``x_max`` (positions on the axis) and ``checkpoint_rows`` default to what
    this state needs; the animation and the stepper pass the largest over a
    history so every step has the same axes. ``legend_kinds`` (keys of
    ``PART_STYLES``) are the bar kinds the legend lists; by default those drawn.
    """
    _check_swa_state("state", state)
    if previous is not None:
        _check_swa_state("previous", previous)
    title = check_title(title)
    caption = check_title(caption)
    x_max, checkpoint_rows, marks = _axes(state, x_max, checkpoint_rows, reuse)
    n_cells = len(state.cells)
    held = [p for p in state.cells if p != EMPTY]
    rows = [FULL, RING, BATCH] + [f"checkpoint {i + 1}" for i in range(checkpoint_rows)]
    data, shown = _traces(state, _bars(state, held), x_max, legend_kinds)
    shapes, annotations = _reuse_shapes(n_cells, marks)
    ttl = title_text(caption or title or "SWA cells and context checkpoints", _subtitle(state, held, marks))
    head_lines = ttl["text"].split("</b>")[0].count("<br>") + 1
    top = 40 + 21 * head_lines + 17 * (1 + (marks is not None)) + 20
    plot_h = _STRIP_PX + 60 + _ROW_PX * len(rows)
    bottom = 75 + 27 * ((len(shown) + 2) // 2)  # two legend entries a row
    layout = base_layout(
        ttl, barmode="overlay", height=top + plot_h + bottom, showlegend=True, shapes=shapes,
        annotations=annotations,
        legend={"orientation": "h", "y": -58 / plot_h, "x": 0, "yanchor": "top",
                "font": {"size": 12}},
        xaxis={"range": [0, x_max], "title": {"text": "token position", "standoff": 4}, "domain": [0, 1],
               "showgrid": True, "zeroline": False},
        yaxis={"domain": [0, _BOTTOM_TOP], "categoryorder": "array", "categoryarray": rows,
               "range": [len(rows) - 0.5, -0.5], "fixedrange": True, "automargin": False, "type": "category"},
        xaxis2={"domain": [0, 1], "anchor": "y2", "range": [-0.5, n_cells - 0.5], "side": "top",
                "title": {"text": f"SWA cell (of {n_cells:,})", "standoff": 2}, "showgrid": False, "zeroline": False},
        yaxis2={"domain": [_STRIP_BOTTOM, 1], "range": [-0.5, 0.9], "visible": False, "fixedrange": True},
        margin={"l": _left_margin(rows), "r": _COLORBAR_PX, "t": top, "b": bottom},
    )  # fmt: skip
    return {"data": data, "layout": layout}


def _left_margin(rows: list[str]) -> int:
    """Room for the row labels, fixed rather than plotly's automargin: an animation's frames keep the
    first frame's margins while their axes are redrawn, so automargin left bars and ticks apart."""
    return round(max(text_px(r, 13) for r in rows)) + 22


_BOTTOM_TOP = 0.7  # the positions panel takes the lower 70% of the plot
_COLORBAR_PX = 120  # a fixed right margin for the colour bar: an empty frame keeps the plot area
_STRIP_BOTTOM = 0.82


def swa_figure(
    state: SwaState, *, reuse: tuple[int, int] | None = None, title: str | None = None
) -> go.Figure:
    """Example 12: one slot's SWA cells and checkpoints; ``reuse=(n_past, threshold)`` marks a reuse point."""
    return go.Figure(swa_spec(state, title=title, reuse=reuse))


def swa_hints(history: object) -> dict[str, Any]:
    """The axes every step of ``history`` shares: positions up to the largest extent, one row per checkpoint."""
    states = [s for _, s in steps_of(history, SwaState)]
    kinds: set[str] = set()
    for s in states:
        kinds |= _kinds(s)
    return {
        "x_max": max(_extent(s) for s in states),
        "checkpoint_rows": max(len(s.checkpoints) for s in states),
        "legend_kinds": kinds,
    }


def _kinds(state: SwaState) -> set[str]:
    """The bar kinds a snapshot draws."""
    kinds = {"full"} if state.n_tokens else set()
    if state.pos_min != EMPTY:
        kinds.add("ring")
    if state.batch is not None:
        kinds.add("batch")
    if state.checkpoints:
        kinds.add("checkpoint")
    if state.created is not None:
        kinds.add("created")
    if state.restored is not None:
        kinds.add("restored")
    return kinds


def swa_animation(
    history: History[SwaState] | list, *, title: str | None = None, frame_ms: int = DEFAULT_FRAME_MS
) -> go.Figure:
    """A slot's history step by step (prompt batches, checkpoints taken and restored), with play and a slider."""
    title = check_title(title)
    steps = steps_of(history, SwaState)
    hints = swa_hints(history)
    specs = []
    for i, (caption, state) in enumerate(steps):
        head = step_caption(i, len(steps), caption)
        specs.append(swa_spec(state, caption=f"{title} · {head}" if title else head, **hints))
    return animate(specs, [c for c, _ in steps], frame_ms=frame_ms)


def swa_stepper(history: History[SwaState] | list, *, interval_ms: int = 900) -> Stepper:
    """A ``Stepper`` over a slot's history with the SWA view (needs a running kernel)."""
    steps_of(history, SwaState)
    view = partial(_stepper_view, **swa_hints(history))
    return Stepper(history, [view], interval_ms=interval_ms)


def _stepper_view(state: SwaState, previous: SwaState | None, **hints: Any) -> Spec:
    return swa_spec(state, previous, title="SWA cells and context checkpoints", **hints)


# ---------------------------------------------------------------------- the reuse rule as a picture

_YES, _NO, _IDLE = theme.GREEN, theme.VERMILLION, theme.GREY
_DECISION_ROW_PX = 44


def _reuse_step(history: object, request: object) -> tuple[SwaState, Event]:
    """The state just before request ``request`` (1 = the first) and that request's ``swa.reuse`` event."""
    if not isinstance(history, History):
        raise InvalidArgumentError(
            f"history must be a SwaSlot's history (kvlab.core.snapshots.History), got {type(history).__name__}"
        )
    request = check_int("request", request, minimum=1)
    reuse = [
        i for i, s in enumerate(history.steps) if isinstance(s.event, Event) and s.event.kind == "swa.reuse"
    ]
    if request > len(reuse):
        raise InvalidArgumentError(f"the history holds {len(reuse)} requests, got request={request}")
    at = reuse[request - 1]
    before = history.steps[at - 1].state
    _check_swa_state("the state before the request", before)
    return before, history.steps[at].event


def _verdicts(state: SwaState, event: Event) -> tuple[tuple[str, str], list[tuple[str, str]], str]:
    """((text, colour) for the SWA cells, one per checkpoint oldest first, the outcome in words)."""
    n_past, threshold = event["common_prefix"], event["threshold"]
    restored, forced = event.get("restored"), event["forced_full"]
    searched = forced or restored is not None
    if not searched:
        cells = ("✓ they hold all of them", _YES)
    elif threshold == 0:
        cells = ("✗ nothing lies below 0:<br>the server looks for a copy", _NO)
    else:
        cells = (f"✗ the oldest is {state.pos_min:,},<br>not below {threshold:,}", _NO)
    rows: list[tuple[str, str]] = []
    chosen = next((i for i, c in enumerate(state.checkpoints) if c.span == restored), None)
    for i, cp in enumerate(state.checkpoints):
        if not searched:
            rows.append(("not needed", _IDLE))
        elif chosen is not None and i < chosen:
            rows.append(("not checked:<br>a newer one serves", _IDLE))
        elif i == chosen:
            start = "at 0" if cp.pos_min == 0 else f"below {threshold:,}"
            rows.append((f"✓ ends by {n_past:,}, starts<br>{start}: restored", _YES))
        elif cp.pos_max > n_past:
            rows.append((f"✗ ends at {cp.pos_max:,},<br>after {n_past:,}", _NO))
        else:
            rows.append((f"✗ starts at {cp.pos_min:,},<br>not below {threshold:,}", _NO))
    if not searched:
        outcome = f"the SWA cells serve, cache_n {event['cache_n']:,}"
    elif restored is not None:
        outcome = f"checkpoint [{restored[0]}, {restored[1]}] serves, cache_n {event['cache_n']:,}"
    elif state.checkpoints:
        outcome = "no usable copy, start over (cache_n 0)"
    else:
        outcome = "no checkpoint to fall back on, start over (cache_n 0)"
    return cells, rows, outcome


def swa_decision_figure(
    history: History[SwaState], request: int = 2, *, title: str | None = None
) -> go.Figure:
    """Can request ``request`` continue where it shares a prefix? The rule, row by row, for one request.

    Rows: the prompt the slot holds (the full-attention layers keep all of it), the positions the
    SWA cells still hold, and each context checkpoint; the positions the local layers need to
    continue are shaded, and each row says whether it can supply them.
    """
    title = check_title(title)
    state, event = _reuse_step(history, request)
    n_past, threshold = event["common_prefix"], event["threshold"]
    if n_past == 0:
        raise InvalidArgumentError(
            f"request {request} shares nothing with the slot: there is no reuse to decide"
        )
    cells_verdict, cp_verdicts, outcome = _verdicts(state, event)
    held = [p for p in state.cells if p != EMPTY]
    rows = ["cached prompt", "SWA cells hold"] + [
        f"checkpoint {i + 1}" for i in range(len(state.checkpoints))
    ]
    x_max = max(_extent(state), n_past + 1)
    bars: list[tuple[str, int, int, str, str]] = [("cached prompt", 0, state.n_tokens, f"0 … {state.n_tokens - 1}",
                                                   theme.GREY)]  # fmt: skip
    bars += [("SWA cells hold", a, b, f"[{a}, {b - 1}]", theme.BLUE) for a, b in _runs(held)]
    bars += [(f"checkpoint {i + 1}", c.pos_min, c.pos_max + 1, f"[{c.pos_min}, {c.pos_max}]", theme.ORANGE)
             for i, c in enumerate(state.checkpoints)]  # fmt: skip
    data: list[dict[str, Any]] = [{
        "type": "bar", "orientation": "h", "y": [b[0] for b in bars], "base": [b[1] for b in bars],
        "x": [b[2] - b[1] for b in bars], "text": [b[3] for b in bars], "marker": {"color": [b[4] for b in bars]},
        "textposition": "auto", "insidetextanchor": "middle", "insidetextfont": {"color": "white"},
        "outsidetextfont": {"color": theme.INK}, "cliponaxis": False,
        "hovertemplate": "%{y}: positions %{text}<extra></extra>", "width": 0.6, "showlegend": False,
    }]  # fmt: skip
    verdicts = [("all but the local layers<br>keep every position", _IDLE), cells_verdict, *cp_verdicts]
    annotations: list[dict[str, Any]] = [
        {"x": _VERDICT_X, "xref": "paper", "y": row, "yref": "y", "text": text, "showarrow": False,
         "xanchor": "left", "align": "left", "font": {"size": 11, "color": colour}}
        for row, (text, colour) in zip(rows, verdicts, strict=True)
    ]  # fmt: skip
    bottom_y, top_y = len(rows) - 0.5, -0.75
    shapes: list[dict[str, Any]] = [
        {"type": "rect", "xref": "x", "yref": "y", "x0": threshold, "x1": n_past, "y0": bottom_y, "y1": top_y,
         "fillcolor": theme.YELLOW, "opacity": 0.45, "line": {"width": 0}, "layer": "below"},
    ]  # fmt: skip
    marks = [(n_past, "solid", f"continue at {n_past:,}", "left")]
    if threshold < n_past:
        marks.append((threshold, "dash", f"needs from {threshold:,}", "right"))
    for x, dash, text, anchor in marks:
        shapes.append({"type": "line", "xref": "x", "yref": "y", "x0": x, "x1": x, "y0": bottom_y, "y1": top_y,
                       "line": {"color": theme.INK, "dash": dash, "width": 2}})  # fmt: skip
        annotations.append({"x": x, "xref": "x", "y": top_y, "yref": "y", "text": text, "showarrow": False,
                            "xanchor": anchor, "yanchor": "bottom", "font": {"size": 11}})  # fmt: skip
    need = (
        f"to continue at {n_past:,}, the local layers need positions {threshold:,}..{n_past - 1:,} (shaded)"
        if threshold < n_past
        else "--swa-full: the SWA cells keep every position, so the server's test uses a window of 0"
    )
    ttl = title_text(title or f"Request {request} shares {n_past:,} tokens: {outcome}", need)
    top = top_margin(ttl) + 4
    plot_h = _DECISION_ROW_PX * len(rows) + 36
    layout = base_layout(
        ttl, height=top + plot_h + 50, showlegend=False, shapes=shapes, annotations=annotations,
        xaxis={"range": [0, x_max * 1.02], "title": {"text": "token position", "standoff": 4, "font": {"size": 12}},
               "domain": [0, _VERDICT_X - 0.03], "showgrid": True, "zeroline": False},
        yaxis={"categoryorder": "array", "categoryarray": rows, "range": [bottom_y, top_y - 0.4],
               "fixedrange": True, "automargin": False, "type": "category"},
        margin={"l": _left_margin(rows), "r": 10, "t": top, "b": 50},
    )  # fmt: skip
    return go.Figure({"data": data, "layout": layout})


_VERDICT_X = 0.66  # the verdicts' column starts here, in paper coordinates
