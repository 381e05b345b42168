"""Bars and lines over the lessons' numbers: hit rates, per-turn series, cache_n, pool utilization.

Examples 3, 9, 10 and 13 and lesson 002 end in a few numbers per scenario or
per turn. These charts draw the numbers they are given, from plain values or
from the models' records (read field by field, so ``kvlab.fleet`` results,
``kvlab.server`` runs and ``kvlab.models.utilization.Fill`` work as they are);
they compute nothing a model would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from kvlab.core.timing import Timing
from kvlab.errors import InvalidArgumentError, brief, check_bool, check_text
from kvlab.views import theme
from kvlab.views._common import (
    chart_layout,
    check_number,
    check_title,
    field,
    read_items,
    read_pairs,
    title_text,
)

_SERIES_STYLES = (
    (theme.BLUE, "solid", "circle"),
    (theme.VERMILLION, "dash", "square"),
    (theme.GREEN, "dot", "diamond"),
    (theme.ORANGE, "dashdot", "triangle-up"),
    (theme.PURPLE, "longdash", "x"),
    (theme.SKY_BLUE, "solid", "star"),
    (theme.BLACK, "dash", "cross"),
)


def _named_values(data: object, what: str) -> list[tuple[str, Any]]:
    """(name, value-or-record) pairs from a dict or a list of records with a name field."""
    if isinstance(data, Mapping):
        pairs = read_pairs(what, data)
    elif isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        pairs = []
        for i, rec in enumerate(read_items(what, data)):
            name = field(rec, "name", "scenario", "method", "label", "policy", default=f"{what} {i + 1}")
            pairs.append((_name_text(name), rec))
    else:
        raise InvalidArgumentError(
            f"expected a dict name -> {what} or a list of records, got {type(data).__name__}"
        )
    if not pairs:
        raise InvalidArgumentError(f"no data: give at least one {what}")
    for i, (name, value) in enumerate(pairs):
        if not isinstance(name, str):
            raise InvalidArgumentError(f"names must be strings, got {brief(name)}")
        pairs[i] = (check_text("a name", name), value)
    return pairs


def _name_text(name: object) -> str:
    """A record's name field as text: a string as its plain text, anything else as ``str`` would write it."""
    if isinstance(name, str):
        return check_text("a name", name)
    try:
        text = str(name)
    except Exception as exc:
        raise InvalidArgumentError(f"a record's name could not be written as text: {brief(exc)}") from exc
    return check_text("a name", text)


# ---------------------------------------------------------------------- hit rate (example 9, lesson 002)


