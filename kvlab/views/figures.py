"""One plotly figure per concept of the lesson, each drawn from a snapshot.

Every builder comes in two layers. ``*_spec(state, ...)`` returns the figure as
plain dicts and always the same traces in the same order for a given kind of
state, so the animations can use one spec per frame and the stepper can send
only the properties that changed. ``*_figure(state, ...)`` wraps the spec in a
``go.Figure`` for display.

Colours come from ``kvlab.views.theme`` (Okabe-Ito, safe for colour-blind
readers); whatever the last operation did is marked with a line style or a
cross as well as a colour, and every colour has a legend entry.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from typing import Any

import plotly.graph_objects as go

from kvlab.core import hashing
from kvlab.core.snapshots import BlockPoolState, BlockState, ContiguousState, RadixNodeState, RadixState
from kvlab.errors import InvalidArgumentError, UnknownRequestError, check_int
from kvlab.views import theme
from kvlab.views._common import (
    Spec,
    base_layout,
    check_number,
    check_state,
    check_title,
    cross_path,
    cut_to,
    discrete_colorscale,
    field,
    fit_label,
    legend_entry,
    legend_height,
    line_trace,
    rect_path,
    text_px,
    title_text,
    tokens_text,
    top_margin,
)

STATUS_CODE = {status: i for i, status in enumerate(theme.STATUSES)}
#: The figure width, in px, that cell and bar labels are fitted for: plotly's default 700 px, less a little.
LABEL_WIDTH = 650
_STATUS_SCALE = discrete_colorscale([theme.STATUS_COLORS[s] for s in theme.STATUSES])
_DARK_STATUSES = {"in use", "null"}


def _heatmap(
    z, text, hover, *, xaxis: str, yaxis: str, name: str, font_size: int, x=None, y=None, gap: int = 2
) -> dict[str, Any]:
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


def _status_legend(null_block: bool) -> list[dict[str, Any]]:
    return [
        legend_entry(status, theme.STATUS_COLORS[status], group=f"status {status}",
                     visible=status != "null" or null_block)
        for status in theme.STATUSES
    ]  # fmt: skip


def _mark(
    kind: str,
    xs: list,
    ys: list,
    *,
    xaxis: str = "x",
    yaxis: str = "y",
    legend: bool = True,
    width: float = 3,
) -> dict[str, Any]:
    style = theme.MARK_STYLES[kind]
    return line_trace(str(style["label"]), xs, ys, color=str(style["color"]), dash=str(style["dash"]),
                      width=width, xaxis=xaxis, yaxis=yaxis, legend=legend, group=f"mark {kind}")  # fmt: skip


def _summary_counts(state: BlockPoolState) -> dict[str, int]:
    counts = dict.fromkeys(theme.STATUSES, 0)
    for b in state.blocks:
        counts[b.status] += 1
    return counts


# ====================================================================== contiguous pool (example 1)


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
    pool = state.pool_size
    parts: dict[str, dict[str, list]] = {
        name: {"x": [], "base": [], "hover": []} for name in theme.REGION_COLORS
    }
    labels_x, labels_text, labels_color = [], [], []
    for r in state.regions:
        used = parts["stores KV"]
        used["x"].append(r.used)
        used["base"].append(r.start)
        used["hover"].append(f"<b>{r.owner}</b> [{r.start}, {r.end})<br>{r.used} of {r.size} slots hold KV")
        spare = parts["reserved, unused"]
        spare["x"].append(r.size - r.used)
        spare["base"].append(r.start + r.used)
        spare["hover"].append(
            f"<b>{r.owner}</b>: {r.size - r.used} slots reserved but unused<br>(internal fragmentation)"
        )
        # the label sits on the larger part of the region, in a colour readable there
        on_used = 2 * r.used >= r.size
        part = r.used if on_used else r.size - r.used
        labels_x.append(r.start + r.used / 2 if on_used else r.start + r.used + part / 2)
        labels_text.append(_fit_label(f"{r.owner}<br>{r.used}/{r.size}", part, pool, short=r.owner))
        labels_color.append("white" if on_used else theme.INK)
    gaps = state.gaps
    for start, size in gaps:
        gap = parts["free gap"]
        gap["x"].append(size)
        gap["base"].append(start)
        gap["hover"].append(f"free gap [{start}, {start + size}): {size} slots")
        labels_x.append(start + size / 2)
        labels_text.append(_fit_label(f"gap<br>{size}", size, pool, short=str(size)))
        labels_color.append(theme.INK)
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
    data.append({
        "type": "scatter", "mode": "text", "x": labels_x, "y": [0] * len(labels_x), "text": labels_text,
        "textfont": {"size": 11, "color": labels_color}, "hoverinfo": "skip", "showlegend": False, "name": "labels",
    })  # fmt: skip
    free = pool - state.reserved
    largest = max((s for _, s in gaps), default=0)
    sub = (f"{len(state.regions)} regions reserve {state.reserved:,} of {pool:,} slots; "
           f"{state.stored:,} hold KV ({100 * state.stored / pool:.1f}% of the pool); "
           f"{free:,} free in {len(gaps)} gap(s), largest {largest:,}")  # fmt: skip
    if state.rejected:
        sub += f"<br>refused so far: {', '.join(state.rejected)}"
    head = caption or title or "Contiguous KV pool"
    ttl = title_text(head, sub)
    top = top_margin(ttl, False, head_lines, sub_lines)
    plot_h, legend_top = 110, 58  # the legend sits under the slot axis and its title
    bottom = legend_top + legend_height(data, left=30, font_px=13) + 8
    layout = base_layout(
        ttl,
        barmode="overlay", height=plot_h + top + bottom, showlegend=True,
        legend={"orientation": "h", "y": -legend_top / plot_h, "x": 0, "yanchor": "top"},
        xaxis={"range": [0, pool], "title": {"text": "slot", "standoff": 2}, "showgrid": False, "zeroline": False},
        yaxis={"visible": False, "range": [-0.6, 0.6], "fixedrange": True},
        margin={"l": 30, "r": 30, "t": top, "b": bottom},
    )  # fmt: skip
    return {"data": data, "layout": layout}


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


def contiguous_figure(state: ContiguousState, *, title: str | None = None) -> go.Figure:
    """Example 1: a contiguous pool with its regions, the reserved-but-unused slots and the free gaps."""
    return go.Figure(contiguous_spec(state, title=check_title(title)))


# ====================================================================== block pool (examples 2-5, 7)


def grid_shape(num_blocks: int) -> tuple[int, int]:
    """(columns, rows) of the block grid: one row up to 12 blocks, then rows of 8, 16 or 32.

    Up to 64 blocks the rows hold 8, so that each cell is wide enough to name
    its owner at the default figure width.
    """
    if num_blocks <= 12:
        cols = max(num_blocks, 1)
    elif num_blocks <= 64:
        cols = 8
    elif num_blocks <= 256:
        cols = 16
    else:
        cols = 32
    return cols, max(1, math.ceil(num_blocks / cols))


def table_label(request_id: str, num_tokens: int) -> str:
    """A block table's row label: the request and how many tokens it holds, in two lines when long."""
    one = f"{request_id} · {num_tokens} tok"
    return one if len(one) <= 14 else f"{request_id}<br>{num_tokens} tok"


def _left_margin(label_px: float, rows: int) -> int:
    """Room left of the grid and the tables for the table labels (11 px) and the row starts."""
    return max(int(label_px) + 16, 50 if rows > 1 else 36)


def _owners(state: BlockPoolState) -> dict[int, list[tuple[str, int]]]:
    owners: dict[int, list[tuple[str, int]]] = {}
    for rid, table in state.tables:
        for logical, b in enumerate(table):
            owners.setdefault(b, []).append((rid, logical))
    return owners


