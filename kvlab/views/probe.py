"""The timing side channel as a figure: the prober's calibrated hit and miss times, its threshold, its guesses.

One panel per scenario (a shared cache, a salt per tenant). Each panel shows
the known hits and known misses the prober timed as two strips of dots with
their medians, the calibration threshold between them as a dashed line (the geometric mean of all
the known hits' and misses' medians), and each guess's median with its interquartile range (IQR: the
middle half of its times), labelled with the name and the verdict, and a bar at the guess's own
threshold: the verdict's test compares each repeat with the known hit and miss timed beside it, so
a guess's threshold follows the machine's load while it was timed and can differ from the dashed line.
The x axis shows major ticks only, with their unit.
When the channel is open the right guess sits among the hits; with a salt it
sits among the misses with every other guess.

The builder reads the records field by field (``calibration.hit.wall_ms``,
``guesses[i].name`` / ``ttft`` / ``classified_hit`` / ``is_secret`` /
``threshold_ms``, ``salted``), so it needs no torch: ``kvlab.engine.probe``'s
``ProbeRun`` fits, and so does any record with those fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from kvlab.core.timing import Timing
from kvlab.errors import InvalidArgumentError, brief
from kvlab.views import theme
from kvlab.views._common import check_title, read_pairs, title_text

MAX_PANELS = 8
MAX_POINTS = 10_000


def _times(name: str, values: object) -> list[float]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or not hasattr(values, "__iter__"):
        raise InvalidArgumentError(f"{name} must be a list of times in ms, got {brief(values)}")
    if not 0 < len(values) <= MAX_POINTS:  # type: ignore[arg-type]
        raise InvalidArgumentError(f"{name} must hold 1 to {MAX_POINTS:,} times, got {len(values)}")  # type: ignore[arg-type]
    out = []
    for v in values:  # type: ignore[attr-defined]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InvalidArgumentError(f"{name} must hold finite times of at least 0 ms, got {brief(v)}")
        out.append(float(v))
    return out


def _field(record: object, name: str, what: str) -> Any:
    if not hasattr(record, name):
        raise InvalidArgumentError(
            f"{what} has no {name!r}: pass kvlab.engine.probe runs, got {brief(record)}"
        )
    return getattr(record, name)


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _panel_traces(label: str, run: object, axis: int) -> tuple[list[dict[str, Any]], float, list[float]]:
    """The traces of one scenario's panel, its calibration threshold and each guess's own threshold."""
    calibration = _field(run, "calibration", label)
    hit = _times(f"{label}: known hits", _field(_field(calibration, "hit", label), "wall_ms", label))
    miss = _times(f"{label}: known misses", _field(_field(calibration, "miss", label), "wall_ms", label))
    threshold = math.sqrt(max(_median(hit), 1e-9) * max(_median(miss), 1e-9))
    guesses = _field(run, "guesses", label)
    xaxis, yaxis = f"x{axis if axis > 1 else ''}", f"y{axis if axis > 1 else ''}"
    first = axis == 1
    traces: list[dict[str, Any]] = []
    for what, values, color in (("known hit", hit, theme.GREEN), ("known miss", miss, theme.VERMILLION)):
        traces.append({
            "type": "box", "name": what, "x": values, "y": [what] * len(values), "orientation": "h",
            "boxpoints": "all", "jitter": 0.5, "pointpos": 0, "fillcolor": "rgba(0,0,0,0)",
            "line": {"color": color}, "marker": {"color": color, "size": 6, "opacity": 0.7},
            "xaxis": xaxis, "yaxis": yaxis, "showlegend": first, "legendgroup": what,
            "hovertemplate": f"{what}: %{{x:.2f}} ms<extra></extra>",
        })  # fmt: skip
    names, xs, lo, hi, colors, symbols, own = [], [], [], [], [], [], []
    for g in guesses:
        name = str(_field(g, "name", f"{label} guess"))
        ttft = _field(g, "ttft", f"{label} guess")
        times = _times(f"{label}: guess {name}", _field(ttft, "wall_ms", f"{label} guess"))
        spread = Timing(
            tuple(times), tuple(times)
        )  # the quartiles the printed lines give (kvlab.core.timing)
        q1, med, q3 = spread.q1_ms, spread.median_ms, spread.q3_ms
        secret = bool(_field(g, "is_secret", f"{label} guess"))
        called = bool(_field(g, "classified_hit", f"{label} guess"))
        names.append(f"guess {name}{' (the secret)' if secret else ''}: {'hit' if called else 'miss'}")
        xs.append(med)
        lo.append(med - q1)
        hi.append(q3 - med)
        colors.append(theme.BLUE if secret else theme.GREY)
        symbols.append("star" if secret else "circle")
        own.append(
            _positive(f"{label}: guess {name}'s threshold_ms", _field(g, "threshold_ms", f"{label} guess"))
        )
    traces.append({
        "type": "scatter", "mode": "markers", "name": "a guess (median, IQR)", "x": xs, "y": names,
        "error_x": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo, "color": theme.INK},
        "marker": {"color": colors, "symbol": symbols, "size": 11, "line": {"color": theme.INK, "width": 1}},
        "xaxis": xaxis, "yaxis": yaxis, "showlegend": first, "legendgroup": "guess",
        "hovertemplate": "%{y}: %{x:.2f} ms<extra></extra>",
    })  # fmt: skip
    return traces, threshold, own


def _positive(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgumentError(f"{name} must be a positive number of ms, got {brief(value)}")
    return float(value)


def _ticks(values: list[float]) -> tuple[list[float], list[str]]:
    """Major ticks only, at 1, 2, 5 times a power of ten, labelled with their unit (a log axis's minor
    ticks would otherwise show as bare digits)."""
    lo, hi = max(min(values), 1e-3), max(max(values), 1e-3)
    ticks = [m * 10.0**e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
             for m in (1, 2, 5)]  # fmt: skip
    inside = [t for t in ticks if lo / 1.5 <= t <= hi * 1.5] or [ticks[len(ticks) // 2]]
    return inside, [f"{t:g} ms" for t in inside]


def probe_timing_figure(runs: Mapping[str, Any], *, title: str | None = None) -> go.Figure:
    """One panel per scenario (name -> run): calibrated hit and miss times, threshold and guesses, in ms."""
    check_title(title)
    pairs = read_pairs("runs", runs) if isinstance(runs, Mapping) else []
    if not pairs:
        raise InvalidArgumentError(
            f"runs must be a non-empty mapping of scenario name to run, got {brief(runs)}"
        )
    if len(pairs) > MAX_PANELS:
        raise InvalidArgumentError(f"at most {MAX_PANELS} scenarios, got {len(pairs)}")
    data: list[dict[str, Any]] = []
    shapes, annotations = [], []
    n = len(pairs)
    gap = 0.2 if n > 1 else 0.0
    height = (1 - gap * (n - 1)) / n
    layout: dict[str, Any] = {}
    for i, (label, run) in enumerate(pairs, start=1):
        label = str(label)
        traces, threshold, own = _panel_traces(label, run, i)
        data += traces
        top = 1 - (i - 1) * (height + gap)
        suffix = "" if i == 1 else str(i)
        tickvals, ticktext = _ticks([x for t in traces for x in t["x"]] + own)
        layout[f"xaxis{suffix}"] = {
            "type": "log", "title": {"text": "time to first token (log scale)"}, "anchor": f"y{suffix}",
            "tickmode": "array", "tickvals": tickvals, "ticktext": ticktext,
        }  # fmt: skip
        layout[f"yaxis{suffix}"] = {
            "domain": [max(0.0, top - height), min(1.0, top)],
            "anchor": f"x{suffix}",
            "automargin": True,
        }
        shapes.append({
            "type": "line", "xref": f"x{suffix}", "yref": f"y{suffix} domain", "x0": threshold, "x1": threshold,
            "y0": 0, "y1": 1, "line": {"color": theme.INK, "dash": "dash", "width": 1.5},
        })  # fmt: skip
        for row, x in enumerate(own, start=2):  # the rows: known hit, known miss, then the guesses in order
            shapes.append({
                "type": "line", "xref": f"x{suffix}", "yref": f"y{suffix}", "x0": x, "x1": x,
                "y0": row - 0.35, "y1": row + 0.35, "line": {"color": theme.INK, "width": 2.5},
                "name": "a guess's own threshold (its verdict's test)", "showlegend": i == 1 and row == 2,
                "legendgroup": "own",
            })  # fmt: skip
        annotations.append({
            "text": f"<b>{label}</b> · dashed: calibration threshold {threshold:.1f} ms (all known hits and misses)",
            "xref": "paper", "yref": "paper",
            "x": 0, "y": top + 0.02, "xanchor": "left", "yanchor": "bottom", "showarrow": False,
        })  # fmt: skip
    height_px, top_px, bottom_px = 170 + 260 * n, 70, 130
    plot_px = height_px - top_px - bottom_px
    layout.update({
        "title": title_text(title or "The prober's times: calibration, threshold and guesses"),
        "height": height_px, "shapes": shapes, "annotations": annotations,
        # below the last x-axis title (about 60 px under the plot), not on it
        "legend": {"orientation": "h", "y": -70 / plot_px, "yanchor": "top", "x": 0, "xanchor": "left"},
        "margin": {"l": 10, "r": 20, "t": top_px, "b": bottom_px},
    })  # fmt: skip
    return go.Figure({"data": data, "layout": layout})