def _hit_rate_of(name: str, value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rate = check_number(f"{name} hit rate", value)
    else:
        rate_field = field(value, "hit_rate", default=None)
        if rate_field is not None:
            rate = check_number(f"{name}.hit_rate", rate_field)
        else:
            cached = check_number(f"{name} cached tokens", field(value, "cached_tokens", "cached", "cache_n"))
            total = check_number(
                f"{name} prompt tokens", field(value, "total_tokens", "prompt_tokens", "total")
            )
            if total <= 0:
                raise InvalidArgumentError(f"{name}: prompt tokens must be positive, got {total}")
            rate = cached / total
    if not 0.0 <= rate <= 1.0:
        raise InvalidArgumentError(
            f"{name}: a hit rate is a fraction between 0 and 1 (85.4% is 0.854), got {rate}"
        )
    return rate


def hit_rate_figure(rates: Mapping[str, Any] | Sequence[Any], *, title: str | None = None) -> go.Figure:
    """Examples 9 and lesson 002: the share of prompt tokens served from the cache, one bar per scenario.

    ``rates`` maps a scenario name to a fraction (0.854), or to a record with
    ``hit_rate`` or with ``cached_tokens`` and ``total_tokens`` (also read:
    ``cached``/``cache_n`` and ``prompt_tokens``/``total``). A list of records
    with a ``name`` or ``scenario`` field works too (``kvlab.fleet`` results).
    """
    title = check_title(title)
    pairs = _named_values(rates, "hit rate")
    names = [n for n, _ in pairs]
    values = [_hit_rate_of(n, v) for n, v in pairs]
    # a rate's label sits in the middle of its own bar, or of the miss bar when the hit bar is too short to
    # hold it: in the middle, never against the axis labels
    labels = [f"{100 * v:.1f}%" for v in values]
    hit = {
        "type": "bar", "orientation": "h", "y": names, "x": [100 * v for v in values], "name": "hit (from cache)",
        "marker": {"color": theme.BLUE}, "text": [t if v >= 0.08 else "" for t, v in zip(labels, values, strict=True)],
        "textposition": "inside", "insidetextanchor": "middle", "textfont": {"color": "white"},
        "hovertemplate": "%{y}: %{x:.1f}% of prompt tokens were cache hits<extra></extra>",
    }  # fmt: skip
    miss = {
        "type": "bar", "orientation": "h", "y": names, "x": [100 * (1 - v) for v in values],
        "name": "miss (prefilled)", "marker": {"color": theme.LIGHT_GREY, "pattern": {"shape": "/",
        "fgcolor": theme.GREY, "size": 7}}, "hovertemplate": "%{y}: %{x:.1f}% computed<extra></extra>",
        "text": [f"hit {t}" if v < 0.08 else "" for t, v in zip(labels, values, strict=True)],
        "textposition": "inside", "insidetextanchor": "middle", "textfont": {"color": theme.INK},
    }  # fmt: skip
    layout = chart_layout(
        title_text(title or "Prefix-cache hit rate", "share of prompt tokens served from the cache"),
        len(names) * 44 + 10, [hit, miss], left=20, barmode="stack",
        xaxis={"range": [0, 100], "title": {"text": "% of prompt tokens"}, "ticksuffix": "%"},
        yaxis={"autorange": "reversed", "automargin": True},
    )  # fmt: skip
    return go.Figure({"data": [hit, miss], "layout": layout})


# ---------------------------------------------------------------------- per-turn lines (examples 9, 13, lesson 002)


def _series(data: object, what: str, value_fields: tuple[str, ...]) -> list[tuple[str, list[float]]]:
    pairs = _named_values(data, what)
    out = []
    for name, values in pairs:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            values = field(values, *value_fields)
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise InvalidArgumentError(
                f"{name}: expected a list of numbers per turn, got {type(values).__name__}"
            )
        nums = []
        for i, v in enumerate(read_items(name, values)):
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                v = field(v, *value_fields)
            nums.append(check_number(f"{name}[{i}]", v))
        out.append((name, nums))
    return out


def _running_total(values: list[float]) -> list[float]:
    total, out = 0.0, []
    for v in values:
        total += v
        out.append(total)
    return out


def per_turn_figure(
    series: Mapping[str, Any] | Sequence[Any],
    *,
    y_title: str,
    title: str,
    value_fields: tuple[str, ...] = (),
    cumulative: bool = False,
) -> go.Figure:
    """One line per series over turns 1, 2, 3, ...; ``cumulative=True`` plots running totals."""
    title = check_title(title)
    y_title = check_text("y_title", y_title)
    cumulative = check_bool("cumulative", cumulative)
    value_fields = tuple(check_text("a value field", f) for f in read_items("value_fields", value_fields))
    rows = _series(series, "series", value_fields or ("values",))
    data = []
    for i, (name, values) in enumerate(rows):
        color, dash, symbol = _SERIES_STYLES[i % len(_SERIES_STYLES)]
        ys = _running_total(values) if cumulative else values
        data.append({
            "type": "scatter", "mode": "lines+markers", "name": f"{name} (total {sum(values):,.0f})",
            "x": list(range(1, len(ys) + 1)), "y": ys, "line": {"color": color, "dash": dash, "width": 2.5},
            "marker": {"symbol": symbol, "size": 8, "color": color},
            "hovertemplate": f"{name}<br>turn %{{x}}: %{{y:,.0f}}<extra></extra>",
        })  # fmt: skip
    longest = max((len(v) for _, v in rows), default=1)
    layout = chart_layout(
        title_text(title), 280, data,
        xaxis={"title": {"text": "turn"}, "dtick": 1 if longest <= 20 else None, "range": [0.5, longest + 0.5]},
        yaxis={"title": {"text": y_title + (" (running total)" if cumulative else "")}, "rangemode": "tozero"},
    )  # fmt: skip
    return go.Figure({"data": data, "layout": layout})


def _plain_timing(label: str, timing: object) -> Timing:
    """A Timing's own samples again as a plain Timing, checked as it is built: a subclass cannot lie in its quartiles."""
    if not isinstance(timing, Timing):
        raise InvalidArgumentError(
            f"{label} must be a kvlab.core.timing.Timing (what measure returns), got {brief(timing)}"
        )
    try:
        fields = object.__getattribute__(timing, "__dict__")
        return Timing(dict.get(fields, "wall_ms"), dict.get(fields, "cpu_ms"))
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{label}: {exc}") from None
    except Exception:  # no instance dict, or one that cannot be read
        raise InvalidArgumentError(
            f"{label} is not a readable Timing: build it with kvlab.core.timing"
        ) from None


def timing_per_turn_figure(series: Mapping[str, Any], *, y_title: str, title: str) -> go.Figure:
    """One line of medians per series over turns, each point with its interquartile range as an error bar.

    ``series`` maps a name to one ``kvlab.core.timing.Timing`` per turn (what the course's
    timing helper returns). Why the bars: a median alone hides how far repeated runs
    spread, and a reader should see whether two lines' ranges overlap before reading
    one as faster.
    """
    if title is None:
        raise InvalidArgumentError("title must be text: say what was timed and where")
    pairs = _named_values(series, "series of timings")
    medians: dict[str, list[float]] = {}
    bars: dict[str, tuple[list[float], list[float]]] = {}
    for name, turns in pairs:
        if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence):
            raise InvalidArgumentError(
                f"{name}: expected a list of Timings, one per turn, got {brief(turns)}"
            )
        timings = [_plain_timing(f"{name}[{i}]", t) for i, t in enumerate(read_items(name, turns))]
        medians[name] = [t.median_ms for t in timings]
        bars[name] = ([t.q3_ms - t.median_ms for t in timings], [t.median_ms - t.q1_ms for t in timings])
    fig = per_turn_figure(medians, y_title=y_title, title=title)
    for trace, name in zip(fig.data, medians, strict=True):
        up, down = bars[name]
        trace.update(
            error_y={
                "type": "data",
                "symmetric": False,
                "array": up,
                "arrayminus": down,
                "thickness": 2,
                "width": 6,
            },
            hovertemplate=f"{name}<br>turn %{{x}}: %{{y:,.1f}} (IQR -%{{error_y.arrayminus:.1f}} "
            "+%{error_y.array:.1f})<extra></extra>",
        )
    return fig


