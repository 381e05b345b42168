"""Small pieces every view uses: reading a history, plain-dict trace primitives, validation.

The views build figures as plain dicts (``{"data": [...], "layout": {...}}``)
first and turn them into ``go.Figure`` only at the end. Plain dicts are cheap
to build and to compare, which is what the animations (one dict per frame) and
the stepper (send only what changed) need.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvlab.core.snapshots import History, Step
from kvlab.errors import (
    LIMITS,
    InvalidArgumentError,
    brief,
    cdiv,
    check_int,
    check_items,
    check_optional_str,
    check_size,
)
from kvlab.views import theme
from kvlab.views.text import caption
from kvlab.views.theme import INK, TEMPLATE_NAME
from kvlab.views.wrapping import (  # noqa: F401 - the views import these from here
    HEAD_WIDTH,
    NARROWEST,
    SUB_WIDTH,
    cut_to,
    fit_label,
    text_px,
    title_lines,
    title_text,
    top_margin,
    wrap,
)

Spec = dict[str, Any]

#: A block status's code in the status heatmaps (the block grid, the block tables, the free queue).
STATUS_CODE = {status: i for i, status in enumerate(theme.STATUSES)}
#: The figure width, in px, that cell and bar labels are fitted for: plotly's default 700 px, less a little.
LABEL_WIDTH = 650


def steps_of(history: object, state_type: type | tuple[type, ...] | None = None) -> list[tuple[str, Any]]:
    """(caption, state) pairs from a ``History``, a list of ``Step``, or a plain list of states."""
    if isinstance(history, History):
        steps = list(history.steps)
    elif isinstance(history, (list, tuple)):
        steps = read_items("history", history)
    else:
        raise InvalidArgumentError(
            f"expected a kvlab History (a model built with record=True keeps one as .history) "
            f"or a list of snapshots, got {type(history).__name__}"
        )
    if not steps:
        raise InvalidArgumentError(
            "the history is empty: record at least one snapshot (record=True on the model)"
        )
    out: list[tuple[str, Any]] = []
    for i, item in enumerate(steps):
        if isinstance(item, Step):
            text, state = caption(item), item.state
        else:
            text, state = f"snapshot {i}", item
        if state_type is not None and not isinstance(state, state_type):
            names = (
                state_type.__name__
                if isinstance(state_type, type)
                else " or ".join(t.__name__ for t in state_type)
            )
            raise InvalidArgumentError(
                f"step {i} holds a {type(state).__name__}, but this view needs a {names}"
            )
        out.append((str(text), state))
    return out


def check_state(name: str, state: object, state_type: type) -> None:
    if not isinstance(state, state_type):
        raise InvalidArgumentError(
            f"{name} must be a kvlab.core.snapshots.{state_type.__name__}, got {type(state).__name__}; "
            f"take one with model.snapshot() or from model.history"
        )


def check_drawn_blocks(num_blocks: object, *, minimum: int = 0) -> int:
    """A pool a figure draws, one cell per block: at most ``LIMITS.drawn_blocks`` blocks.

    Drawing costs time and memory per cell (16,384 blocks take about 3 s; a million would take
    minutes and gigabytes), and past a few thousand cells none can be read: draw a smaller pool.
    """
    return check_size("num_blocks", num_blocks, "drawn_blocks", minimum=minimum)


def check_title(title: object) -> str | None:
    """A title (or caption) is None or a string, kept as plain text."""
    if title is not None and not isinstance(title, str):
        raise InvalidArgumentError(f"title must be a string or None, got {type(title).__name__}")
    return check_optional_str("title", title)


MAX_FRAME_MS = 60_000
"""Longest frame or step interval of an animation or stepper: a minute per step is already a pause."""


def check_ms(name: str, value: object) -> int:
    """A frame duration or play interval in ms: an int in 1..MAX_FRAME_MS."""
    return check_int(name, value, minimum=1, maximum=MAX_FRAME_MS)


def check_axis_max(name: str, value: object) -> int:
    """An axis maximum in tokens: an int in 0..LIMITS.total_tokens (0 is drawn as 1)."""
    return check_int(name, value, minimum=0, maximum=LIMITS.total_tokens)


def base_layout(title: dict[str, Any], **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {"template": TEMPLATE_NAME, "title": dict(title)}
    layout.update(extra)
    height = extra.get("height")
    if height:  # pin the title a few pixels below the top edge, whatever the height
        layout["title"]["y"] = 1 - 10 / height
    return layout


def chart_layout(
    title: dict[str, Any],
    plot_h: int,
    data: Sequence[Mapping[str, Any]],
    *,
    left: int = 70,
    above: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """Layout for a bar or line chart: title, a ``plot_h`` px plot, and the legend under the x-axis title.

    The legend is placed in pixels below the axis title and the bottom margin
    holds it as wrapped at the narrowest width, so that it never covers the
    axis title however wide the figure is. ``above`` adds room over the plot
    (for panel captions).
    """
    top = top_margin(title) + above
    under_axis = 56  # tick labels and the x-axis title
    bottom = under_axis + legend_height(data, left=left, font_px=13, traceorder="normal") + 8
    return base_layout(
        title, height=plot_h + top + bottom,
        legend={"orientation": "h", "y": -under_axis / plot_h, "x": 0, "yanchor": "top", "traceorder": "normal"},
        margin={"l": left, "r": 20, "t": top, "b": bottom}, **extra,
    )  # fmt: skip


def legend_below_layout(
    title: dict[str, Any],
    data: Sequence[Mapping[str, Any]],
    *,
    plot_h: int,
    top: int,
    left: int,
    gap: int,
    pad: int,
    **extra: Any,
) -> dict[str, Any]:
    """``base_layout`` of a plot ``plot_h`` px tall whose horizontal legend (11 px font) hangs ``gap`` px under it.

    The bottom margin is the legend's height at the narrowest width
    (``legend_height``) plus ``pad`` px, so the legend never runs into what
    lies below; ``left`` is the left margin, which the legend starts after.
    The block grid, the free queue and the radix tree lay out this way.
    """
    bottom = legend_height(data, left=left) + pad
    return base_layout(
        title,
        height=plot_h + top + bottom,
        margin={"l": left, "r": 20, "t": top, "b": bottom},
        showlegend=True,
        legend={"orientation": "h", "y": -gap / plot_h, "x": 0, "yanchor": "top", "font": {"size": 11}},
        **extra,
    )


def legend_height(
    data: Sequence[Mapping[str, Any]],
    *,
    left: float,
    width: int = NARROWEST,
    font_px: int = 11,
    traceorder: str | None = None,
) -> int:
    """Pixels a horizontal legend of ``data``'s legend entries takes in a ``width`` px figure.

    plotly wraps a horizontal legend into as many rows as the width needs:
    entries flow from row to row when they are grouped (every view's marks
    are), and line up in columns as wide as the widest entry otherwise
    (``traceorder="normal"``). The views reserve this much room under the
    plot at the narrowest width, so that the legend never runs into what
    lies below it (an axis title, an animation's controls).
    """
    shown = [t for t in data if t.get("showlegend", t.get("type", "scatter") in ("scatter", "bar"))]
    if not shown:
        return 0
    room = max(width - left - 20, 100)
    entries = [46 + text_px(str(t.get("name", "")), font_px) for t in shown]
    grouped = traceorder != "normal" and any(t.get("legendgroup") for t in shown)
    if grouped:  # groups flow, a new row when the next does not fit; a group's entries stack in a column
        groups: dict[object, list[float]] = {}
        for i, (t, entry) in enumerate(zip(shown, entries, strict=True)):
            groups.setdefault(t.get("legendgroup") or f"#{i}", []).append(entry)
        rows, row_rows, used = 0, 0, 0.0
        for column in groups.values():
            if used and used + max(column) > room:
                rows, row_rows, used = rows + row_rows, 0, 0.0
            used += max(column)
            row_rows = max(row_rows, len(column))
        rows += row_rows
    elif sum(entries) <= room:
        rows = 1
    else:  # columns as wide as the widest entry
        per_row = max(1, int(room // max(entries)))
        rows = cdiv(len(entries), per_row)
    return int(rows * (font_px + 18) + 8)  # a row is as tall as its symbols, about 29 px at 11 px text


def legend_entry(
    name: str,
    color: str,
    *,
    symbol: str = "square",
    group: str | None = None,
    line_color: str = INK,
    size: int = 14,
    visible: bool = True,
) -> dict[str, Any]:
    """A trace with no points that only puts a coloured swatch and a name in the legend."""
    return {
        "type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": name,
        "marker": {"symbol": symbol, "size": size, "color": color, "line": {"color": line_color, "width": 1}},
        "showlegend": visible, "hoverinfo": "skip", "legendgroup": group or name,
    }  # fmt: skip


def rect_path(
    cells: Iterable[tuple[float, float]], half_w: float = 0.5, half_h: float = 0.5, inset: float = 0.0
) -> tuple[list[float | None], list[float | None]]:
    """x and y lists drawing one closed rectangle around each (x, y) centre, separated by gaps."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    for x, y in cells:
        x0, x1 = x - half_w + inset, x + half_w - inset
        y0, y1 = y - half_h + inset, y + half_h - inset
        xs += [x0, x1, x1, x0, x0, None]
        ys += [y0, y0, y1, y1, y0, None]
    return xs, ys


def cross_path(
    cells: Iterable[tuple[float, float]], half: float = 0.32
) -> tuple[list[float | None], list[float | None]]:
    """x and y lists drawing an X over each cell centre."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    for x, y in cells:
        xs += [x - half, x + half, None, x - half, x + half, None]
        ys += [y - half, y + half, None, y + half, y - half, None]
    return xs, ys


def line_trace(
    name: str,
    xs: list,
    ys: list,
    *,
    color: str,
    dash: str = "solid",
    width: float = 3,
    xaxis: str = "x",
    yaxis: str = "y",
    legend: bool = True,
    group: str | None = None,
) -> dict[str, Any]:
    """A line trace; with ``legend`` it is listed in the legend even when it has nothing to draw."""
    if legend and not xs:
        xs, ys = [None], [None]
    return {
        "type": "scatter", "x": xs, "y": ys, "mode": "lines", "name": name,
        "line": {"color": color, "dash": dash, "width": width},
        "hoverinfo": "skip", "showlegend": legend, "legendgroup": group or name,
        "xaxis": xaxis, "yaxis": yaxis, "connectgaps": False,
    }  # fmt: skip


def discrete_colorscale(colors: Sequence[str]) -> list[list[Any]]:
    """A colorscale that maps the integer codes 0..n-1 (with zmin=-0.5, zmax=n-0.5) to ``colors``."""
    n = len(colors)
    scale: list[list[Any]] = []
    for i, c in enumerate(colors):
        scale.append([i / n, c])
        scale.append([(i + 1) / n, c])
    return scale


def tokens_text(tokens: Sequence[int], limit: int = 12) -> str:
    """A token list for hover text, cut after ``limit`` ids."""
    if len(tokens) <= limit:
        return "[" + ", ".join(map(str, tokens)) + "]"
    return "[" + ", ".join(map(str, tokens[:limit])) + f", … {len(tokens) - limit} more]"


def run_label(tokens: Sequence[int], limit: int = 6) -> str:
    """A compact token run for a box label: the whole run when short, else its ends and length."""
    if len(tokens) <= limit:
        return "[" + ", ".join(map(str, tokens)) + "]"
    return f"[{tokens[0]}, {tokens[1]}, … {tokens[-1]}] ({len(tokens)})"


def read_items(name: str, value: object) -> list[Any]:
    """A user's list of records or numbers as a plain list, at most ``LIMITS.count`` items (``check_items``)."""
    return check_items(name, value, "count", what="a list")


def read_pairs(name: str, value: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    """A user's mapping as a list of (key, value) pairs; whatever its own methods raise is kvlab's error."""
    try:
        pairs = list(dict.items(value)) if isinstance(value, dict) else list(value.items())
    except Exception as exc:
        raise InvalidArgumentError(f"{name} could not be read as a mapping: {brief(exc)}") from exc
    return check_items(name, pairs, "count", what="a mapping")  # type: ignore[return-value]


def field(record: object, *names: str, default: Any = ...) -> Any:
    """The first of ``names`` that ``record`` has, as a mapping key or an attribute.

    A record is a user's object: whatever its ``__contains__``, ``__getitem__`` or attributes raise
    while they are read is refused as kvlab's error, chained from the original.
    """
    try:
        for name in names:
            if isinstance(record, Mapping):
                if name in record:
                    return record[name]
            elif hasattr(record, name):
                return getattr(record, name)
    except Exception as exc:
        raise InvalidArgumentError(
            f"reading {', '.join(names)} of a record ({type(record).__name__}) raised {brief(exc)}"
        ) from exc
    if default is not ...:
        return default
    raise InvalidArgumentError(
        f"a record ({type(record).__name__}) has none of the fields {', '.join(names)}: "
        f"pass plain numbers or records with one of these fields"
    )


def check_number(name: str, value: object) -> float:
    """A finite number (int, float or a numpy number; not a bool) as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            import numpy as np

            if isinstance(value, (np.integer, np.floating)) and not isinstance(value, np.bool_):
                value = float(value)
        except ImportError:  # pragma: no cover
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{name} must be a number, got {brief(value)} ({type(value).__name__})")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise InvalidArgumentError(f"{name} must be a finite number, got {brief(value)}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise InvalidArgumentError(f"{name} must be a finite number, got {brief(value)}")
    return number


# ---------------------------------------------------------------------- block-status cells (pool, tables, queue)


def status_heatmap(
    z, text, hover, *, xaxis: str, yaxis: str, name: str, font_size: int, x=None, y=None, gap: int = 2
) -> dict[str, Any]:
    """A heatmap of block-status codes (``STATUS_CODE``), coloured as ``theme.STATUS_COLORS``."""
    trace: dict[str, Any] = {
        "type": "heatmap", "z": z, "text": text, "hovertext": hover, "name": name,
        "colorscale": _STATUS_SCALE, "zmin": -0.5, "zmax": len(theme.STATUSES) - 0.5, "showscale": False,
        "xgap": gap, "ygap": 2, "texttemplate": "%{text}", "textfont": {"size": font_size},
        "hovertemplate": "%{hovertext}<extra></extra>", "xaxis": xaxis, "yaxis": yaxis, "hoverongaps": False,
    }  # fmt: skip
    if x is not None:
        trace["x"] = x
    if y is not None:
        trace["y"] = y
    return trace


def status_legend(null_block: bool) -> list[dict[str, Any]]:
    """One legend swatch per block status; the null block's only where the pool has one."""
    return [
        legend_entry(status, theme.STATUS_COLORS[status], group=f"status {status}",
                     visible=status != "null" or null_block)
        for status in theme.STATUSES
    ]  # fmt: skip


def mark_trace(
    kind: str,
    xs: list,
    ys: list,
    *,
    xaxis: str = "x",
    yaxis: str = "y",
    legend: bool = True,
    width: float = 3,
) -> dict[str, Any]:
    """The outline (or cross) of one ``theme.MARK_STYLES`` mark: what the last operation hit, allocated..."""
    style = theme.MARK_STYLES[kind]
    return line_trace(str(style["label"]), xs, ys, color=str(style["color"]), dash=str(style["dash"]),
                      width=width, xaxis=xaxis, yaxis=yaxis, legend=legend, group=f"mark {kind}")  # fmt: skip


def label_room(cell_px: float) -> int:
    """How many px of a 10 px label fit across a cell ``cell_px`` wide, with a little padding."""
    return max(int(cell_px - 6), 0)


def empty_grid(rows: int, cols: int) -> tuple[list[list[Any]], list[list[str]], list[list[Any]]]:
    """(codes, labels, hover texts) of a ``rows`` x ``cols`` heatmap with nothing in it yet."""
    z: list[list[Any]] = [[None] * cols for _ in range(rows)]
    text: list[list[str]] = [[""] * cols for _ in range(rows)]
    hover: list[list[Any]] = [[None] * cols for _ in range(rows)]
    return z, text, hover


_STATUS_SCALE = discrete_colorscale([theme.STATUS_COLORS[s] for s in theme.STATUSES])
