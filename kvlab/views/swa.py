"""Example 12's views: the SWA ring, the positions it covers, and the context checkpoints.

One figure per ``kvlab.core.snapshots.SwaState`` snapshot (``kvlab.server.swa`` records them), in two panels that share the
story of a sliding-window slot:

* **top, the SWA cells**: every cell of the local layers' cache, coloured by the
  token position it holds (grey: empty), with the ring's head marked. After a
  long prompt the colours show the ring's wrap-around: old positions were
  overwritten in place.
* **bottom, token positions**: what the full-attention layers hold (every
  position so far), which positions the SWA cells still cover, the batch the
  step decoded, and one row per context checkpoint: a faint bar for its label
  [pos_min, pos_max] and a solid one for the last ``n_swa`` positions its data
  keeps, as in the decision figure (taken in this step: hatched; restored in
  this step: green).

``reuse=(n_past, threshold)`` draws a reuse point and the server's threshold,
with the positions the local layers read to continue there (threshold + 1 to
n_past - 1) shaded, so a figure can show *why* a checkpoint or the ring can or
cannot serve it. ``swa_animation`` (plain plotly, plays in
exported HTML) and ``swa_stepper`` (a live widget) step through a slot's
``history`` with the same axes for every step.

``swa_decision_figure(history, request)`` is the reuse rule as a picture, for a
reader who has not met the ring yet: one row for what the SWA cells hold, one
per checkpoint (a faint bar for its label range, a solid one for the last ``n_swa``
positions its data keeps), the positions the continuation reads shaded, the
server's threshold dashed, and each row's verdict in words. The verdicts are read from the model's ``swa.reuse`` event
(which checkpoint it restored, whether it started over); the figure only says why.

Kept as one module (about 800 lines): the slot figure, its animation, its stepper and the
decision picture draw the same snapshot type with the same rows and colours.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import plotly.graph_objects as go

from kvlab.core.snapshots import EMPTY, Checkpoint, Event, History, SwaState
from kvlab.errors import LIMITS, InvalidArgumentError, brief, check_bool, check_int, check_items, check_size
from kvlab.views import theme
from kvlab.views._common import (
    LABEL_WIDTH,
    Spec,
    base_layout,
    check_title,
    legend_entry,
    steps_of,
    text_px,
    title_text,
    top_margin,
)
from kvlab.views.animations import DEFAULT_FRAME_MS, animate, check_frames, step_caption
from kvlab.views.live import Stepper

FULL = "full-attention layers"
RING = "SWA cells hold"
BATCH = "batch decoded"

#: Bar colours and the legend's words for them.
PART_STYLES: dict[str, dict[str, Any]] = {
    "full": {"color": theme.GREY, "label": "positions the full-attention layers hold"},
    "ring": {"color": theme.BLUE, "label": "positions the SWA cells still hold"},
    "batch": {"color": theme.PURPLE, "label": "batch decoded in this step"},
    "checkpoint": {
        "color": theme.ORANGE,
        "label": "context checkpoint (copy of the SWA cells): faint, its label; solid, the data it keeps",
    },
    "created": {"color": theme.VERMILLION, "label": "checkpoint taken in this step (hatched)"},
    "restored": {"color": theme.GREEN, "label": "checkpoint restored in this step"},
}
_EMPTY_CELL = theme.LIGHT_GREY
_FAINT = 0.3  # a checkpoint's label range; its kept data is drawn solid over it
_WHITE_TEXT = ("ring", "restored", "batch", "full")
_STRIP_PX = 90
_ROW_PX = 34


_FROM_SLOT = "take one from SwaSlot(...).history"


def _positions(name: str, values: tuple[object, ...], *, empty: bool) -> None:
    """Plain ints that are token positions (0 .. LIMITS.tokens), or EMPTY where ``empty`` allows it."""
    low, high = (EMPTY if empty else 0), LIMITS.tokens
    if not all(type(v) is int and low <= v <= high for v in values):  # type: ignore[operator]
        raise InvalidArgumentError(
            f"{name} must hold token positions {low}..{LIMITS.tokens:,} as plain ints, got {brief(values)}; {_FROM_SLOT}"
        )


def _check_checkpoint(name: str, cp: object) -> None:
    if not isinstance(cp, Checkpoint):
        raise InvalidArgumentError(f"{name} must be a Checkpoint, got {brief(cp)}; {_FROM_SLOT}")
    _positions(name, (cp.pos_min, cp.pos_max, cp.n_tokens), empty=False)
    if cp.pos_min > cp.pos_max:
        raise InvalidArgumentError(
            f"{name} spans [{cp.pos_min}, {cp.pos_max}]: pos_min must not pass pos_max"
        )


def _check_swa_state(name: str, state: object) -> None:
    """Every field of ``state`` the views draw (a hand-built one too): plain ints in range, the right types."""
    if not isinstance(state, SwaState):
        raise InvalidArgumentError(
            f"{name} must be a kvlab.server.swa.SwaState, got {type(state).__name__}; {_FROM_SLOT}"
        )
    cells = state.cells
    if type(cells) is not tuple or not cells:
        raise InvalidArgumentError(f"{name}.cells must be a non-empty tuple of positions, got {brief(cells)}")
    check_size(f"the number of {name}.cells", len(cells), "tokens", minimum=1)
    _positions(f"{name}.cells", cells, empty=True)
    check_int(f"{name}.head", state.head, minimum=0, maximum=len(cells) - 1)
    _positions(f"{name}.n_tokens", (state.n_tokens,), empty=False)
    if type(state.checkpoints) is not tuple:
        raise InvalidArgumentError(
            f"{name}.checkpoints must be a tuple of Checkpoint, got {brief(state.checkpoints)}"
        )
    for i, cp in enumerate(check_items(f"{name}.checkpoints", state.checkpoints)):
        _check_checkpoint(f"{name}.checkpoints[{i}]", cp)
    for field in ("created", "restored"):
        if getattr(state, field) is not None:
            _check_checkpoint(f"{name}.{field}", getattr(state, field))
    batch = state.batch
    if batch is not None:
        if type(batch) is not tuple or len(batch) != 2:
            raise InvalidArgumentError(
                f"{name}.batch must be None or a pair (start, end), got {brief(batch)}"
            )
        _positions(f"{name}.batch", batch, empty=False)
        if batch[0] > batch[1]:
            raise InvalidArgumentError(f"{name}.batch {batch} ends before it starts")


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
        raise InvalidArgumentError(f"reuse must be a pair (n_past, threshold), got {brief(reuse)}")
    n_past, threshold = check_items("reuse", reuse, what="a pair (n_past, threshold)")
    n_past = check_size("reuse n_past", n_past, "tokens")
    threshold = check_size("reuse threshold", threshold, "tokens")
    if threshold > n_past:
        raise InvalidArgumentError(f"the threshold ({threshold}) cannot lie after the reuse point ({n_past})")
    return n_past, threshold


_Bars = dict[str, dict[str, list]]


def _axes(
    state: SwaState, x_max: int | None, checkpoint_rows: int | None, reuse: object
) -> tuple[int, int, tuple[int, int] | None]:
    """(positions on the axis, checkpoint rows, the reuse point) after checking what the caller asked for."""
    need = _extent(state)
    if x_max is None:
        x_max = need
    x_max = check_size("x_max", x_max, "tokens", minimum=1)
    if checkpoint_rows is None:
        checkpoint_rows = len(state.checkpoints)
    checkpoint_rows = check_int("checkpoint_rows", checkpoint_rows, minimum=0, maximum=LIMITS.drawn_blocks)
    if checkpoint_rows < len(state.checkpoints):
        raise InvalidArgumentError(
            f"checkpoint_rows is {checkpoint_rows}, but the state holds {len(state.checkpoints)} checkpoints"
        )
    marks = _check_reuse(reuse)
    if marks is not None:
        x_max = max(x_max, marks[0] + 1)
    return max(x_max, need), checkpoint_rows, marks


def _checkpoint_bars(state: SwaState, bar: Any, n_swa: int) -> None:
    """Two bars per checkpoint, coloured by whether this step took it, restored it, or kept it: a faint
    one for its label range and a solid one for the data it keeps (the decision figure's convention)."""
    restored_at = next((i for i, c in enumerate(state.checkpoints) if c == state.restored), None)
    created_at = len(state.checkpoints) - 1 if state.created is not None and state.checkpoints else None
    for i, cp in enumerate(state.checkpoints):
        kind = "created" if i == created_at else "restored" if i == restored_at else "checkpoint"
        what = {
            "created": "taken before this batch",
            "restored": "restored in this step",
            "checkpoint": "kept",
        }[kind]
        row, kept_from = f"checkpoint {i + 1}", _checkpoint_data_from(cp, n_swa)
        # the data first: the faint label bar and its text go on top (the same colour over itself shows no change)
        bar(
            kind,
            row,
            kept_from,
            cp.pos_max + 1,
            "",
            f"checkpoint {i + 1}: data kept, positions {kept_from}..{cp.pos_max} (its last {n_swa});"
            "<br>a restore puts back only these",
        )
        bar(
            kind,
            row,
            cp.pos_min,
            cp.pos_max + 1,
            f"[{cp.pos_min}, {cp.pos_max}]",
            f"checkpoint {i + 1} ({what}): label [{cp.pos_min}, {cp.pos_max}], the SWA cells it copied,"
            f"<br>taken when {cp.n_tokens:,} prompt tokens were processed",
            faint=True,
        )


def _bars(state: SwaState, held: list[int], n_swa: int) -> _Bars:
    """The positions panel's bars by kind: what the full layers hold, the ring covers, the batch, checkpoints."""
    bars: _Bars = {
        k: {"x": [], "base": [], "y": [], "text": [], "hover": [], "opacity": [], "ink": []}
        for k in PART_STYLES
    }

    def bar(kind: str, row: str, start: int, end: int, text: str, hover: str, *, faint: bool = False) -> None:
        b = bars[kind]
        b["x"].append(end - start)
        b["base"].append(start)
        b["y"].append(row)
        b["text"].append(text)
        b["hover"].append(hover)
        b["opacity"].append(_FAINT if faint else 1.0)
        b["ink"].append(theme.INK if faint or kind not in _WHITE_TEXT else "white")

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
    _checkpoint_bars(state, bar, n_swa)
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
        marker: dict[str, Any] = {
            "color": style["color"], "opacity": b["opacity"], "line": {"color": "white", "width": 1},
        }  # fmt: skip
        if kind == "created":
            marker["pattern"] = {"shape": "/", "fgcolor": theme.INK, "fgopacity": 0.45, "size": 8}
        data.append({
            "type": "bar", "orientation": "h", "name": style["label"], "x": b["x"], "base": b["base"], "y": b["y"],
            "text": b["text"], "textposition": "auto", "insidetextanchor": "middle", "cliponaxis": False,
            "insidetextfont": {"color": b["ink"]},
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
    server's threshold, with the positions the local layers read between them shaded."""
    shapes: list[dict[str, Any]] = [
        {"type": "rect", "xref": "x2", "yref": "y2", "x0": -0.5, "x1": n_cells - 0.5, "y0": -0.5, "y1": 0.5,
         "fillcolor": _EMPTY_CELL, "line": {"width": 0}, "layer": "below"},
    ]  # fmt: skip
    annotations: list[dict[str, Any]] = []
    if marks is None:
        return shapes, annotations
    n_past, threshold = marks
    window_from = min(threshold + 1, n_past)
    shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": window_from, "x1": n_past, "y0": 0,
                   "y1": _BOTTOM_TOP, "fillcolor": theme.YELLOW, "opacity": 0.35, "line": {"width": 0},
                   "layer": "below"})  # fmt: skip
    for x, dash, text, anchor in (
        (n_past, "solid", f"continue at {n_past:,}", "left"),
        (threshold, "dash", f"threshold {threshold:,}", "right" if threshold > 0 else "left"),
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
        n_past, threshold = marks
        sub += (
            f"<br>to continue at {n_past:,}, the local layers read positions {min(threshold + 1, n_past):,}.."
            f"{n_past - 1:,} (shaded); the server's threshold is {threshold:,} (dashed)"
        )
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
    n_swa: int = 128,
) -> Spec:
    """The slot after one step as plain dicts: SWA cells on top, token positions below.

    ``x_max`` (positions on the axis) and ``checkpoint_rows`` default to what
    this state needs; the animation and the stepper pass the largest over a
    history so every step has the same axes. ``legend_kinds`` (keys of
    ``PART_STYLES``) are the bar kinds the legend lists; by default those drawn. ``n_swa`` is the
    model's window (128 on the lesson's model): a checkpoint's data keeps its last ``n_swa`` positions.
    """
    _check_swa_state("state", state)
    if previous is not None:
        _check_swa_state("previous", previous)
    title = check_title(title)
    caption = check_title(caption)
    n_swa = check_size("n_swa", n_swa, "tokens", minimum=1)
    x_max, checkpoint_rows, marks = _axes(state, x_max, checkpoint_rows, reuse)
    n_cells = len(state.cells)
    held = [p for p in state.cells if p != EMPTY]
    rows = [FULL, RING, BATCH] + [f"checkpoint {i + 1}" for i in range(checkpoint_rows)]
    data, shown = _traces(state, _bars(state, held, n_swa), x_max, legend_kinds)
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
    state: SwaState, *, reuse: tuple[int, int] | None = None, title: str | None = None, n_swa: int = 128
) -> go.Figure:
    """Example 12: one slot's SWA cells and checkpoints; ``reuse=(n_past, threshold)`` marks a reuse point."""
    return go.Figure(swa_spec(state, title=title, reuse=reuse, n_swa=n_swa))