def tokens_per_turn_figure(
    series: Mapping[str, Any] | Sequence[Any], *, cumulative: bool = False, title: str | None = None
) -> go.Figure:
    """Example 13: tokens the server must process on each turn, one line per history policy.

    ``series`` maps a policy name to its per-turn counts: a list of numbers, a
    list of records with ``processed_tokens`` (or ``processed``, ``prompt_n``,
    ``computed_tokens``), or a run with such ``turns`` (example 13's and example
    9's runs work as they are).
    """
    return per_turn_figure(
        series,
        y_title="tokens processed",
        title=check_title(title) or "Tokens processed per turn",
        value_fields=("turns", "processed_tokens", "processed", "prompt_n", "computed_tokens", "computed"),
        cumulative=cumulative,
    )


# ---------------------------------------------------------------------- cache_n and prompt_n (example 10)


def _cache_n_turns(name: str, turns: object) -> tuple[list[int], list[int]]:
    """(cache_n, prompt_n) per turn of one run."""
    if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence):
        raise InvalidArgumentError(f"run {name!r}: expected a non-empty list of turns")
    turns = read_items(f"run {name!r}", turns)
    if not turns:
        raise InvalidArgumentError(f"run {name!r}: expected a non-empty list of turns")
    cache_n, prompt_n = [], []
    for i, t in enumerate(turns):
        if isinstance(t, (tuple, list)) and len(t) == 2:
            c, p = t
        else:
            c = field(t, "cache_n", "cached_tokens")
            p = field(t, "prompt_n", default=None)
            if p is None:
                p = check_number(f"{name} turn {i + 1} prompt_tokens", field(t, "prompt_tokens")) - c
        c = check_number(f"{name} turn {i + 1} cache_n", c)
        p = check_number(f"{name} turn {i + 1} prompt_n", p)
        if c < 0 or p < 0:
            raise InvalidArgumentError(f"{name} turn {i + 1}: cache_n and prompt_n cannot be negative")
        cache_n.append(int(c))
        prompt_n.append(int(p))
    return cache_n, prompt_n