def _block_label(block: BlockState, owners: list[tuple[str, int]], room: int) -> str:
    """The block id, and below it (in lines ``room`` px wide) its owner, ref count or hash.

    An owner's name is kept whole where it fits and broken before its last
    word where it does not ("sample 0" over two lines), never turned into
    initials; a block several tables hold shows its ref count instead.
    """
    head = str(block.block_id)
    if room < 18:
        return head
    status = block.status
    if status == "null":
        extra = "null"
    elif status == "in use":
        names = sorted({rid for rid, _ in owners})
        if len(names) == 1 and block.ref_count == 1:
            extra = fit_label(names[0], room)
        else:
            extra = f"ref {block.ref_count}"
            extra = extra if text_px(extra) <= room else f"×{block.ref_count}"
    elif status == "free, cached":
        extra = cut_to((block.block_hash or "")[:8], room)
    else:
        extra = ""
    return f"<b>{head}</b><br>{extra}" if extra else f"<b>{head}</b>"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def label_room(cell_px: float) -> int:
    """How many px of a 10 px label fit across a cell ``cell_px`` wide, with a little padding."""
    return max(int(cell_px - 6), 0)


@lru_cache(maxsize=16384)
def _block_cell(
    block: BlockState, owners: tuple[tuple[str, int], ...], bs: int, room: int
) -> tuple[int, str, str]:
    """(status code, label, hover text without the queue position) of one block; memoised, since
    consecutive snapshots share almost all their blocks and this is a stepper's main cost."""
    lines = [f"<b>block {block.block_id}</b> · {block.status}", theme.STATUS_MEANING[block.status]]
    if owners:
        held = ", ".join(f"{rid} (logical {lg})" for rid, lg in owners)
        lines.append(f"ref count {block.ref_count}: {held}")
    if block.tokens:
        lines.append(f"{block.num_tokens}/{bs} tokens {tokens_text(block.tokens)}")
    elif not block.is_null:
        lines.append(f"0/{bs} tokens")
    if block.block_hash is not None:
        lines.append(f"cached under hash {block.block_hash}")
    lines.append(f"slots {block.block_id * bs}–{block.block_id * bs + bs - 1}")
    return STATUS_CODE[block.status], _block_label(block, list(owners), room), "<br>".join(lines)


def _block_hover(
    block: BlockState, state: BlockPoolState, owners: list[tuple[str, int]], queue_pos: dict[int, int]
) -> str:
    hover = _block_cell(block, tuple(owners), state.block_size, 8)[2]
    if block.block_id in queue_pos:
        hover += f"<br>free queue position {queue_pos[block.block_id]} (0 = handed out next)"
    return hover


@lru_cache(maxsize=16384)
def _table_cell(rid: str, logical: int, b: int, k: int, bs: int, ref: int | None) -> str:
    first = logical * bs
    refs = f" · ref count {ref}" if ref is not None else ""
    return (f"<b>{rid}</b>: logical block {logical} → physical block {b}<br>"
            f"tokens {first}–{first + max(k, 1) - 1} ({k} of {bs}){refs}<br>"
            f"slots {b * bs}–{b * bs + max(k, 1) - 1}")  # fmt: skip


def _check_highlight(state: BlockPoolState, highlight: object) -> tuple[str, int] | None:
    if highlight is None:
        return None
    if not isinstance(highlight, (tuple, list)) or len(highlight) != 2 or not isinstance(highlight[0], str):
        raise InvalidArgumentError(
            f"highlight must be (request_id, token_position), e.g. ('A', 36); got {highlight!r}"
        )
    rid, pos = highlight
    check_int("highlight position", pos, minimum=0)
    ids = [r for r, _ in state.tables]
    if rid not in ids:
        raise UnknownRequestError(
            f"highlight names request {rid!r}, which holds no blocks in this snapshot; requests: {ids or 'none'}"
        )
    n = state.seq_len(rid)
    if pos >= n:
        raise InvalidArgumentError(
            f"highlight position {pos} is past the end of {rid!r}, which holds {n} tokens (positions 0..{n - 1})"
        )
    return rid, pos


