"""Animations: one plotly frame per snapshot, with a slider and play/pause, that need no kernel.

Everything lives in the figure's JSON (frames, slider steps, buttons), so an
animation plays in exported HTML, on nbviewer and on a static site, where no
Python runs. Each frame is the same view as the matching ``*_figure`` builder,
drawn with the step's caption as its title; the axes are sized for the largest
snapshot of the history so nothing jumps between frames.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from kvlab.errors import LIMITS, InvalidArgumentError
from kvlab.views import registry
from kvlab.views._common import Spec, check_ms, check_title, legend_height, steps_of, title_lines

DEFAULT_FRAME_MS = 900
# The controls sit under the legend, each on its own row: the play/pause buttons, then the slider (its
# "step N" readout, the rail, the step numbers). Rows, not side by side, so that they cannot overlap at
# any width: plotly places them at fractions of the plot's width, and buttons have a fixed size.
_BUTTONS_PX = 38
_SLIDER_PX = 78
_CONTROLS_PX = _BUTTONS_PX + _SLIDER_PX


def check_frames(count: int) -> int:
    """``count`` frames are at most ``LIMITS.frames``: each is a whole figure, built in Python and kept in the
    figure's JSON, so a history of a million steps would take hours and gigabytes. Called before any
    frame is built."""
    if count > LIMITS.frames:
        raise InvalidArgumentError(
            f"the history has {count:,} steps, more than the {LIMITS.frames:,} frames an animation draws "
            "(kvlab's limit LIMITS.frames): animate fewer steps (a slice of the history, or every n-th), or "
            "for a deliberately longer animation use kvlab.errors.raised_limits(frames=...)"
        )
    return count


def step_caption(index: int, count: int, caption: str) -> str:
    """The title a frame or the stepper shows for step ``index`` of ``count``."""
    return f"Step {index} of {count - 1}: {caption}" if count > 1 else caption


def view_specs(
    view: str, history: object, *, title: str | None = None, **options: Any
) -> tuple[list[Spec], list[str]]:
    """One spec per snapshot of ``history`` for ``view`` (a name in ``kvlab.views.registry``), and the captions."""
    record = registry.get(view)
    steps = steps_of(history, record.state_type)
    check_frames(len(steps))
    states = [s for _, s in steps]
    hints = record.hints(states)
    count = len(steps)
    heads = []
    for i, (caption, _) in enumerate(steps):
        head = step_caption(i, count, caption)
        heads.append(f"{title} · {head}" if title else head)
    hints["head_lines"] = max(title_lines(h) for h in heads)
    specs = []
    for i, state in enumerate(states):
        previous = states[i - 1] if i > 0 else None
        specs.append(record.spec(state, previous, caption=heads[i], **options, **hints))
    return specs, [c for c, _ in steps]


#: A trace key whose value is the same in every frame and larger than this (in characters of its repr)
#: is left out of the frames: the figure shows it from its first frame, and a frame only changes what it
#: carries. Names, types and legend keys always travel, so every frame still reads whole.
_SHARED_KEY_CHARS = 200
_ALWAYS_IN_FRAMES = frozenset({"type", "name", "legendgroup", "showlegend", "visible"})


def _constant_trace_keys(specs: list[Spec]) -> list[frozenset[str]]:
    """Per trace position, the large keys equal in every spec (kept once, in the figure's own data)."""
    counts = {len(s["data"]) for s in specs}
    if len(counts) != 1 or len(specs) < 2:
        return [frozenset()] * len(specs[0]["data"])
    shared = []
    for j, first in enumerate(specs[0]["data"]):
        keys = {
            k for k, v in first.items()
            if k not in _ALWAYS_IN_FRAMES and len(repr(v)) > _SHARED_KEY_CHARS
            and all(s["data"][j].get(k, _MISSING) == v for s in specs[1:])
        }  # fmt: skip
        shared.append(frozenset(keys))
    return shared


_MISSING = object()


def animate(specs: list[Spec], captions: list[str], *, frame_ms: int = DEFAULT_FRAME_MS) -> go.Figure:
    """A figure showing ``specs[0]`` with one frame per spec, a slider and play/pause buttons."""
    if not specs:
        raise InvalidArgumentError("nothing to animate: the history has no snapshots")
    check_frames(len(specs))
    frame_ms = check_ms("frame_ms", frame_ms)
    first = specs[0]
    layout = dict(first["layout"])
    # one plot area for every frame: the largest plot, the most room above and below it
    margins = [s["layout"].get("margin", {}) for s in specs]
    top = max(m.get("t", 80) for m in margins)
    bottom = max(m.get("b", 80) for m in margins)
    plot_h = max(
        s["layout"].get("height", 450) - m.get("t", 80) - m.get("b", 80)
        for s, m in zip(specs, margins, strict=True)
    )
    # the controls start under the legend, as wrapped at the narrowest width, or under the bottom margin;
    # the tallest legend of any frame, since a frame may list a mark (a highlight, an eviction) others lack
    legend = layout.get("legend") or {}
    left = float(layout.get("margin", {}).get("l", 80))
    legend_px = max(
        legend_height(s["data"], left=left, font_px=int(legend.get("font", {}).get("size", 13)),
                      traceorder=legend.get("traceorder"))
        for s in specs
    )  # fmt: skip
    while True:
        legend_top = -float(legend.get("y", 0)) * plot_h if legend.get("yanchor") == "top" else 0.0
        controls_top = (
            max(bottom, int(legend_top + legend_px + 8)) if layout.get("showlegend", True) else bottom
        )
        if controls_top + _BUTTONS_PX <= 2 * plot_h:
            break
        plot_h = (controls_top + _BUTTONS_PX) // 2 + 1  # plotly places controls at most 2 plot heights below
    height = plot_h + top + controls_top + _CONTROLS_PX
    layout.update(height=height, margin=dict(layout.get("margin", {}), t=top, b=controls_top + _CONTROLS_PX))
    if "title" in layout:
        layout["title"] = dict(layout["title"], y=1 - 10 / height)
    # layout keys that differ between frames travel with every frame
    changing = sorted({k for s in specs for k, v in s["layout"].items() if first["layout"].get(k) != v}
                      - {"height", "margin"})  # fmt: skip
    constant = _constant_trace_keys(specs)
    frames = []
    for i, spec in enumerate(specs):
        frame_layout = {k: spec["layout"].get(k) for k in changing}
        if "title" in frame_layout:
            frame_layout["title"] = dict(frame_layout["title"], y=layout["title"]["y"])
        data = [{k: v for k, v in t.items() if k not in constant[j]} for j, t in enumerate(spec["data"])]
        frames.append({"name": str(i), "data": data, "layout": frame_layout})
    buttons_y = -controls_top / plot_h
    slider_y = -(controls_top + _BUTTONS_PX) / plot_h
    step_args = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}
    layout["sliders"] = [{
        "active": 0, "x": 0, "len": 1, "xanchor": "left", "y": slider_y, "yanchor": "top",
        "pad": {"t": 0, "b": 0, "l": 0, "r": 0},
        "currentvalue": {"prefix": "step ", "visible": True, "font": {"size": 12}, "xanchor": "left"},
        "steps": [{"label": str(i), "method": "animate", "args": [[str(i)], step_args]} for i in range(len(specs))],
    }]  # fmt: skip
    play = {"frame": {"duration": frame_ms, "redraw": True}, "fromcurrent": True, "transition": {"duration": 0},
            "mode": "immediate"}  # fmt: skip
    pause = {"frame": {"duration": 0, "redraw": False}, "mode": "immediate", "transition": {"duration": 0}}
    layout["updatemenus"] = [{
        "type": "buttons", "direction": "left", "showactive": False, "x": 0, "xanchor": "left",
        "y": buttons_y, "yanchor": "top", "pad": {"t": 0, "r": 0, "l": 0, "b": 0},
        "buttons": [{"label": "▶ play", "method": "animate", "args": [None, play]},
                    {"label": "❚❚ pause", "method": "animate", "args": [[None], pause]}],
    }]  # fmt: skip
    layout["meta"] = {"kvlab_captions": list(captions)}
    return go.Figure({"data": first["data"], "layout": layout, "frames": frames})