def _cache_n_panel(
    i: int, name: str, cs: list[int], ps: list[int], x0: float, width: float, ymax: int
) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """(bars, axes, panel caption) of run number ``i``, drawn in the paper's [x0, x0 + width]."""
    ax = "" if i == 0 else str(i + 1)
    turns = list(range(1, len(cs) + 1))
    data = []
    for label, values, color, pattern in (
        ("cache_n: from the cache", cs, theme.BLUE, ""),
        ("prompt_n: processed", ps, theme.ORANGE, "/"),
    ):
        data.append({
            "type": "bar", "x": turns, "y": values, "name": label, "legendgroup": label,
            "showlegend": i == 0, "marker": {"color": color, "pattern": {"shape": pattern, "size": 7,
            "fgcolor": theme.INK, "fgopacity": 0.3}}, "textposition": "inside",
            "text": [v if v >= 0.06 * ymax else "" for v in values],
            "xaxis": f"x{ax}", "yaxis": f"y{ax}",
            "hovertemplate": f"{name} turn %{{x}}: {label.split(':')[0]} %{{y}}<extra></extra>",
        })  # fmt: skip
    axes = {
        f"xaxis{ax}": {"domain": [x0, x0 + width], "title": {"text": "turn"}, "dtick": 1, "anchor": f"y{ax}"},
        f"yaxis{ax}": {"anchor": f"x{ax}", "range": [0, ymax * 1.08],
                       "title": {"text": "prompt tokens"} if i == 0 else None, "matches": "y" if i else None},
    }  # fmt: skip
    caption = []
    if name:
        caption.append({"text": f"<b>{name}</b><br>processed {sum(ps):,} tokens", "xref": "paper",
                        "yref": "paper", "x": x0 + width / 2, "y": 1.02, "showarrow": False,
                        "xanchor": "center", "yanchor": "bottom"})  # fmt: skip
    return data, axes, caption


def cache_n_figure(
    runs: Mapping[str, Sequence[Any]] | Sequence[Any], *, title: str | None = None
) -> go.Figure:
    """Example 10: each turn's prompt split into tokens from the cache (cache_n) and processed (prompt_n).

    ``runs`` maps a run name to its turns, each a record with ``cache_n`` and
    ``prompt_n`` (or ``prompt_tokens``, from which prompt_n = prompt_tokens -
    cache_n), or a ``(cache_n, prompt_n)`` pair. A single list of turns is one run.
    """
    title = check_title(title)
    if isinstance(runs, Sequence) and not isinstance(runs, (str, bytes)):
        pairs = [("", runs)]
    elif isinstance(runs, Mapping):
        pairs = read_pairs("runs", runs)
    else:
        pairs = []
    if not pairs:
        raise InvalidArgumentError("runs must be a dict run name -> list of turns, or one list of turns")
    parsed = [(_name_text(name), *_cache_n_turns(_name_text(name), turns)) for name, turns in pairs]
    k = len(parsed)
    gap = 0.08
    width = (1 - gap * (k - 1)) / k
    ymax = max(c + p for _, cs, ps in parsed for c, p in zip(cs, ps, strict=True))
    data, annotations, layout_axes = [], [], {}
    for i, (name, cs, ps) in enumerate(parsed):
        bars, axes, caption = _cache_n_panel(i, name, cs, ps, i * (width + gap), width, ymax)
        data += bars
        layout_axes.update(axes)
        annotations += caption
    layout = chart_layout(
        title_text(title or "Prompt tokens per turn: cached (cache_n) and processed (prompt_n)"), 250, data,
        above=44 if annotations else 0, barmode="stack", annotations=annotations, **layout_axes,
        uniformtext={"minsize": 9, "mode": "hide"},  # a count too small to read is left to the hover
    )  # fmt: skip
    return go.Figure({"data": data, "layout": layout})