def swa_hints(history: object) -> dict[str, Any]:
    """The axes every step of ``history`` shares: positions up to the largest extent, one row per checkpoint."""
    states = [s for _, s in steps_of(history, SwaState)]
    for i, state in enumerate(states):
        _check_swa_state(f"step {i}", state)
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
    history: History[SwaState] | list,
    *,
    title: str | None = None,
    frame_ms: int = DEFAULT_FRAME_MS,
    n_swa: int = 128,
) -> go.Figure:
    """A slot's history step by step (prompt batches, checkpoints taken and restored), with play and a slider."""
    title = check_title(title)
    n_swa = check_size("n_swa", n_swa, "tokens", minimum=1)
    steps = steps_of(history, SwaState)
    check_frames(len(steps))
    hints = swa_hints(history)
    specs = []
    for i, (caption, state) in enumerate(steps):
        head = step_caption(i, len(steps), caption)
        specs.append(swa_spec(state, caption=f"{title} · {head}" if title else head, n_swa=n_swa, **hints))
    return animate(specs, [c for c, _ in steps], frame_ms=frame_ms)


def swa_stepper(history: History[SwaState] | list, *, interval_ms: int = 900, n_swa: int = 128) -> Stepper:
    """A ``Stepper`` over a slot's history with the SWA view (needs a running kernel)."""
    steps_of(history, SwaState)
    n_swa = check_size("n_swa", n_swa, "tokens", minimum=1)
    view = partial(_stepper_view, n_swa=n_swa, **swa_hints(history))
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
        raise InvalidArgumentError(f"the history holds {len(reuse)} requests, got request={brief(request)}")
    at = reuse[request - 1]
    if at == 0:
        raise InvalidArgumentError(
            f"request {request}'s swa.reuse event is the history's first step: there is no state before it "
            "to decide on; pass a SwaSlot's own history"
        )
    before = history.steps[at - 1].state
    _check_swa_state("the state before the request", before)
    return before, _check_reuse_event(history.steps[at].event)


