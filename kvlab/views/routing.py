"""Notebook 16's routing comparison: each replica's load and hit rate, one group of bars per router.

It draws ``kvlab.lessons.capstone.RoutingResult`` records (or anything with ``name``, ``requests``
and ``replica_hit_rates``) as they are; it computes nothing the fleet model would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.errors import InvalidArgumentError, brief
from kvlab.views import theme
from kvlab.views._common import check_title

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


def replica_load_figure(results: Sequence[Any], *, title: str | None = None) -> go.Figure:
    """Requests per replica (left) and each replica's hit rate (right), one color per router."""
    title = check_title(title)
    rows = _rows(results)
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("requests per replica", "hit rate per replica"),
        horizontal_spacing=0.12,
    )
    for (name, requests, rates), color in zip(rows, _COLORS, strict=False):
        labels = [f"replica {i}" for i in range(len(requests))]
        fig.add_bar(x=labels, y=requests, name=name, marker_color=color, legendgroup=name, row=1, col=1)
        fig.add_bar(
            x=labels,
            y=[100 * r for r in rates],
            name=name,
            marker_color=color,
            legendgroup=name,
            showlegend=False,
            row=1,
            col=2,
            hovertemplate="%{x}: %{y:.1f}% of prompt tokens from the cache<extra>" + name + "</extra>",
        )
    fig.update_yaxes(title_text="requests", row=1, col=1)
    fig.update_yaxes(title_text="% of prompt tokens", range=[0, 100], ticksuffix="%", row=1, col=2)
    fig.update_layout(
        title=title or "Load and hit rate per replica",
        barmode="group",
        height=420,
        template="simple_white",
        legend={"orientation": "h", "y": -0.15},
        margin={"l": 60, "r": 20, "t": 80, "b": 80},
    )
    return fig