# ---------------------------------------------------------------------- pool utilization (examples 1, 3)


def _fill_shares(name: str, rec: object) -> tuple[float, float, float, str]:
    """(% stored, % held but unused, % free, " · N requests" or "") of one pool."""
    pool = check_number(f"{name} pool size", field(rec, "pool_size", "pool", "capacity"))
    s = check_number(f"{name} tokens stored", field(rec, "tokens_stored", "stored"))
    w = check_number(f"{name} wasted slots", field(rec, "wasted_slots", "internal_fragmentation", "wasted",
                                                   default=0))  # fmt: skip
    if pool <= 0 or s < 0 or w < 0 or s + w > pool:
        raise InvalidArgumentError(
            f"{name}: need pool > 0 and 0 <= stored + wasted <= pool, got pool {pool}, stored {s}, wasted {w}"
        )
    n = field(rec, "requests", default=None)
    return (
        100 * s / pool,
        100 * w / pool,
        100 * (pool - s - w) / pool,
        f" · {_name_text(n)} requests" if n is not None else "",
    )


def utilization_figure(fills: Mapping[str, Any] | Sequence[Any], *, title: str | None = None) -> go.Figure:
    """Example 3 (and 1): how much of a pool stores KV, is held but unused, or is free, one bar per method.

    Each value is a record with the pool size (``pool_size``/``pool``), the
    tokens stored (``tokens_stored``/``stored``) and the slots held but unused
    (``wasted_slots``/``internal_fragmentation``/``wasted``; default 0), and
    optionally ``requests``; ``kvlab.models.utilization.Fill`` objects work as they are.
    """
    title = check_title(title)
    pairs = _named_values(fills, "fill")
    names = [name for name, _ in pairs]
    stored, wasted, free, requests = (
        list(col) for col in zip(*(_fill_shares(n, r) for n, r in pairs), strict=True)
    )
    data = []
    for label, values, color, pattern in (
        ("stores KV", stored, theme.BLUE, ""),
        ("held, unused", wasted, theme.ORANGE, "/"),
        ("free", free, theme.LIGHT_GREY, ""),
    ):
        texts = [f"{v:.1f}%" + (req if label == "stores KV" else "") if v >= 4 else ""
                 for v, req in zip(values, requests, strict=True)]  # fmt: skip
        data.append({
            "type": "bar", "orientation": "h", "y": names, "x": values, "name": label, "text": texts,
            "textposition": "inside", "insidetextanchor": "middle",
            "marker": {"color": color, "pattern": {"shape": pattern, "fgcolor": theme.INK, "fgopacity": 0.35,
                                                   "size": 8}},
            "hovertemplate": f"%{{y}}: %{{x:.1f}}% of the pool {label}<extra></extra>",
        })  # fmt: skip
    layout = chart_layout(
        title_text(title or "Pool utilization", "share of the pool's slots"), len(names) * 56 + 10, data,
        left=20, barmode="stack",
        xaxis={"range": [0, 100], "ticksuffix": "%", "title": {"text": "% of pool slots"}},
        yaxis={"autorange": "reversed", "automargin": True},
    )  # fmt: skip
    return go.Figure({"data": data, "layout": layout})