def block_pool_spec(
    state: BlockPoolState,
    previous: BlockPoolState | None = None,
    *,
    highlight: tuple[str, int] | None = None,
    title: str | None = None,
    caption: str | None = None,
    strict: bool = True,
    table_rows: int = 0,
    table_cols: int = 0,
    label_px: float = 0,
    legend_marks: Collection[str] | None = None,
    head_lines: int = 0,
    sub_lines: int = 0,
) -> Spec:
    """The physical blocks as a grid coloured by status, and the block tables under it.

    ``highlight=(request_id, position)`` outlines that token's logical block in
    its table and its physical block in the grid, and marks its slot inside the
    block. ``strict=False`` (used by animations) skips a highlight the snapshot
    cannot show instead of raising. ``table_rows``/``table_cols`` reserve room
    for that many block tables and logical blocks, and ``label_px`` for
    table labels that wide, so that every frame of an animation has the same
    axes. ``legend_marks`` lists the marks the legend explains (default: those
    this snapshot shows).

    The grid spans the figure's width, with the tables under it on the same
    cell width, so that each cell is wide enough for its label; cell labels
    are fitted for a figure ``LABEL_WIDTH`` px wide.
    """
    check_state("state", state, BlockPoolState)
    shown = set(block_pool_marks(state) if legend_marks is None else legend_marks)
    try:
        hl = _check_highlight(state, highlight)
    except (InvalidArgumentError, UnknownRequestError):
        if strict:
            raise
        hl = None
    n = state.num_blocks
    bs = state.block_size
    cols, rows = grid_shape(n)
    tcols = max(max((len(t) for _, t in state.tables), default=0), table_cols, 1)
    trows = max(len(state.tables), table_rows, 1)
    seq_len = dict(state.seq_lens)
    table_labels = [table_label(rid, seq_len.get(rid, 0)) for rid, _ in state.tables]
    widest = max((text_px(line, 11) for label in table_labels for line in label.split("<br>")), default=0)
    left = _left_margin(max(widest, label_px), rows)
    # how much of a 10 px label fits across a cell, in a figure LABEL_WIDTH px wide
    show_text = cols <= 16
    detail = label_room((LABEL_WIDTH - left - 20) / cols) if show_text else 0
    owners = _owners(state)
    queue_pos = {b: i for i, b in enumerate(state.free_queue)}
    z: list[list[int | None]] = [[None] * cols for _ in range(rows)]
    text: list[list[str]] = [[""] * cols for _ in range(rows)]
    hover: list[list[str | None]] = [[None] * cols for _ in range(rows)]
    no_owner: tuple[tuple[str, int], ...] = ()
    for block in state.blocks:
        r, c = divmod(block.block_id, cols)
        if r >= rows:
            continue
        code, label, tip = _block_cell(block, tuple(owners.get(block.block_id, no_owner)), bs, detail)
        z[r][c] = code
        text[r][c] = label if show_text else ""
        pos = queue_pos.get(block.block_id)
        hover[r][c] = tip if pos is None else f"{tip}<br>free queue position {pos} (0 = handed out next)"

    def cell(b: int) -> tuple[int, int]:
        r, c = divmod(b, cols)
        return c, r

    # block tables: one row per request, one column per logical block
    tz: list[list[int | None]] = [[None] * tcols for _ in range(trows)]
    ttext: list[list[str]] = [[""] * tcols for _ in range(trows)]
    thover: list[list[str | None]] = [[None] * tcols for _ in range(trows)]
    table_text = tcols <= 24
    blocks = state.blocks
    where_in_tables: dict[int, list[tuple[int, int]]] = {}
    for row, (rid, table) in enumerate(state.tables):
        length = seq_len.get(rid, len(table) * bs)
        for logical, b in enumerate(table):
            block = blocks[b] if 0 <= b < n else None
            tz[row][logical] = STATUS_CODE[block.status] if block is not None else None
            k = max(0, min(bs, length - logical * bs))
            ttext[row][logical] = str(b) if table_text else ""
            thover[row][logical] = _table_cell(rid, logical, b, k, bs, block.ref_count if block else None)
            where_in_tables.setdefault(b, []).append((logical, row))
    table_labels += [""] * (trows - len(table_labels))

    data: list[dict[str, Any]] = [
        _heatmap(z, text, hover, xaxis="x", yaxis="y", name="blocks", font_size=10),
        _heatmap(tz, ttext, thover, xaxis="x2", yaxis="y2", name="block tables", font_size=11,
                 y=list(range(trows)), gap=2 if tcols <= 40 else 0),
    ]  # fmt: skip
    data += _status_legend(state.null_block is not None)

    def marks(kind: str, ids: Sequence[int], inset: float, cross: bool = False) -> list[dict[str, Any]]:
        grid_cells = [cell(b) for b in ids if 0 <= b < n]
        table_cells = [tc for b in ids for tc in where_in_tables.get(b, [])]
        if cross:
            xs, ys = cross_path([(x + 0.27, y - 0.22) for x, y in grid_cells], half=0.1)
            return [_mark(kind, xs, ys, width=2.5, legend=kind in shown)]
        gx, gy = rect_path(grid_cells, inset=inset)
        tx, ty = rect_path(table_cells, inset=inset)
        return [
            _mark(kind, gx, gy, legend=kind in shown),
            _mark(kind, tx, ty, xaxis="x2", yaxis="y2", legend=False),
        ]

    data += marks("hit", state.hit_blocks, 0.07)
    data += marks("new", state.new_blocks, 0.07)
    data += marks("copied", [copy for _, copy in state.copied_blocks], 0.03)
    data += marks("evicted", state.evicted_blocks, 0, cross=True)

    hl_text = ""
    if hl is not None:
        rid, pos = hl
        table = state.table(rid)
        logical, offset = divmod(pos, bs)
        physical = table[logical]
        slot = physical * bs + offset
        row = [r for r, _ in state.tables].index(rid)
        gx, gy = rect_path([cell(physical)], inset=-0.04)
        tx, ty = rect_path([(logical, row)], inset=-0.04)
        c, r = cell(physical)
        sx = c - 0.5 + (offset + 0.5) / bs
        data.append(_mark("highlight", gx, gy, width=4))
        data.append(_mark("highlight", tx, ty, xaxis="x2", yaxis="y2", legend=False, width=4))
        data.append({
            "type": "scatter", "mode": "markers+lines", "x": [sx, sx], "y": [r - 0.46, r + 0.46],
            "line": {"color": theme.YELLOW, "width": 3}, "marker": {"symbol": "triangle-down", "size": 9,
            "color": theme.YELLOW, "line": {"color": theme.BLACK, "width": 1}}, "name": f"slot {slot}",
            "showlegend": True, "legendgroup": "mark highlight", "hovertext": [f"slot {slot}"] * 2,
            "hovertemplate": "%{hovertext}<extra></extra>", "xaxis": "x", "yaxis": "y",
        })  # fmt: skip
        hl_text = (f"{rid} token {pos} → logical block {logical}, offset {offset} → physical block {physical} "
                   f"→ slot {physical}×{bs}+{offset} = {slot}")  # fmt: skip
    else:
        data.append(_mark("highlight", [], [], legend=False))
        data.append(_mark("highlight", [], [], xaxis="x2", yaxis="y2", legend=False))
        data.append({"type": "scatter", "mode": "markers+lines", "x": [], "y": [], "showlegend": False,
                     "name": "slot", "hoverinfo": "skip", "xaxis": "x", "yaxis": "y",
                     "legendgroup": "mark highlight"})  # fmt: skip

    counts = _summary_counts(state)
    sub = (f"{n} blocks of {bs} slots: {counts['in use']} in use, {counts['free, cached']} free but cached, "
           f"{counts['free']} free, {counts['never used']} never used · {len(state.tables)} block table(s)")  # fmt: skip
    if hl_text:
        sub += "<br>" + hl_text
    head = caption or title or "Block pool"

    # heights in px: the grid, a gap for the tables' axis, the tables; the legend under them
    cell_px = 52 if show_text else 18  # room for the id and a two-line owner
    grid_h, gap_h, tables_h = rows * cell_px, 58, trows * 34
    plot_h = grid_h + gap_h + tables_h
    xcols = max(cols, tcols)  # the tables use the grid's cell width unless they are longer than a grid row
    ticks_every = 1 if tcols <= 24 else math.ceil(tcols / 12)
    grid_ticks = list(range(0, cols, 1 if cols <= 16 else 4))
    ttl = title_text(head, sub)
    top = top_margin(ttl, True, head_lines, sub_lines)
    bottom = legend_height(data, left=left) + 16
    layout = base_layout(
        ttl,
        height=plot_h + top + bottom,
        margin={"l": left, "r": 20, "t": top, "b": bottom},
        showlegend=True,
        legend={"orientation": "h", "y": -6 / plot_h, "x": 0, "yanchor": "top", "font": {"size": 11}},
        xaxis={"domain": [0, 1], "range": [-0.5, cols - 0.5], "showgrid": False, "zeroline": False,
               "tickmode": "array", "tickvals": grid_ticks,
               "ticktext": [f"+{c}" if rows > 1 else str(c) for c in grid_ticks], "tickangle": 0,
               "side": "top", "fixedrange": True, "tickfont": {"size": 10},
               "title": {"text": "physical blocks" + (" (id = row start + column)" if rows > 1 else ""),
                         "standoff": 4, "font": {"size": 12}}},
        yaxis={"domain": [1 - grid_h / plot_h, 1], "range": [rows - 0.5, -0.5],
               "showgrid": False, "zeroline": False, "tickmode": "array",
               "tickvals": list(range(rows)), "ticktext": [str(r * cols) for r in range(rows)],
               "visible": rows > 1, "fixedrange": True, "tickfont": {"size": 10}},
        xaxis2={"domain": [0, 1], "range": [-0.5, xcols - 0.5], "showgrid": False, "zeroline": False,
                "tickmode": "array", "tickvals": list(range(0, tcols, ticks_every)),
                "ticktext": [f"L{i}" for i in range(0, tcols, ticks_every)], "side": "top", "fixedrange": True,
                "anchor": "y2", "tickfont": {"size": 10},
                "title": {"text": "block tables: logical block → physical block", "standoff": 4,
                          "font": {"size": 12}}},
        yaxis2={"domain": [0, tables_h / plot_h],
                "range": [trows - 0.5, -0.5], "showgrid": False, "zeroline": False, "tickmode": "array",
                "tickvals": list(range(trows)), "ticktext": table_labels, "anchor": "x2", "fixedrange": True,
                "tickfont": {"size": 11}},
        # always one annotation, empty when there are tables, so every frame has the same layout keys
        annotations=[{"text": "" if state.tables else "no block tables", "xref": "x2", "yref": "y2",
                      "x": (min(xcols, 8) - 1) / 2, "y": 0, "showarrow": False, "font": {"color": theme.GREY}}],
    )  # fmt: skip
    return {"data": data, "layout": layout}


def block_pool_figure(
    state: BlockPoolState, highlight: tuple[str, int] | None = None, *, title: str | None = None
) -> go.Figure:
    """Examples 2-5 and 7: blocks coloured by status, above the block tables that point into them.

    ``highlight=("A", 36)`` shows where token 36 of request A lives: logical
    block, offset, physical block and slot (example 2's translation).
    """
    return go.Figure(block_pool_spec(state, highlight=highlight, title=check_title(title)))


# ====================================================================== free queue (example 7)