def _animation(view: str, history: object, *, title: str | None, frame_ms: int, **options: Any) -> go.Figure:
    specs, captions = view_specs(view, history, title=check_title(title), **options)
    return animate(specs, captions, frame_ms=frame_ms)


def contiguous_animation(
    history: object, *, title: str | None = None, frame_ms: int = DEFAULT_FRAME_MS
) -> go.Figure:
    """Example 1 step by step: regions placed and released, gaps opening, refusals."""
    return _animation("contiguous", history, title=title, frame_ms=frame_ms)


def block_pool_animation(
    history: object,
    *,
    highlight: tuple[str, int] | None = None,
    title: str | None = None,
    frame_ms: int = DEFAULT_FRAME_MS,
) -> go.Figure:
    """Examples 2-5 and 7 step by step: the block grid and the block tables after every operation.

    ``highlight=(request_id, position)`` is drawn in the frames whose snapshot
    holds that token and skipped in the others.
    """
    return _animation(
        "block_pool", history, title=title, frame_ms=frame_ms, highlight=highlight, strict=False
    )


def free_queue_animation(
    history: object, *, title: str | None = None, frame_ms: int = DEFAULT_FRAME_MS
) -> go.Figure:
    """Example 7 step by step: the free queue front to back, with hits leaving and evictions marked."""
    return _animation("free_queue", history, title=title, frame_ms=frame_ms)


def radix_animation(
    history: object, *, title: str | None = None, frame_ms: int = DEFAULT_FRAME_MS
) -> go.Figure:
    """Example 8 step by step: inserts, splits, the match, locks and the eviction."""
    return _animation("radix", history, title=title, frame_ms=frame_ms)


ANIMATIONS: dict[str, Callable[..., go.Figure]] = {
    "contiguous": contiguous_animation,
    "block_pool": block_pool_animation,
    "free_queue": free_queue_animation,
    "radix": radix_animation,
}
