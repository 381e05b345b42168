"""Notebook 16's routing comparison: each replica's load and hit rate, one group of bars per router.

It draws ``kvlab.lessons.capstone.RoutingResult`` records (or anything with ``name``, ``requests``
and ``replica_hit_rates``) as they are; it computes nothing the fleet model would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from kvlab.errors import InvalidArgumentError, brief
from kvlab.views import theme
from kvlab.views._common import chart_layout, check_title, title_text

_COLORS = (theme.BLUE, theme.VERMILLION, theme.GREEN, theme.ORANGE, theme.PURPLE, theme.SKY_BLUE)
MAX_ROUTERS = len(_COLORS)


def _rows(results: object) -> list[tuple[str, list[int], list[float]]]:
    if isinstance(results, (str, bytes)) or not isinstance(results, Sequence) or not results:
        raise InvalidArgumentError(
            f"results must be a non-empty list of routing results, got {brief(results)}"
        )
    if len(results) > MAX_ROUTERS:
        raise InvalidArgumentError(f"at most {MAX_ROUTERS} routers fit one figure, got {len(results)}")
    rows = []
    for i, r in enumerate(results):
        name = getattr(r, "name", None)
        requests = getattr(r, "requests", None)
        rates = getattr(r, "replica_hit_rates", None)
        if type(name) is not str or not isinstance(requests, tuple) or not isinstance(rates, tuple):
            raise InvalidArgumentError(
                f"results[{i}] is not a routing result (route_fleet's), got {brief(r)}"
            )
        if len(requests) != len(rates) or not requests or len(requests) > 64:
            raise InvalidArgumentError(f"results[{i}] must give 1 to 64 replicas, each a load and a hit rate")
        if not all(type(n) is int and n >= 0 for n in requests) or not all(
            isinstance(x, float) and 0.0 <= x <= 1.0 for x in rates
        ):
            raise InvalidArgumentError(f"results[{i}]: requests must be counts and hit rates fractions 0..1")
        rows.append((name, list(requests), list(rates)))
    return rows


def _panel(
    i: int, rows: list[tuple[str, list[int], list[float]]], x0: float, width: float
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(bars, axes, caption) of panel ``i``: 0 the requests per replica, 1 the hit rate per replica."""
    ax = "" if i == 0 else "2"
    data = []
    for (name, requests, rates), color in zip(rows, _COLORS, strict=False):
        labels = [str(k) for k in range(len(requests))]  # the axis title says "replica"
        if i == 0:
            ys, hover = requests, "replica %{x}: %{y} requests"
        else:  # a replica that served nothing has no hit rate: no bar
            ys = [100 * r if n else None for n, r in zip(requests, rates, strict=True)]
            hover = "replica %{x}: %{y:.1f}% of prompt tokens from the cache"
        data.append({
            "type": "bar", "x": labels, "y": ys, "name": name, "legendgroup": name, "showlegend": i == 0,
            "marker": {"color": color}, "xaxis": f"x{ax}", "yaxis": f"y{ax}",
            "hovertemplate": f"{hover}<extra>{name}</extra>",
        })  # fmt: skip
    y_axis: dict[str, Any] = {"anchor": f"x{ax}", "rangemode": "tozero", "title": {"text": "requests"}}
    if i == 1:
        y_axis = {
            "anchor": "x2",
            "range": [0, 100],
            "ticksuffix": "%",
            "title": {"text": "% of prompt tokens"},
        }
    axes = {
        f"xaxis{ax}": {
            "domain": [x0, x0 + width],
            "anchor": f"y{ax}",
            "title": {"text": "replica"},
            "type": "category",
        },
        f"yaxis{ax}": y_axis,
    }
    caption = {
        "text": f"<b>{('requests per replica', 'hit rate per replica')[i]}</b>", "xref": "paper", "yref": "paper",
        "x": x0 + width / 2, "y": 1.02, "showarrow": False, "xanchor": "center", "yanchor": "bottom",
    }  # fmt: skip
    return data, axes, caption


def replica_load_figure(results: Sequence[Any], *, title: str | None = None) -> go.Figure:
    """Requests per replica (left) and each replica's hit rate (right), one color per router."""
    title = check_title(title)
    rows = _rows(results)
    gap = 0.16  # room for the right panel's y-axis title
    width = (1 - gap) / 2
    data, annotations, axes = [], [], {}
    for i in range(2):
        bars, panel_axes, caption = _panel(i, rows, i * (width + gap), width)
        data += bars
        axes.update(panel_axes)
        annotations.append(caption)
    subtitle = "one bar per router; a replica that served no request has no hit rate"
    layout = chart_layout(
        title_text(title or "Load and hit rate per replica", subtitle), 260, data,
        above=24, barmode="group", annotations=annotations, **axes,
    )  # fmt: skip
    return go.Figure({"data": data, "layout": layout})