def free_queue_spec(
    state: BlockPoolState,
    previous: BlockPoolState | None = None,
    *,
    title: str | None = None,
    caption: str | None = None,
    legend_marks: Collection[str] | None = None,
    head_lines: int = 0,
    sub_lines: int = 0,
) -> Spec:
    """The free queue from front (handed out next, so evicted first) to back, and what left it this op.

    With ``previous`` (the snapshot before the op) the blocks that left the
    queue are drawn above the place they left from, evicted hashes are named,
    and blocks that joined the queue are outlined. ``legend_marks`` lists the
    marks the legend explains (default: those this snapshot shows).
    """
    check_state("state", state, BlockPoolState)
    if previous is not None:
        check_state("previous", previous, BlockPoolState)
    shown = set(free_queue_marks(state, previous) if legend_marks is None else legend_marks)
    usable = max(1, state.num_blocks - (1 if state.null_block is not None else 0))
    cols = min(usable, 16 if usable <= 64 else 32)
    qrows = max(1, math.ceil(usable / cols))
    rows = qrows + 1  # row 0: blocks that left the queue in this op
    cell_w = (LABEL_WIDTH - 140) / cols  # the cell width in a figure LABEL_WIDTH px wide
    room = label_room(cell_w)
    detail = cols <= 16 and room >= 18
    show_text = cell_w >= 7 * len(str(state.num_blocks - 1)) + 4
    owners = _owners(state)
    queue_pos = {b: i for i, b in enumerate(state.free_queue)}
    z: list[list[int | None]] = [[None] * cols for _ in range(rows)]
    text: list[list[str]] = [[""] * cols for _ in range(rows)]
    hover: list[list[str | None]] = [[None] * cols for _ in range(rows)]
    blocks = state.blocks

    def label(block: BlockState, extra: str = "") -> str:
        if not show_text:
            return ""
        if not detail:
            return str(block.block_id)
        tag = fit_label(extra, room) if extra else cut_to((block.block_hash or "")[:8], room)
        return f"<b>{block.block_id}</b><br>{tag}" if tag else f"<b>{block.block_id}</b>"

    for i, b in enumerate(state.free_queue):
        r, c = divmod(i, cols)
        block = blocks[b]
        z[r + 1][c] = STATUS_CODE[block.status]
        text[r + 1][c] = label(block)
        hover[r + 1][c] = _block_hover(block, state, owners.get(b, []), queue_pos)

    # what left the queue: hits touched out of it, and blocks taken from the front
    prev_pos = {b: i for i, b in enumerate(previous.free_queue)} if previous is not None else {}
    prev_hash = {b.block_id: b.block_hash for b in previous.blocks} if previous is not None else {}
    hits, copies, left = _queue_leavers(state, previous)
    place_at_old = previous is not None and all(prev_pos.get(b, cols) < cols for b in left)
    evicted = set(state.evicted_blocks)
    left_cells: dict[int, tuple[int, int]] = {}
    for k, b in enumerate(left[:cols]):
        c = prev_pos[b] if place_at_old else k
        block = blocks[b]
        left_cells[b] = (c, 0)
        was = f" (was position {prev_pos[b]})" if b in prev_pos else ""
        if b in evicted:
            gone = prev_hash.get(b)
            tag = f"evict {gone}" if gone else "evicted"
            why = f"taken from the front{was}; its cached hash {gone or ''} was dropped (evicted)"
        elif b in state.new_blocks:
            tag, why = "new", f"taken from the front{was} for new tokens"
        elif b in copies:
            tag = f"copy of {copies[b]}"
            why = f"taken from the front{was} for a copy-on-write of block {copies[b]}"
        else:
            tag, why = "hit", f"cache hit{was}: touched out of the queue, ref count now {block.ref_count}"
        z[0][c] = STATUS_CODE[block.status]
        text[0][c] = label(block, tag)
        hover[0][c] = f"<b>block {b}</b> left the queue<br>{why}<br>" + _block_hover(
            block, state, owners.get(b, []), queue_pos
        )

    def qcell(b: int) -> tuple[int, int]:
        r, c = divmod(queue_pos[b], cols)
        return c, r + 1

    data: list[dict[str, Any]] = [
        _heatmap(z, text, hover, xaxis="x", yaxis="y", name="free queue", font_size=10)
    ]
    data += _status_legend(state.null_block is not None)
    hx, hy = rect_path([left_cells[b] for b in hits if b in left_cells], inset=0.07)
    nx, ny = rect_path([left_cells[b] for b in state.new_blocks if b in left_cells], inset=0.07)
    cx, cy = rect_path([left_cells[b] for b in copies if b in left_cells], inset=0.03)
    ex, ey = cross_path(
        [(left_cells[b][0] + 0.27, -0.22) for b in state.evicted_blocks if b in left_cells], half=0.1
    )
    joined = [b for b in state.free_queue if previous is not None and b not in prev_pos]
    fx, fy = rect_path([qcell(b) for b in joined], inset=0.07)
    data += [_mark("hit", hx, hy, legend="hit" in shown), _mark("new", nx, ny, legend="new" in shown),
             _mark("copied", cx, cy, legend="copied" in shown),
             _mark("evicted", ex, ey, width=2.5, legend="evicted" in shown),
             _mark("freed", fx, fy, legend="freed" in shown)]  # fmt: skip

    cached = sum(1 for b in state.free_queue if blocks[b].block_hash is not None)
    if state.free_queue:
        sub = (
            f"{len(state.free_queue)} free blocks, {cached} still cached · front (next out): block "
            f"{state.free_queue[0]} · back: block {state.free_queue[-1]}"
        )
    else:
        sub = "the free queue is empty: every block is in use"
    if previous is None and left:
        sub += " · pass previous= to place leavers where they left"
    head = caption or title or "Free queue"
    if "free queue" not in head.lower() and "free list" not in head.lower():
        head = f"Free queue · {head}"
    if qrows == 1:
        ticktext = ["left the queue", "free queue"]
    else:
        ticktext = ["left the queue"] + [
            f"{r * cols}–{min(usable, (r + 1) * cols) - 1}"
            + (" front" if r == 0 else " back" if r == qrows - 1 else "")
            for r in range(qrows)
        ]
    cell_px = 52 if detail else 24  # room for the id and a two-line tag
    plot_h = rows * cell_px
    ttl = title_text(head, sub)
    top = top_margin(ttl, True, head_lines, sub_lines)
    bottom = legend_height(data, left=120) + 16
    layout = base_layout(
        ttl,
        height=plot_h + top + bottom,
        margin={"l": 120, "r": 20, "t": top, "b": bottom},
        showlegend=True,
        legend={"orientation": "h", "y": -6 / plot_h, "x": 0, "yanchor": "top", "font": {"size": 11}},
        xaxis={"range": [-0.5, cols - 0.5], "showgrid": False, "zeroline": False, "fixedrange": True,
               "tickmode": "array", "tickvals": list(range(cols)), "ticktext": [str(c) for c in range(cols)],
               "side": "top", "tickfont": {"size": 10},
               "title": {"text": "queue position: front (handed out next, evicted first) → back",
                         "standoff": 4, "font": {"size": 12}}},
        yaxis={"range": [rows - 0.5, -0.5], "showgrid": False, "zeroline": False, "fixedrange": True,
               "tickmode": "array", "tickvals": list(range(rows)), "ticktext": ticktext,
               "tickfont": {"size": 11}},
        shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": 0.5, "y1": 0.5,
                 "line": {"color": theme.GREY, "width": 1, "dash": "dot"}}],
    )  # fmt: skip
    return {"data": data, "layout": layout}


def free_queue_figure(
    state: BlockPoolState, previous: BlockPoolState | None = None, *, title: str | None = None
) -> go.Figure:
    """Example 7: the free queue front to back; hits leaving it and evictions marked.

    Give ``previous`` (the snapshot before the op) to draw leavers above where
    they left from and to name the hashes the op evicted.
    """
    return go.Figure(free_queue_spec(state, previous, title=check_title(title)))


# ====================================================================== radix tree (example 8)


def _radix_layout(
    root: RadixNodeState,
) -> tuple[dict[int, tuple[float, int]], list[tuple[RadixNodeState, int]]]:
    """x (leaves on 0, 1, 2, ...; a parent centred over its children) and depth of every node."""
    pos: dict[int, tuple[float, int]] = {}
    order: list[tuple[RadixNodeState, int]] = []
    next_leaf = 0.0
    stack: list[tuple[RadixNodeState, int, bool]] = [(root, 0, False)]
    while stack:
        node, depth, done = stack.pop()
        if done:
            xs = [pos[c.node_id][0] for c in node.children]
            pos[node.node_id] = ((xs[0] + xs[-1]) / 2, depth)
            continue
        order.append((node, depth))
        if not node.children:
            pos[node.node_id] = (next_leaf, depth)
            next_leaf += 1
            continue
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in reversed(node.children))
    return pos, order