def _check_reuse_event(event: Event) -> Event:
    """A ``swa.reuse`` event's fields, as ``SwaSlot`` writes them: the figure trusts nothing else."""
    fields = check_items("the swa.reuse event's fields", event.fields, what="(name, value) pairs")
    if not all(type(f) is tuple and len(f) == 2 and type(f[0]) is str for f in fields):
        raise InvalidArgumentError(
            f"the swa.reuse event's fields must be (name, value) pairs, got {brief(fields)}"
        )
    given = dict(fields)
    missing = [k for k in ("common_prefix", "threshold", "forced_full", "cache_n") if k not in given]
    if missing:
        raise InvalidArgumentError(
            f"the swa.reuse event lacks {', '.join(missing)}: take the history from a SwaSlot, which records them"
        )
    n_past = check_size("the event's common_prefix", given["common_prefix"], "tokens")
    threshold = check_int("the event's threshold", given["threshold"], minimum=0, maximum=n_past)
    cache_n = check_int("the event's cache_n", given["cache_n"], minimum=0, maximum=n_past)
    forced = check_bool("the event's forced_full", given["forced_full"])
    restored = given.get("restored")
    if restored is not None:
        if type(restored) is not tuple or len(restored) != 2:
            raise InvalidArgumentError(
                f"the event's restored must be None or a span (pos_min, pos_max), got {brief(restored)}"
            )
        _positions("the event's restored span", restored, empty=False)
    return Event.of(
        "swa.reuse",
        common_prefix=n_past,
        threshold=threshold,
        forced_full=forced,
        restored=restored,
        cache_n=cache_n,
    )


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
            again = f"; computes<br>{cp.pos_max:,} to {n_past - 1:,} again" if cp.pos_max < n_past else ""
            rows.append((f"✓ ends by {n_past:,}, starts<br>{start}: restored{again}", _YES))
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
    history: History[SwaState], request: int = 2, *, n_swa: int = 128, title: str | None = None
) -> go.Figure:
    """Can request ``request`` continue where it shares a prefix? The rule, row by row, for one request.

    Rows: the prompt the slot holds (the full-attention layers keep all of it), the positions the
    SWA cells still hold, and each context checkpoint, drawn twice: a faint bar for its label
    ``[pos_min, pos_max]`` and a solid one for the data it keeps, its last ``n_swa`` positions (a
    restore puts back only those). The positions the local layers read to continue (``p - n_swa + 1``
    to ``p - 1``, the window being the token itself and the ``n_swa - 1`` before it) are shaded, the
    server's threshold is dashed, and each row says whether it can supply them. ``n_swa`` is the
    model's window: 128 on the lesson's model and in kvlab's ``SwaConfig``.
    """
    title = check_title(title)
    n_swa = check_size("n_swa", n_swa, "tokens", minimum=1)
    state, event = _reuse_step(history, request)
    n_past, threshold = event["common_prefix"], event["threshold"]
    if n_past == 0:
        raise InvalidArgumentError(
            f"request {request} shares nothing with the slot: there is no reuse to decide"
        )
    cells_verdict, cp_verdicts, outcome = _verdicts(state, event)
    held = [p for p in state.cells if p != EMPTY]
    rows = [FULL, RING] + [f"checkpoint {i + 1}" for i in range(len(state.checkpoints))]
    swa_full = threshold >= n_past  # the server tests with a window of 0
    window_from = n_past if swa_full else max(0, n_past - n_swa + 1)
    x_max = max(_extent(state), n_past + 1)
    x_hi = x_max * 1.02
    px = _decision_px_per_position(rows, x_hi)
    lines = [n_past] + ([] if swa_full else [threshold])
    bars = [_DecisionBar(FULL, 0, state.n_tokens, theme.GREY, 1.0, f"positions 0 … {state.n_tokens - 1}")]
    labels = [(FULL, 0, state.n_tokens, f"0 … {state.n_tokens - 1}")]
    for a, b in _runs(held):
        bars.append(_DecisionBar(RING, a, b, theme.BLUE, 1.0, f"positions {a} … {b - 1}"))
        labels.append((RING, a, b, f"[{a}, {b - 1}]"))
    restored = event.get("restored")
    for i, cp in enumerate(state.checkpoints):
        row, kept_from = f"checkpoint {i + 1}", _checkpoint_data_from(cp, n_swa)
        label = f"label [{cp.pos_min}, {cp.pos_max}]: the cells it copied"
        bars.append(_DecisionBar(row, cp.pos_min, cp.pos_max + 1, theme.ORANGE, 0.3, label))
        data = f"data kept: positions {kept_from} … {cp.pos_max} (its last {n_swa})"
        bars.append(_DecisionBar(row, kept_from, cp.pos_max + 1, theme.ORANGE, 1.0, data))
        if cp.span == restored and cp.pos_max < n_past:
            again = f"computed again: positions {cp.pos_max} … {n_past - 1}"
            bars.append(_DecisionBar(row, cp.pos_max, n_past, theme.GREEN, 1.0, again, "/"))
        labels.append((row, cp.pos_min, cp.pos_max + 1, f"[{cp.pos_min}, {cp.pos_max}]"))
    data_traces: list[dict[str, Any]] = [{
        "type": "bar", "orientation": "h", "y": [b.row for b in bars], "base": [b.start for b in bars],
        "x": [b.end - b.start for b in bars], "hovertext": [b.hover for b in bars], "hoverinfo": "text",
        "marker": {"color": [b.colour for b in bars], "opacity": [b.opacity for b in bars],
                   "pattern": {"shape": [b.pattern for b in bars], "fgcolor": theme.INK, "fgopacity": 0.6}},
        "width": 0.6, "showlegend": False,
    }]  # fmt: skip
    verdicts = [("the full-attention layers<br>hold all of it", _IDLE), cells_verdict, *cp_verdicts]
    annotations: list[dict[str, Any]] = [
        {"x": _VERDICT_X, "xref": "paper", "y": row, "yref": "y", "text": text, "showarrow": False,
         "xanchor": "left", "align": "left", "font": {"size": 11, "color": colour}}
        for row, (text, colour) in zip(rows, verdicts, strict=True)
    ]  # fmt: skip
    for row, start, end, text in labels:
        x, anchor = _label_place(start, end, text, lines, px, x_hi)
        annotations.append({"x": x, "xref": "x", "y": row, "yref": "y", "text": text, "showarrow": False,
                            "xanchor": anchor, "font": {"size": 11, "color": theme.INK},
                            "bgcolor": "rgba(255,255,255,0.8)", "borderpad": 1})  # fmt: skip
    bottom_y, top_y = len(rows) - 0.5, -0.75
    shapes: list[dict[str, Any]] = [
        {"type": "rect", "xref": "x", "yref": "y", "x0": window_from, "x1": n_past, "y0": bottom_y, "y1": top_y,
         "fillcolor": theme.YELLOW, "opacity": 0.45, "line": {"width": 0}, "layer": "below"},
    ]  # fmt: skip
    marks = [(n_past, "solid", f"continue at {n_past:,}", "left")]
    if not swa_full:
        marks.append((threshold, "dash", f"threshold {threshold:,}", "right" if threshold > 0 else "left"))
    for x, dash, text, anchor in marks:
        shapes.append({"type": "line", "xref": "x", "yref": "y", "x0": x, "x1": x, "y0": bottom_y, "y1": top_y,
                       "line": {"color": theme.INK, "dash": dash, "width": 2}})  # fmt: skip
        annotations.append({"x": x, "xref": "x", "y": top_y, "yref": "y", "text": text, "showarrow": False,
                            "xanchor": anchor, "yanchor": "bottom", "font": {"size": 11}})  # fmt: skip
    need = (
        f"to continue at {n_past:,}, the local layers read positions {window_from:,}..{n_past - 1:,} (shaded); "
        f"the server's test uses the threshold {threshold:,} (dashed)"
        if not swa_full
        else "--swa-full: the SWA cells keep every position, so the server's test uses a window of 0"
    )
    ttl = title_text(title or f"Request {request} shares {n_past:,} tokens: {outcome}", need)
    top = top_margin(ttl) + 4
    plot_h = _DECISION_ROW_PX * len(rows) + 36
    layout = base_layout(
        ttl, height=top + plot_h + 50, showlegend=False, shapes=shapes, annotations=annotations,
        barmode="overlay",
        xaxis={"range": [0, x_hi], "title": {"text": "token position", "standoff": 4, "font": {"size": 12}},
               "domain": [0, _VERDICT_X - 0.03], "showgrid": True, "zeroline": False},
        yaxis={"categoryorder": "array", "categoryarray": rows, "range": [bottom_y, top_y - 0.4],
               "fixedrange": True, "automargin": False, "type": "category"},
        margin={"l": _left_margin(rows), "r": _DECISION_RIGHT_PX, "t": top, "b": 50},
    )  # fmt: skip
    return go.Figure({"data": data_traces, "layout": layout})


