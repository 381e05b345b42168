"""Example 1's view: a contiguous KV pool as one strip of slots.

Each region is drawn as the slots that store KV and the slots it reserved but
does not use (internal fragmentation, hatched); the free gaps between regions
(external fragmentation) are drawn too. The region list and the gaps come from
the ``ContiguousState`` snapshot (``kvlab.models.contiguous``); this module
only places them.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from kvlab.core.snapshots import ContiguousState
from kvlab.views import theme
from kvlab.views._common import (
    LABEL_WIDTH,
    Spec,
    base_layout,
    check_state,
    check_title,
    legend_height,
    text_px,
    title_text,
    top_margin,
)
from kvlab.views.text import plural

_Parts = dict[str, dict[str, list]]
_Labels = tuple[list[float], list[str], list[str]]


def _fit_label(full: str, size: int, pool: int, *, short: str) -> str:
    """The full label where the bar is wide enough for it, a short one where only that fits, else nothing.

    Widths are judged in a figure ``LABEL_WIDTH`` px wide (11 px text).
    """
    room = (size / pool if pool else 0) * (LABEL_WIDTH - 60) - 6
    if max(text_px(line, 11) for line in full.split("<br>")) <= room:
        return full
    if text_px(short, 11) <= room:
        return short
    return ""


def _parts(state: ContiguousState) -> tuple[_Parts, _Labels]:
    """The bars of every kind (stores KV, reserved unused, free gap) and the labels on them."""
    pool = state.pool_size
    parts: _Parts = {name: {"x": [], "base": [], "hover": []} for name in theme.REGION_COLORS}
    labels_x: list[float] = []
    labels_text: list[str] = []
    labels_color: list[str] = []
    for r in state.regions:
        used = parts["stores KV"]
        used["x"].append(r.used)
        used["base"].append(r.start)
        used["hover"].append(
            f"<b>{r.owner}</b> [{r.start}, {r.end})<br>{r.used:,} of {r.size:,} slots hold KV"
        )
        spare = parts["reserved, unused"]
        spare["x"].append(r.size - r.used)
        spare["base"].append(r.start + r.used)
        spare["hover"].append(
            f"<b>{r.owner}</b>: {r.size - r.used:,} slots reserved but unused<br>(internal fragmentation)"
        )
        # the label sits on the larger part of the region, in a colour readable there
        on_used = 2 * r.used >= r.size
        part = r.used if on_used else r.size - r.used
        labels_x.append(r.start + r.used / 2 if on_used else r.start + r.used + part / 2)
        labels_text.append(_fit_label(f"{r.owner}<br>{r.used:,}/{r.size:,}", part, pool, short=r.owner))
        labels_color.append("white" if on_used else theme.INK)
    for start, size in state.gaps:
        gap = parts["free gap"]
        gap["x"].append(size)
        gap["base"].append(start)
        gap["hover"].append(f"free gap [{start}, {start + size}): {plural(size, 'slot')}")
        labels_x.append(start + size / 2)
        labels_text.append(_fit_label(f"gap<br>{size:,}", size, pool, short=f"{size:,}"))
        labels_color.append(theme.INK)
    return parts, (labels_x, labels_text, labels_color)


def _traces(parts: _Parts, labels: _Labels) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = []
    for name, part in parts.items():
        bar = {
            "type": "bar", "orientation": "h", "name": name, "x": part["x"], "base": part["base"],
            "y": [0] * len(part["x"]), "width": 0.6, "hovertext": part["hover"],
            "hovertemplate": "%{hovertext}<extra></extra>",
            "marker": {"color": theme.REGION_COLORS[name], "line": {"color": "white", "width": 1}},
            "showlegend": True,
        }  # fmt: skip
        if name == "reserved, unused":
            bar["marker"]["pattern"] = {"shape": "/", "fgcolor": theme.INK, "fgopacity": 0.35, "size": 8}
        data.append(bar)
    labels_x, labels_text, labels_color = labels
    data.append({
        "type": "scatter", "mode": "text", "x": labels_x, "y": [0] * len(labels_x), "text": labels_text,
        "textfont": {"size": 11, "color": labels_color}, "hoverinfo": "skip", "showlegend": False, "name": "labels",
    })  # fmt: skip
    return data


def _subtitle(state: ContiguousState) -> str:
    pool = state.pool_size
    gaps = state.gaps
    free = pool - state.reserved
    largest = max((s for _, s in gaps), default=0)
    where = f"{free:,} free in {plural(len(gaps), 'gap')}, largest {largest:,}" if gaps else "no slot free"
    verb = "reserves" if len(state.regions) == 1 else "reserve"
    sub = (f"{plural(len(state.regions), 'region')} {verb} {state.reserved:,} of {pool:,} slots; "
           f"{state.stored:,} hold KV ({100 * state.stored / pool:.1f}% of the pool); {where}")  # fmt: skip
    if state.rejected:
        sub += f"<br>refused so far: {', '.join(state.rejected)}"
    return sub


def contiguous_spec(
    state: ContiguousState,
    previous: ContiguousState | None = None,
    *,
    title: str | None = None,
    caption: str | None = None,
    head_lines: int = 0,
    sub_lines: int = 0,
) -> Spec:
    """The pool as one strip of slots: what each region stores, what it reserved but does not use, the gaps.

    ``head_lines``/``sub_lines`` (as in every ``*_spec``) reserve room for that
    many title and subtitle lines, so the steps of a stepper share one plot area.
    """
    check_state("state", state, ContiguousState)
    data = _traces(*_parts(state))
    ttl = title_text(caption or title or "Contiguous KV pool", _subtitle(state))
    top = top_margin(ttl, False, head_lines, sub_lines)
    plot_h, legend_top = 110, 58  # the legend sits under the slot axis and its title
    bottom = legend_top + legend_height(data, left=30, font_px=13) + 8
    layout = base_layout(
        ttl,
        barmode="overlay", height=plot_h + top + bottom, showlegend=True,
        legend={"orientation": "h", "y": -legend_top / plot_h, "x": 0, "yanchor": "top"},
        xaxis={"range": [0, state.pool_size], "title": {"text": "slot", "standoff": 2}, "showgrid": False,
               "zeroline": False, "tickformat": ",d"},
        yaxis={"visible": False, "range": [-0.6, 0.6], "fixedrange": True},
        margin={"l": 30, "r": 30, "t": top, "b": bottom},
    )  # fmt: skip
    return {"data": data, "layout": layout}


def contiguous_figure(state: ContiguousState, *, title: str | None = None) -> go.Figure:
    """Example 1: a contiguous pool with its regions, the reserved-but-unused slots and the free gaps."""
    return go.Figure(contiguous_spec(state, title=check_title(title)))