def _fit_run(tokens: Sequence[int], chars: int) -> str:
    """A token run in at most about ``chars`` characters: all ids, the ends and the length, or the length."""
    for text in (
        "[" + ", ".join(map(str, tokens)) + "]",
        f"[{tokens[0]}, {tokens[1]}, … {tokens[-1]}] ({len(tokens)})" if len(tokens) > 3 else "",
        f"[{tokens[0]} … {tokens[-1]}] ({len(tokens)})" if len(tokens) > 1 else "",
    ):
        if text and len(text) <= chars:
            return text
    return f"{len(tokens)} tok"


def radix_tree_spec(
    state: RadixState,
    previous: RadixState | None = None,
    *,
    title: str | None = None,
    caption: str | None = None,
    extent: tuple[int, int, int] = (0, 0, 0),
    legend_marks: Collection[str] | None = None,
    head_lines: int = 0,
    sub_lines: int = 0,
) -> Spec:
    """Node boxes with their token runs, lock counts and last access; splits, the match and evictions marked.

    Up to 8 leaves the tree grows downwards; a wider tree grows to the right,
    one row per leaf, so its labels keep their room. ``extent=(leaves, depth,
    evicted runs)`` reserves room for a larger tree so that every frame of an
    animation keeps the same scale and direction. ``legend_marks`` lists the
    marks the legend explains (default: those this snapshot shows).
    """
    check_state("state", state, RadixState)
    shown = set(radix_marks(state) if legend_marks is None else legend_marks)
    pos, order = _radix_layout(state.root)  # node id -> (leaf coordinate u, depth d)
    nodes = [n for n, _ in order]
    leaves = max(sum(1 for n in nodes if not n.children), extent[0], 1)
    n_evicted = max(len(state.evicted_runs), extent[2])
    max_u = leaves - 1
    max_d = max(max((d for _, d in pos.values()), default=0), extent[1])
    across = leaves > 8  # grow to the right, one row per leaf
    if across:
        half_w, half_h = 0.44, 0.36  # along depth (x), along leaves (y)
        evicted_at = [(max_d + 1.3, float(i)) for i in range(len(state.evicted_runs))]
        unit_px = 940 / (max_d + 1 + (1.3 if n_evicted else 0))
    else:
        half_w, half_h = 0.44, 0.32  # along leaves (x), along depth (y)
        evicted_at = [(max_u + 1.3, 1.0 + i) for i in range(len(state.evicted_runs))]
        unit_px = 940 / (max_u + 1 + (1.3 if n_evicted else 0))
    chars = max(4, int(2 * half_w * unit_px / 6.8))

    def xy(node_id: int) -> tuple[float, float]:
        u, d = pos[node_id]
        return (float(d), u) if across else (u, float(d))

    root_w, root_h = (0.2, half_h) if across else (min(half_w, 0.2), 0.22)
    boxes: dict[str, list[tuple[float, float]]] = {k: [] for k in ("root", "unlocked", "locked")}
    ex: list[float | None] = []
    ey: list[float | None] = []
    tx, ty, ttext, tcolor, hover = [], [], [], [], []
    prefix_len: dict[int, int] = {state.root.node_id: 0}
    for node, depth in order:
        x0, y0 = xy(node.node_id)
        for child in node.children:
            prefix_len[child.node_id] = prefix_len[node.node_id] + len(child.key)
            x1, y1 = xy(child.node_id)
            if across:
                start = x0 + (root_w if depth == 0 else half_w)
                mid = (start + x1 - half_w) / 2
                ex += [start, mid, mid, x1 - half_w, None]
                ey += [y0, y0, y1, y1, None]
            else:
                start = y0 + (root_h if depth == 0 else half_h)
                mid = (start + y1 - half_h) / 2
                ex += [x0, x0, x1, x1, None]
                ey += [start, mid, mid, y1 - half_h, None]
        kind = "root" if depth == 0 else ("locked" if node.lock_ref > 0 else "unlocked")
        boxes[kind].append((x0, y0))
        tx.append(x0)
        ty.append(y0)
        if depth == 0:
            ttext.append("<b>root</b>")
            hover.append(f"<b>root</b> (node {node.node_id})<br>{state.total_tokens} tokens cached below")
            tcolor.append("white")
            continue
        lock = (f"lock {node.lock_ref}" if node.lock_ref else "unlocked") + f" · t={node.last_access}"
        if len(lock) > chars:
            lock = f"L{node.lock_ref} t{node.last_access}"
        ns = f"<br>ns {_short(node.extra_key, chars - 3)}" if node.extra_key is not None else ""
        ttext.append(f"{_fit_run(node.key, chars)}<br>{lock}{ns}")
        tcolor.append("white" if kind == "locked" else theme.INK)
        extra = f"<br>namespace (extra_key) {node.extra_key}" if node.extra_key is not None else ""
        hover.append(
            f"<b>node {node.node_id}</b> · {len(node.key)} tokens {tokens_text(node.key, 16)}<br>"
            f"lock_ref {node.lock_ref} ({'protected' if node.lock_ref else 'evictable'})"
            f" · last access t={node.last_access}<br>"
            f"prefix from the root: {prefix_len[node.node_id]} tokens"
            f"{' · leaf' if not node.children else ''}{extra}"
        )
    for (x, y), run in zip(evicted_at, state.evicted_runs, strict=True):
        tx.append(x)
        ty.append(y)
        ttext.append(f"{_fit_run(run, chars)}<br>evicted")
        tcolor.append(theme.VERMILLION)
        hover.append(f"<b>evicted by this op</b>: {len(run)} tokens {tokens_text(run, 16)}")

    def filled(kind: str) -> dict[str, Any]:
        w, h = (root_w, root_h) if kind == "root" else (half_w, half_h)
        xs, ys = rect_path(boxes[kind], w, h)
        return {"type": "scatter", "mode": "lines", "x": xs, "y": ys, "fill": "toself",
                "fillcolor": theme.NODE_COLORS[kind], "line": {"color": theme.INK, "width": 1}, "name": kind,
                "hoverinfo": "skip", "showlegend": False, "legendgroup": kind}  # fmt: skip

    pad_w, pad_h = (0.03, 0.05) if across else (0.03, 0.06)
    split_x, split_y = rect_path(
        [xy(i) for i in state.split_nodes if i in pos], half_w + pad_w, half_h + pad_h
    )
    matched = [xy(state.matched_node)] if state.matched_node in pos else []
    mx, my = rect_path(matched, half_w + 2 * pad_w, half_h + 2 * pad_h)
    evx, evy = rect_path(evicted_at, half_w, half_h)
    data: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines", "x": ex, "y": ey, "line": {"color": theme.GREY, "width": 1.5},
         "hoverinfo": "skip", "showlegend": False, "name": "edges"},
        filled("root"), filled("unlocked"), filled("locked"),
        legend_entry("unlocked (evictable)", theme.NODE_COLORS["unlocked"], group="unlocked"),
        legend_entry("locked (protected)", theme.NODE_COLORS["locked"], group="locked"),
        line_trace("created by a split in this op", split_x, split_y, color=theme.BLACK, dash="dash", width=2.5,
                   legend="split" in shown),
        line_trace("the last match ended here", mx, my, color=theme.GREEN, width=3, legend="matched" in shown),
        line_trace("evicted by this op", evx, evy, color=theme.VERMILLION, dash="dot", width=2.5,
                   legend="evicted" in shown),
        {"type": "scatter", "mode": "text", "x": tx, "y": ty, "text": ttext, "hovertext": hover,
         "hovertemplate": "%{hovertext}<extra></extra>", "textfont": {"size": 11, "color": tcolor,
         "family": theme.MONO_FAMILY}, "showlegend": False, "name": "nodes"},
    ]  # fmt: skip
    sub = (f"{state.total_tokens} tokens in {len(nodes) - 1} nodes · evictable {state.evictable_size}, "
           f"protected {state.protected_size}" + (f" · page size {state.page_size}" if state.page_size > 1 else "")
           + " · t = last access")  # fmt: skip
    head = caption or title or "Radix tree"
    # one annotation always (empty when nothing was evicted), so frames share their layout keys
    label_at = (max_d + 1.3, -0.75) if across else (max_u + 1.3, 0.4)
    annotations = [{"x": label_at[0], "y": label_at[1], "text": "<b>evicted by this op</b>" if evicted_at else "",
                    "showarrow": False, "font": {"color": theme.VERMILLION, "size": 12}}]  # fmt: skip
    ttl = title_text(head, sub)
    top = top_margin(ttl, False, head_lines, sub_lines)
    if across:
        rows = max(leaves, n_evicted)
        plot_h = rows * 46 + 40
        xr = [-0.6, (max_d + 1.3 if n_evicted else max_d) + 0.6]
        yr = [rows - 1 + 0.6, -1.0]
    else:
        lowest = max(max_d, n_evicted)
        plot_h = (lowest + 1) * 95
        xr = [-0.6, (max_u + 1.3 if n_evicted else max_u) + 0.6]
        yr = [lowest + 0.6, -0.6]
    bottom = legend_height(data, left=20) + 14
    layout = base_layout(
        ttl,
        height=plot_h + top + bottom,
        margin={"l": 20, "r": 20, "t": top, "b": bottom},
        showlegend=True,
        legend={"orientation": "h", "y": -4 / plot_h, "x": 0, "yanchor": "top", "font": {"size": 11}},
        xaxis={"visible": False, "range": xr, "fixedrange": True},
        yaxis={"visible": False, "range": yr, "fixedrange": True},
        annotations=annotations,
    )  # fmt: skip
    return {"data": data, "layout": layout}