@dataclass(frozen=True)
class _DecisionBar:
    """One bar of the decision figure: positions [start, end) on ``row``."""

    row: str
    start: int
    end: int
    colour: str
    opacity: float
    hover: str
    pattern: str = ""


def _checkpoint_data_from(checkpoint: Checkpoint, n_swa: int) -> int:
    """The oldest position a checkpoint's data keeps: its last ``n_swa`` positions, never before its pos_min.

    llama.cpp 0c1e57098 saves only the cells a window can still reach, so a restore puts back
    ``pos_max - n_swa + 1`` .. ``pos_max``, whatever the label's ``pos_min`` says.
    """
    return max(checkpoint.pos_min, checkpoint.pos_max - n_swa + 1)


def _decision_px_per_position(rows: list[str], x_hi: float) -> float:
    """Pixels per token position on the decision figure's axis, at the width labels are fitted for."""
    plot_px = LABEL_WIDTH - _left_margin(rows) - _DECISION_RIGHT_PX
    return plot_px * (_VERDICT_X - 0.03) / x_hi


def _label_span(x: float, anchor: str, text: str, px_per_position: float) -> tuple[float, float]:
    """The positions a bar label covers on the decision figure's axis, a little padding included."""
    width = (text_px(text, 11) + 2 * _LABEL_PAD_PX) / px_per_position
    low = {"left": x, "center": x - width / 2, "right": x - width}[anchor]
    return low, low + width


def _label_place(
    start: int, end: int, text: str, lines: list[int], px: float, x_hi: float
) -> tuple[float, str]:
    """Where a bar's label goes: inside the bar if it fits, else beside it, never across a vertical line."""
    inside = [((start + end) / 2, "center"), (start, "left"), (end, "right")]
    gap = 2 / px  # two pixels clear of a line
    beside = [(end, "left"), (start, "right")]
    beside += sorted(((line + gap, "left") for line in lines), key=lambda c: abs(c[0] - end))
    beside += sorted(((line - gap, "right") for line in lines), key=lambda c: abs(c[0] - start))
    for i, (x, anchor) in enumerate(inside + beside):
        low, high = _label_span(x, anchor, text, px)
        if low < 0 or high > x_hi or (i < len(inside) and (low < start or high > end)):
            continue
        if not any(low <= line <= high for line in lines):
            return x, anchor
    return (start + end) / 2, "center"


_VERDICT_X = 0.66  # the verdicts' column starts here, in paper coordinates
_DECISION_RIGHT_PX = 10
_LABEL_PAD_PX = 4