def radix_tree_figure(state: RadixState, *, title: str | None = None) -> go.Figure:
    """Example 8: the radix tree's nodes with token runs, lock counts and access times."""
    return go.Figure(radix_tree_spec(state, title=check_title(title)))


# ====================================================================== hash chain (example 6)


def _digests_of(
    name: str, value: object, block_size: int | None, scheme: str, salt: str | None
) -> tuple[list[str], list[str], list[int]]:
    """(hex digests, token texts per block, tokens left in a partial block) for one row."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgumentError(
            f"chains[{name!r}] must be a list of digests (bytes or hex strings) or a list of token ids, "
            f"got {type(value).__name__}"
        )
    items = list(value)
    if items and all(isinstance(v, (bytes, str)) for v in items):
        return [v.hex() if isinstance(v, bytes) else v for v in items], [""] * len(items), []
    if block_size is None:
        raise InvalidArgumentError(
            f"chains[{name!r}] holds token ids: give block_size= so the blocks can be hashed"
        )
    digests = hashing.block_hashes(items, block_size, salt=salt, scheme=scheme)
    texts = [tokens_text(items[i * block_size : (i + 1) * block_size], 16) for i in range(len(digests))]
    tail = items[len(digests) * block_size :]
    return [d.hex() for d in digests], texts, tail


def hash_chain_spec(
    chains: Mapping[str, Sequence[Any]],
    *,
    block_size: int | None = None,
    scheme: str = "lesson",
    salts: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Spec:
    """Rows of chained block hashes, each block compared with the first row's block at the same index."""
    if not isinstance(chains, Mapping) or not chains:
        raise InvalidArgumentError("chains must be a non-empty dict: row name -> digests or token ids")
    if block_size is not None:
        check_int("block_size", block_size, minimum=1)
    if salts is not None and not isinstance(salts, Mapping):
        raise InvalidArgumentError("salts must be a dict: row name -> cache salt")
    salts = dict(salts or {})
    unknown = sorted(set(salts) - set(chains))
    if unknown:
        raise InvalidArgumentError(f"salts names rows that chains does not have: {unknown}")
    rows = []
    for name, value in chains.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"row names must be strings, got {name!r}")
        rows.append((name, *_digests_of(name, value, block_size, scheme, salts.get(name))))
    ncols = max(max(len(d) + (1 if tail else 0) for _, d, _, tail in rows), 1)
    kinds = list(theme.CHAIN_COLORS)
    scale = discrete_colorscale([theme.CHAIN_COLORS[k] for k in kinds])
    base = rows[0][1]
    z: list[list[int | None]] = []
    text: list[list[str]] = []
    hover: list[list[str | None]] = []
    for r, (name, digests, texts, tail) in enumerate(rows):
        zr: list[int | None] = [None] * ncols
        tr = [""] * ncols
        hr: list[str | None] = [None] * ncols
        first_change = next((i for i, d in enumerate(digests) if i >= len(base) or d != base[i]), None)
        for i, d in enumerate(digests):
            same = i < len(base) and d == base[i]
            kind = kinds[0] if same else kinds[1]
            zr[i] = kinds.index(kind)
            mark = "reference" if r == 0 else ("same" if same else "changed")
            tr[i] = f"<b>{d[:8]}</b><br>{mark}"
            why = ""
            if not same and first_change is not None and i > first_change:
                why = f"<br>changed because block {first_change} changed: each hash covers its parent's"
            elif not same:
                why = "<br>its tokens (or salt) differ from the first row's"
            salt = f"<br>salt {salts[name]!r}" if name in salts else ""
            tok = f"<br>tokens {texts[i]}" if texts[i] else ""
            hr[i] = f"<b>{name}</b> · block {i}<br>hash {d[:16]}…{tok}{salt}{why}"
        if tail:
            i = len(digests)
            zr[i] = kinds.index(kinds[2])
            tr[i] = f"{len(tail)} tok<br>no hash"
            hr[i] = (
                f"<b>{name}</b> · partial block {i}: {len(tail)} of {block_size} tokens {tokens_text(tail)}"
                "<br>not hashed: its content still changes as tokens are appended"
            )
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    data: list[dict[str, Any]] = [{
        "type": "heatmap", "z": z, "text": text, "hovertext": hover, "colorscale": scale, "zmin": -0.5,
        "zmax": len(kinds) - 0.5, "showscale": False, "xgap": 3, "ygap": 3, "texttemplate": "%{text}",
        "textfont": {"size": 12, "family": theme.MONO_FAMILY}, "hovertemplate": "%{hovertext}<extra></extra>",
        "hoverongaps": False, "name": "hashes",
    }]  # fmt: skip
    data += [legend_entry(k, theme.CHAIN_COLORS[k]) for k in kinds]
    first_len = len(base)
    what = f"{block_size}-token blocks, " if block_size else ""
    sub = (
        f"{what}scheme {scheme!r}: each block's hash covers its parent's hash, so one change "
        f"changes every later hash · compared with {rows[0][0]!r} ({first_len} full blocks)"
    )
    ttl = title_text(title or "Chained block hashes", sub)
    top = top_margin(ttl, True)
    plot_h = len(rows) * 56
    bottom = legend_height(data, left=110, font_px=13) + 16
    layout = base_layout(
        ttl,
        height=plot_h + top + bottom,
        margin={"l": 110, "r": 20, "t": top, "b": bottom},
        legend={"orientation": "h", "y": -6 / plot_h, "x": 0, "yanchor": "top"},
        xaxis={"range": [-0.5, ncols - 0.5], "tickmode": "array", "tickvals": list(range(ncols)),
               "ticktext": [f"block {i}" for i in range(ncols)], "side": "top", "showgrid": False,
               "zeroline": False, "fixedrange": True},
        yaxis={"range": [len(rows) - 0.5, -0.5], "tickmode": "array", "tickvals": list(range(len(rows))),
               "ticktext": [name for name, *_ in rows], "showgrid": False, "zeroline": False, "fixedrange": True},
    )  # fmt: skip
    return {"data": data, "layout": layout}


def hash_chain_figure(
    chains: Mapping[str, Sequence[Any]],
    *,
    block_size: int | None = None,
    scheme: str = "lesson",
    salts: Mapping[str, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Example 6: chained block hashes per row; blocks whose hash differs from the first row's are marked.

    ``chains`` maps a row name to its digests (``bytes`` or hex strings, as
    ``kvlab.core.hashing.block_hashes`` returns) or to its token ids (then give
    ``block_size``; ``salts`` maps row names to a cache salt).
    """
    return go.Figure(hash_chain_spec(chains, block_size=block_size, scheme=scheme, salts=salts,
                                     title=check_title(title)))  # fmt: skip


# ====================================================================== bars and lines (examples 3, 9, 10, 13)


def _chart_layout(
    title: dict[str, Any],
    plot_h: int,
    data: list[dict[str, Any]],
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


_SERIES_STYLES = (
    (theme.BLUE, "solid", "circle"),
    (theme.VERMILLION, "dash", "square"),
    (theme.GREEN, "dot", "diamond"),
    (theme.ORANGE, "dashdot", "triangle-up"),
    (theme.PURPLE, "longdash", "x"),
    (theme.SKY_BLUE, "solid", "star"),
    (theme.BLACK, "dash", "cross"),
)


def _named_values(data: object, value_fields: tuple[str, ...], what: str) -> list[tuple[str, Any]]:
    """(name, value-or-record) pairs from a dict or a list of records with a name field."""
    if isinstance(data, Mapping):
        pairs = list(data.items())
    elif isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        pairs = []
        for i, rec in enumerate(data):
            name = field(rec, "name", "scenario", "method", "label", "policy", default=f"{what} {i + 1}")
            pairs.append((str(name), rec))
    else:
        raise InvalidArgumentError(
            f"expected a dict name -> {what} or a list of records, got {type(data).__name__}"
        )
    if not pairs:
        raise InvalidArgumentError(f"no data: give at least one {what}")
    for name, _ in pairs:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"names must be strings, got {name!r}")
    return pairs


def _hit_rate_of(name: str, value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rate = float(value)
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
    check_title(title)
    pairs = _named_values(rates, ("hit_rate",), "hit rate")
    names = [n for n, _ in pairs]
    values = [_hit_rate_of(n, v) for n, v in pairs]
    # a rate's label sits on its own bar, or on the miss bar when the hit bar is too short to hold it
    labels = [f"{100 * v:.1f}%" for v in values]
    hit = {
        "type": "bar", "orientation": "h", "y": names, "x": [100 * v for v in values], "name": "hit (from cache)",
        "marker": {"color": theme.BLUE}, "text": [t if v >= 0.08 else "" for t, v in zip(labels, values, strict=True)],
        "textposition": "inside", "insidetextanchor": "start", "textfont": {"color": "white"},
        "hovertemplate": "%{y}: %{x:.1f}% of prompt tokens were cache hits<extra></extra>",
    }  # fmt: skip
    miss = {
        "type": "bar", "orientation": "h", "y": names, "x": [100 * (1 - v) for v in values],
        "name": "miss (prefilled)", "marker": {"color": theme.LIGHT_GREY, "pattern": {"shape": "/",
        "fgcolor": theme.GREY, "size": 7}}, "hovertemplate": "%{y}: %{x:.1f}% computed<extra></extra>",
        "text": [f"hit {t}" if v < 0.08 else "" for t, v in zip(labels, values, strict=True)],
        "textposition": "inside", "insidetextanchor": "start", "textfont": {"color": theme.INK},
    }  # fmt: skip
    layout = _chart_layout(
        title_text(title or "Prefix-cache hit rate", "share of prompt tokens served from the cache"),
        len(names) * 44 + 10, [hit, miss], left=20, barmode="stack",
        xaxis={"range": [0, 100], "title": {"text": "% of prompt tokens"}, "ticksuffix": "%"},
        yaxis={"autorange": "reversed", "automargin": True},
    )  # fmt: skip
    return go.Figure({"data": [hit, miss], "layout": layout})


def _series(data: object, what: str, value_fields: tuple[str, ...]) -> list[tuple[str, list[float]]]:
    pairs = _named_values(data, value_fields, what)
    out = []
    for name, values in pairs:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            values = field(values, *value_fields)
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise InvalidArgumentError(
                f"{name}: expected a list of numbers per turn, got {type(values).__name__}"
            )
        nums = []
        for i, v in enumerate(values):
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                v = field(v, *value_fields)
            nums.append(check_number(f"{name}[{i}]", v))
        out.append((name, nums))
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
    check_title(title)
    if not isinstance(cumulative, bool):
        raise InvalidArgumentError(f"cumulative must be True or False, got {cumulative!r}")
    rows = _series(series, "series", value_fields or ("values",))
    data = []
    for i, (name, values) in enumerate(rows):
        color, dash, symbol = _SERIES_STYLES[i % len(_SERIES_STYLES)]
        ys = values
        if cumulative:
            total, ys = 0.0, []
            for v in values:
                total += v
                ys.append(total)
        data.append({
            "type": "scatter", "mode": "lines+markers", "name": f"{name} (total {sum(values):,.0f})",
            "x": list(range(1, len(ys) + 1)), "y": ys, "line": {"color": color, "dash": dash, "width": 2.5},
            "marker": {"symbol": symbol, "size": 8, "color": color},
            "hovertemplate": f"{name}<br>turn %{{x}}: %{{y:,.0f}}<extra></extra>",
        })  # fmt: skip
    longest = max((len(v) for _, v in rows), default=1)
    layout = _chart_layout(
        title_text(title), 280, data,
        xaxis={"title": {"text": "turn"}, "dtick": 1 if longest <= 20 else None, "range": [0.5, longest + 0.5]},
        yaxis={"title": {"text": y_title + (" (running total)" if cumulative else "")}, "rangemode": "tozero"},
    )  # fmt: skip
    return go.Figure({"data": data, "layout": layout})


def tokens_per_turn_figure(
    series: Mapping[str, Any] | Sequence[Any], *, cumulative: bool = False, title: str | None = None
) -> go.Figure:
    """Example 13: tokens the server must process on each turn, one line per history policy.

    ``series`` maps a policy name to its per-turn counts: a list of numbers, a
    list of records with ``processed_tokens`` (or ``processed``, ``prompt_n``,
    ``computed_tokens``), or a run with such ``turns`` (``kvlab.server.agents.example_13()``
    and ``kvlab.server.layout.example_9()`` work as they are).
    """
    return per_turn_figure(
        series,
        y_title="tokens processed",
        title=title or "Tokens processed per turn",
        value_fields=("turns", "processed_tokens", "processed", "prompt_n", "computed_tokens", "computed"),
        cumulative=cumulative,
    )


def cache_n_figure(
    runs: Mapping[str, Sequence[Any]] | Sequence[Any], *, title: str | None = None
) -> go.Figure:
    """Example 10: each turn's prompt split into tokens from the cache (cache_n) and processed (prompt_n).

    ``runs`` maps a run name to its turns, each a record with ``cache_n`` and
    ``prompt_n`` (or ``prompt_tokens``, from which prompt_n = prompt_tokens -
    cache_n), or a ``(cache_n, prompt_n)`` pair. A single list of turns is one run.
    """
    check_title(title)
    if isinstance(runs, Sequence) and not isinstance(runs, (str, bytes)):
        runs = {"": runs}
    if not isinstance(runs, Mapping) or not runs:
        raise InvalidArgumentError("runs must be a dict run name -> list of turns, or one list of turns")
    parsed: list[tuple[str, list[int], list[int]]] = []
    for name, turns in runs.items():
        if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence) or not turns:
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
        parsed.append((str(name), cache_n, prompt_n))
    k = len(parsed)
    gap = 0.08
    width = (1 - gap * (k - 1)) / k
    data, annotations = [], []
    layout_axes: dict[str, Any] = {}
    ymax = max(c + p for _, cs, ps in parsed for c, p in zip(cs, ps, strict=True))
    for i, (name, cs, ps) in enumerate(parsed):
        ax = "" if i == 0 else str(i + 1)
        turns = list(range(1, len(cs) + 1))
        for label, values, color, pattern in (
            ("cache_n: from the cache", cs, theme.BLUE, ""),
            ("prompt_n: processed", ps, theme.ORANGE, "/"),
        ):
            data.append({
                "type": "bar", "x": turns, "y": values, "name": label, "legendgroup": label,
                "showlegend": i == 0, "marker": {"color": color, "pattern": {"shape": pattern, "size": 7,
                "fgcolor": theme.INK, "fgopacity": 0.3}}, "textposition": "inside",
                "text": [v if v >= 0.06 * ymax else "" for v in values], "textangle": 0,
                "xaxis": f"x{ax}", "yaxis": f"y{ax}",
                "hovertemplate": f"{name} turn %{{x}}: {label.split(':')[0]} %{{y}}<extra></extra>",
            })  # fmt: skip
        x0 = i * (width + gap)
        layout_axes[f"xaxis{ax}"] = {
            "domain": [x0, x0 + width],
            "title": {"text": "turn"},
            "dtick": 1,
            "anchor": f"y{ax}",
        }
        layout_axes[f"yaxis{ax}"] = {
            "anchor": f"x{ax}",
            "range": [0, ymax * 1.08],
            "title": {"text": "prompt tokens"} if i == 0 else None,
            "matches": "y" if i else None,
        }
        total = sum(ps)
        if name:
            annotations.append({"text": f"<b>{name}</b><br>processed {total:,} tokens", "xref": "paper",
                                "yref": "paper", "x": x0 + width / 2, "y": 1.02, "showarrow": False,
                                "xanchor": "center", "yanchor": "bottom"})  # fmt: skip
    layout = _chart_layout(
        title_text(title or "Prompt tokens per turn: cached (cache_n) and processed (prompt_n)"), 250, data,
        above=44 if annotations else 0, barmode="stack", annotations=annotations, **layout_axes,
    )  # fmt: skip
    return go.Figure({"data": data, "layout": layout})


def utilization_figure(fills: Mapping[str, Any] | Sequence[Any], *, title: str | None = None) -> go.Figure:
    """Example 3 (and 1): how much of a pool stores KV, is held but unused, or is free, one bar per method.

    Each value is a record with the pool size (``pool_size``/``pool``), the
    tokens stored (``tokens_stored``/``stored``) and the slots held but unused
    (``wasted_slots``/``internal_fragmentation``/``wasted``; default 0), and
    optionally ``requests``; ``kvlab.models.utilization.Fill`` objects work as they are.
    """
    check_title(title)
    pairs = _named_values(fills, ("tokens_stored",), "fill")
    names, stored, wasted, free, requests = [], [], [], [], []
    for name, rec in pairs:
        pool = check_number(f"{name} pool size", field(rec, "pool_size", "pool", "capacity"))
        s = check_number(f"{name} tokens stored", field(rec, "tokens_stored", "stored"))
        w = check_number(f"{name} wasted slots", field(rec, "wasted_slots", "internal_fragmentation", "wasted",
                                                       default=0))  # fmt: skip
        if pool <= 0 or s < 0 or w < 0 or s + w > pool:
            raise InvalidArgumentError(
                f"{name}: need pool > 0 and 0 <= stored + wasted <= pool, got pool {pool}, stored {s}, wasted {w}"
            )
        names.append(name)
        stored.append(100 * s / pool)
        wasted.append(100 * w / pool)
        free.append(100 * (pool - s - w) / pool)
        n = field(rec, "requests", default=None)
        requests.append(f" · {n} requests" if n is not None else "")
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
    layout = _chart_layout(
        title_text(title or "Pool utilization", "share of the pool's slots"), len(names) * 56 + 10, data,
        left=20, barmode="stack",
        xaxis={"range": [0, 100], "ticksuffix": "%", "title": {"text": "% of pool slots"}},
        yaxis={"autorange": "reversed", "automargin": True},
    )  # fmt: skip
    return go.Figure({"data": data, "layout": layout})


def block_pool_marks(state: BlockPoolState) -> set[str]:
    """The marks a block-pool snapshot shows: what its operation hit, allocated, copied, evicted."""
    found = {"hit": state.hit_blocks, "new": state.new_blocks, "copied": state.copied_blocks,
             "evicted": state.evicted_blocks}  # fmt: skip
    return {k for k, v in found.items() if v}


def _queue_leavers(
    state: BlockPoolState, previous: BlockPoolState | None
) -> tuple[list[int], dict[int, int], list[int]]:
    """(hits that came out of the queue, copy-on-write target -> source, every block that left the queue).

    Blocks leave the free queue three ways: taken from the front for new
    tokens, taken from the front for a copy-on-write, or touched out of it by
    a cache hit. A hit on a block that was already in use (a fork shares its
    parent's blocks the same way) did not come from the queue: with
    ``previous`` that is read from the old queue; without it, a hit block now
    held more than once was held before the op.
    """
    queued = set(state.free_queue)
    if previous is not None:
        was_queued = set(previous.free_queue)
        hits = [b for b in state.hit_blocks if b in was_queued]
    else:
        refs = {b.block_id: b.ref_count for b in state.blocks}
        hits = [b for b in state.hit_blocks if refs.get(b, 0) <= 1]
    copies = {target: source for source, target in state.copied_blocks}
    left = list(dict.fromkeys([*state.new_blocks, *copies, *hits]))
    return hits, copies, [b for b in left if b not in queued]


def free_queue_marks(state: BlockPoolState, previous: BlockPoolState | None) -> set[str]:
    """The marks a free-queue snapshot shows (blocks that left the queue, evictions, blocks that joined)."""
    hits, copies, left = _queue_leavers(state, previous)
    marks = {k for k in block_pool_marks(state) if k in ("new", "evicted")}
    if any(b in left for b in hits):
        marks.add("hit")
    if any(b in left for b in copies):
        marks.add("copied")
    if previous is not None and set(state.free_queue) - set(previous.free_queue):
        marks.add("freed")
    return marks


def radix_marks(state: RadixState) -> set[str]:
    """The marks a radix snapshot shows: a split, where a match ended, evicted runs."""
    found = {
        "split": state.split_nodes,
        "matched": state.matched_node is not None,
        "evicted": state.evicted_runs,
    }
    return {k for k, v in found.items() if v}


def radix_extent(state: RadixState) -> tuple[int, int, int]:
    """(leaves, depth, evicted runs) of a radix snapshot: the room its figure needs."""
    leaves = depth = 0
    for d, node in state.root.walk():
        depth = max(depth, d)
        leaves += not node.children
    return leaves, depth, len(state.evicted_runs)


def view_hints(view: str, states: Sequence[Any]) -> dict[str, Any]:
    """Keyword arguments that give every snapshot of a history the same axes in ``view``."""
    if view == "block_pool":
        labels = (table_label(rid, n) for s in states for rid, n in s.seq_lens)
        return {
            "table_rows": max((len(s.tables) for s in states), default=0),
            "table_cols": max((len(t) for s in states for _, t in s.tables), default=0),
            "label_px": max(
                (text_px(line, 11) for label in labels for line in label.split("<br>")), default=0
            ),
            "legend_marks": set().union(*(block_pool_marks(s) for s in states)),
        }
    if view == "free_queue":
        pairs = zip(states, [None, *states[:-1]], strict=True)
        return {"legend_marks": set().union(*(free_queue_marks(s, p) for s, p in pairs))}
    if view == "radix":
        extents = [radix_extent(s) for s in states]
        return {
            "extent": tuple(max(e[i] for e in extents) for i in range(3)),
            "legend_marks": set().union(*(radix_marks(s) for s in states)),
        }
    return {}


#: Spec builders by view name, with the snapshot type they draw; used by animations and the stepper.
VIEW_SPECS: dict[str, tuple[type, Any]] = {
    "contiguous": (ContiguousState, contiguous_spec),
    "block_pool": (BlockPoolState, block_pool_spec),
    "free_queue": (BlockPoolState, free_queue_spec),
    "radix": (RadixState, radix_tree_spec),
}
