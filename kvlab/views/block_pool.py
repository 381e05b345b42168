"""Examples 2-5 and 7's view: the physical blocks of a paged pool as a grid, the block tables under it.

A block is coloured by its status (in use, free but cached, free, never used,
the null block). A never-used block is on the free list like any other free block, so the subtitle
counts it as free ("3 free (never used)") and the legend calls it "free, never used"; the legend
lists only the statuses the pool's blocks have (in any frame of an animation), so "free, cached"
appears only once a block is cached. Whatever the last operation did (hit, allocated, copied,
evicted) is outlined or crossed in the grid and in the tables; a step that changed nothing (a request
that waits) marks nothing, though its snapshot repeats the previous operation's marks. A highlighted
token shows vLLM's slot mapping, read from the snapshot
(``BlockPoolState.translate``): logical block, offset, physical block, slot.

The grid spans the figure's width, with the tables under it on the same cell
width, so that each cell is wide enough for its label; cell labels are fitted
for a figure ``LABEL_WIDTH`` px wide.

Kept as one module: the grid, the tables, the marks, the legend and the layout all read one ``_Shape``
and build one figure spec, and ``free_queue`` reuses its pieces; split, each part would only make sense
beside the others.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import plotly.graph_objects as go

from kvlab.core.snapshots import BlockPoolState, BlockState
from kvlab.errors import InvalidArgumentError, UnknownRequestError, brief, check_int, check_text
from kvlab.views import theme
from kvlab.views._common import (
    LABEL_WIDTH,
    STATUS_CODE,
    Spec,
    check_drawn_blocks,
    check_state,
    check_title,
    cross_path,
    cut_to,
    empty_grid,
    fit_label,
    label_room,
    legend_below_layout,
    legend_entry,
    mark_trace,
    rect_path,
    status_heatmap,
    text_px,
    title_text,
    tokens_text,
    top_margin,
)
from kvlab.views.text import plural

Owners = list[tuple[str, int]]

#: Cells of room around the grid and the tables, so that the highlight's outline, drawn just outside
#: its cell, is not cut off at the plot's edge (plotly clips lines to their axes' ranges).
EDGE = 0.06
#: px between the last block-table row and the legend under it.
LEGEND_GAP = 16
#: The legend's name for each block status: a never-used block is free too (it is on the free list).
STATUS_LEGEND: dict[str, str] = {
    "never used": "free, never used",
    "in use": "in use",
    "free, cached": "free, cached",
    "free": "free",
    "null": "null",
}
#: The id a block holds for a token written by count only (``kvlab.models.paged.UNKNOWN_TOKEN``): such a
#: run has no token ids to show, so a hover says so instead of listing placeholders.
NO_TOKEN_ID = -1
#: The legend's name for the highlighted token's slot: the same in every frame (the hover names the slot).
SLOT_LABEL = "the chosen token's slot"


def grid_shape(num_blocks: int) -> tuple[int, int]:
    """(columns, rows) of the block grid: one row up to 12 blocks, then rows of 8, 16 or 32.

    Up to 64 blocks the rows hold 8, so that each cell is wide enough to name
    its owner at the default figure width. ``num_blocks`` is at most ``LIMITS.drawn_blocks``.
    """
    num_blocks = check_drawn_blocks(num_blocks)
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
    one = f"{request_id} · {num_tokens:,} tok"
    return one if len(one) <= 14 else f"{request_id}<br>{num_tokens:,} tok"


def _label_px(labels: Sequence[str]) -> float:
    """The widest line of the table labels, in 11 px text."""
    return max((text_px(line, 11) for label in labels for line in label.split("<br>")), default=0)


def _left_margin(label_px: float, rows: int) -> int:
    """Room left of the grid and the tables for the table labels (11 px) and the row starts."""
    return max(int(label_px) + 16, 50 if rows > 1 else 36)


def block_owners(state: BlockPoolState) -> dict[int, Owners]:
    """Block id -> the (request id, logical block) pairs of the block tables that hold it."""
    owners: dict[int, Owners] = {}
    for rid, table in state.tables:
        for logical, b in enumerate(table):
            owners.setdefault(b, []).append((rid, logical))
    return owners


def _block_label(block: BlockState, owners: Owners, room: int) -> str:
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


@lru_cache(maxsize=16384)
def _block_cell(
    block: BlockState, owners: tuple[tuple[str, int], ...], bs: int, room: int, compact: bool = False
) -> tuple[int, str, str]:
    """(status code, label, hover text without the queue position) of one block; memoised, since
    consecutive snapshots share almost all their blocks and this is a stepper's main cost.

    ``compact``: one short line, for pools too large to label their cells (hundreds of blocks times
    every frame of an animation would otherwise carry megabytes of hover text into the notebook).
    """
    if compact:
        return (
            STATUS_CODE[block.status],
            _block_label(block, list(owners), room),
            _compact_hover(block, owners, bs),
        )
    lines = [f"<b>block {block.block_id}</b> · {block.status}", theme.STATUS_MEANING[block.status]]
    if owners:
        held = ", ".join(f"{rid} (logical {lg})" for rid, lg in owners)
        lines.append(f"ref count {block.ref_count}: {held}")
    if block.tokens and all(t == NO_TOKEN_ID for t in block.tokens):
        lines.append(f"{block.num_tokens}/{bs} tokens (no token ids in this run)")
    elif block.tokens:
        lines.append(f"{block.num_tokens}/{bs} tokens {tokens_text(block.tokens)}")
    elif not block.is_null:
        lines.append(f"0/{bs} tokens")
    if block.block_hash is not None:
        lines.append(f"cached under hash {block.block_hash}")
    lines.append(f"slots {block.block_id * bs}–{block.block_id * bs + bs - 1}")
    return STATUS_CODE[block.status], _block_label(block, list(owners), room), "<br>".join(lines)


def block_hover(block: BlockState, state: BlockPoolState, owners: Owners, queue_pos: dict[int, int]) -> str:
    """A block's hover text, with its free-queue position when it is queued."""
    hover = _block_cell(block, tuple(owners), state.block_size, 8)[2]
    if block.block_id in queue_pos:
        hover += f"<br>free queue position {queue_pos[block.block_id]} (0 = handed out next)"
    return hover


def _compact_hover(block: BlockState, owners: tuple[tuple[str, int], ...], bs: int) -> str:
    """A block's hover in one line: id, status, holders (request and logical block) and tokens.

    Plain ASCII on purpose: the figure's JSON writes each "<", ">" and non-ASCII character as a
    six-character escape, and this text is repeated for every block in every frame.
    """
    parts = [f"block {block.block_id}: {block.status}"]
    if owners:
        parts.append(", ".join(f"{rid} L{lg}" for rid, lg in owners))
    if not block.is_null:
        parts.append(f"{block.num_tokens}/{bs} tokens")
    return ", ".join(parts)  # its slots are block id x block size onward, as the subtitle says


@lru_cache(maxsize=16384)
def _table_cell(
    rid: str, logical: int, b: int, k: int, bs: int, ref: int | None, compact: bool = False
) -> str:
    first = logical * bs
    if compact:
        return f"{rid} L{logical}: block {b}, tokens {first}-{first + max(k, 1) - 1}"  # ASCII: see _compact_hover
    refs = f" · ref count {ref}" if ref is not None else ""
    return (f"<b>{rid}</b>: logical block {logical} → physical block {b}<br>"
            f"tokens {first}–{first + max(k, 1) - 1} ({k} of {bs}){refs}<br>"
            f"slots {b * bs}–{b * bs + max(k, 1) - 1}")  # fmt: skip


def _plain_items(value: object) -> list[Any] | None:
    """A list's or tuple's items, read by ``list``/``tuple`` themselves (never a subclass's overrides); else None."""
    if isinstance(value, list):
        return list.copy(value)
    if isinstance(value, tuple):
        return list(tuple.__iter__(value))
    return None


def _check_highlight(state: BlockPoolState, highlight: object) -> tuple[str, int] | None:
    if highlight is None:
        return None
    pair = _plain_items(highlight)
    if pair is None or len(pair) != 2 or not isinstance(pair[0], str):
        raise InvalidArgumentError(
            f"highlight must be (request_id, token_position), e.g. ('A', 36); got {brief(highlight)}"
        )
    rid, pos = check_text("highlight request", pair[0]), pair[1]
    pos = check_int("highlight position", pos, minimum=0)
    ids = [r for r, _ in state.tables]
    if rid not in ids:
        raise UnknownRequestError(
            f"highlight names request {rid!r}, which holds no blocks in this snapshot; requests: {ids or 'none'}"
        )
    n = state.num_tokens(rid)
    if pos >= n:
        raise InvalidArgumentError(
            f"highlight position {pos} is past the end of {rid!r}, which holds {n} tokens (positions 0..{n - 1})"
        )
    return rid, pos


@dataclass(frozen=True)
class _Shape:
    """The grid's and the tables' cells, the left margin, and how much each cell's label may say."""

    cols: int
    rows: int
    tcols: int
    trows: int
    left: int
    show_text: bool
    detail: int  # px of a 10 px label that fit across a grid cell
    table_labels: tuple[str, ...]  # one per table row, padded to trows

    def cell(self, b: int) -> tuple[int, int]:
        """(x, y) of physical block ``b`` in the grid."""
        r, c = divmod(b, self.cols)
        return c, r


def _shape(state: BlockPoolState, table_rows: int, table_cols: int, label_px: float) -> _Shape:
    cols, rows = grid_shape(state.num_blocks)
    tcols = max(max((len(t) for _, t in state.tables), default=0), table_cols, 1)
    trows = max(len(state.tables), table_rows, 1)
    seq_len = dict(state.token_counts)
    labels = [table_label(rid, seq_len.get(rid, 0)) for rid, _ in state.tables]
    left = _left_margin(max(_label_px(labels), label_px), rows)
    show_text = cols <= 16
    detail = label_room((LABEL_WIDTH - left - 20) / cols) if show_text else 0
    labels += [""] * (trows - len(labels))
    return _Shape(cols, rows, tcols, trows, left, show_text, detail, tuple(labels))


def _grid_trace(state: BlockPoolState, shape: _Shape) -> dict[str, Any]:
    """The physical blocks, one cell each, labelled and with hover text."""
    z, text, hover = empty_grid(shape.rows, shape.cols)
    owners = block_owners(state)
    queue_pos = {b: i for i, b in enumerate(state.free_queue)}
    no_owner: tuple[tuple[str, int], ...] = ()
    for block in state.blocks:
        c, r = shape.cell(block.block_id)
        if r >= shape.rows:
            continue
        code, label, tip = _block_cell(block, tuple(owners.get(block.block_id, no_owner)),
                                       state.block_size, shape.detail, not shape.show_text)  # fmt: skip
        z[r][c] = code
        text[r][c] = label if shape.show_text else ""
        pos = queue_pos.get(block.block_id)
        hover[r][c] = tip if pos is None else f"{tip}<br>free queue position {pos} (0 = handed out next)"
    return status_heatmap(z, text, hover, xaxis="x", yaxis="y", name="blocks", font_size=10)


def _tables_trace(
    state: BlockPoolState, shape: _Shape
) -> tuple[dict[str, Any], dict[int, list[tuple[int, int]]]]:
    """The block tables (one row per request, one column per logical block), and where each block is in them."""
    tz, ttext, thover = empty_grid(shape.trows, shape.tcols)
    table_text = shape.tcols <= 24
    blocks, n, bs = state.blocks, state.num_blocks, state.block_size
    seq_len = dict(state.token_counts)
    where_in_tables: dict[int, list[tuple[int, int]]] = {}
    for row, (rid, table) in enumerate(state.tables):
        length = seq_len.get(rid, len(table) * bs)
        for logical, b in enumerate(table):
            block = blocks[b] if 0 <= b < n else None
            tz[row][logical] = STATUS_CODE[block.status] if block is not None else None
            k = max(0, min(bs, length - logical * bs))
            ttext[row][logical] = str(b) if table_text else ""
            thover[row][logical] = _table_cell(
                rid, logical, b, k, bs, block.ref_count if block else None, not table_text
            )
            where_in_tables.setdefault(b, []).append((logical, row))
    trace = status_heatmap(tz, ttext, thover, xaxis="x2", yaxis="y2", name="block tables", font_size=11,
                           y=list(range(shape.trows)), gap=2 if shape.tcols <= 40 else 0)  # fmt: skip
    return trace, where_in_tables


def _outline(
    cells: Sequence[tuple[int, int]], inset: float, merge: bool
) -> tuple[list[float | None], list[float | None]]:
    """One rectangle per cell, or, where cells are too narrow to outline one by one (``merge``), one per
    run of neighbouring cells in a row: 88 dotted outlines a few px wide read as noise, not as a mark."""
    if not merge:
        return rect_path(cells, inset=inset)
    xs: list[float | None] = []
    ys: list[float | None] = []
    runs: list[list[int]] = []  # [first x, last x, y]
    for x, y in sorted(set(cells), key=lambda c: (c[1], c[0])):
        if runs and runs[-1][2] == y and runs[-1][1] == x - 1:
            runs[-1][1] = x
        else:
            runs.append([x, x, y])
    for first, last, y in runs:
        rx, ry = rect_path([((first + last) / 2, y)], (last - first) / 2 + 0.5, 0.5, inset)
        xs += rx
        ys += ry
    return xs, ys


def _change_marks(
    state: BlockPoolState, shape: _Shape, where_in_tables: dict[int, list[tuple[int, int]]], shown: set[str]
) -> list[dict[str, Any]]:
    """Outlines of the blocks the last op hit, allocated or copied (grid and tables), crosses on evictions."""

    def marks(kind: str, ids: Sequence[int], inset: float, cross: bool = False) -> list[dict[str, Any]]:
        grid_cells = [shape.cell(b) for b in ids if 0 <= b < state.num_blocks]
        table_cells = [tc for b in ids for tc in where_in_tables.get(b, [])]
        if cross:
            xs, ys = cross_path([(x + 0.27, y - 0.22) for x, y in grid_cells], half=0.1)
            return [mark_trace(kind, xs, ys, width=2.5, legend=kind in shown)]
        gx, gy = _outline(grid_cells, inset, merge=shape.cols > 16)
        tx, ty = _outline(table_cells, inset, merge=max(shape.cols, shape.tcols) > 24)
        return [
            mark_trace(kind, gx, gy, legend=kind in shown),
            mark_trace(kind, tx, ty, xaxis="x2", yaxis="y2", legend=False),
        ]

    return [
        *marks("hit", state.hit_block_ids, 0.07),
        *marks("new", state.new_block_ids, 0.07),
        *marks("copied", [copy for _, copy in state.copied_blocks], 0.03),
        *marks("evicted", state.evicted_block_ids, 0, cross=True),
    ]


def _slot_trace(xs: list, ys: list, hover: str, legend: bool) -> dict[str, Any]:
    """The slot inside the highlighted block: a yellow line with a triangle at each end.

    Its legend name is the same in every frame, so an animation's legend keeps
    its entries and their places; the hover says which slot it is.
    """
    return {
        "type": "scatter", "mode": "markers+lines", "x": xs, "y": ys,
        "line": {"color": theme.YELLOW, "width": 3}, "marker": {"symbol": "triangle-down", "size": 9,
        "color": theme.YELLOW, "line": {"color": theme.BLACK, "width": 1}}, "name": SLOT_LABEL,
        "showlegend": legend, "legendgroup": "mark highlight", "hovertext": [hover] * len(xs),
        "hovertemplate": "%{hovertext}<extra></extra>", "xaxis": "x", "yaxis": "y",
    }  # fmt: skip


def _highlight_traces(
    state: BlockPoolState, shape: _Shape, hl: tuple[str, int] | None, legend: bool
) -> tuple[list[dict[str, Any]], str]:
    """The highlighted token's logical and physical block and its slot (empty traces without one), and
    the subtitle line that spells out the translation. With ``legend`` the legend lists the highlight
    even where this snapshot cannot show it (an animation whose other frames do)."""
    if hl is None:  # the same traces, empty; listed in the legend when another frame draws them
        return [
            mark_trace("highlight", [], [], legend=legend, width=4),
            mark_trace("highlight", [], [], xaxis="x2", yaxis="y2", legend=False, width=4),
            _slot_trace([None, None] if legend else [], [None, None] if legend else [], "", legend),
        ], ""  # fmt: skip
    rid, pos = hl
    bs = state.block_size
    logical, offset, physical, slot = state.translate(rid, pos)
    row = [r for r, _ in state.tables].index(rid)
    gx, gy = rect_path([shape.cell(physical)], inset=-0.04)
    tx, ty = rect_path([(logical, row)], inset=-0.04)
    c, r = shape.cell(physical)
    sx = c - 0.5 + (offset + 0.5) / bs
    data = [
        mark_trace("highlight", gx, gy, width=4),
        mark_trace("highlight", tx, ty, xaxis="x2", yaxis="y2", legend=False, width=4),
        _slot_trace([sx, sx], [r - 0.46, r + 0.46], f"{rid} token {pos}: slot {slot}", True),
    ]
    text = (f"{rid} token {pos} → logical block {logical}, offset {offset} → physical block {physical} "
            f"→ slot {physical}×{bs}+{offset} = {slot}")  # fmt: skip
    return data, text


def _free_text(counts: dict[str, int]) -> str:
    """How many blocks are free, and which kinds where that is not plain: "3 free (never used)"."""
    total = counts["free"] + counts["never used"] + counts["free, cached"]
    kinds = [(counts["never used"], "never used"), (counts["free, cached"], "cached")]
    named = [(n, word) for n, word in kinds if n]
    if not named:
        return f"{total:,} free"
    if len(named) == 1 and named[0][0] == total:
        return f"{total:,} free ({named[0][1]})"
    return f"{total:,} free (" + ", ".join(f"{n:,} {word}" for n, word in named) + ")"


def block_statuses(state: BlockPoolState) -> set[str]:
    """The statuses the snapshot's blocks have: the ones its legend explains."""
    return {b.status for b in state.blocks}


def _subtitle(state: BlockPoolState, hl_text: str) -> str:
    counts = dict.fromkeys(theme.STATUSES, 0)
    for b in state.blocks:
        counts[b.status] += 1
    sub = (f"{state.num_blocks:,} blocks of {state.block_size} slots: {counts['in use']:,} in use, "
           f"{_free_text(counts)} · {plural(len(state.tables), 'block table')}")  # fmt: skip
    return sub + "<br>" + hl_text if hl_text else sub


def _check_statuses(statuses: object) -> set[str]:
    """``legend_statuses`` as a set of block statuses; anything else is refused."""
    items = _plain_items(statuses) if not isinstance(statuses, (set, frozenset)) else list(statuses)
    if items is None or not all(isinstance(s, str) and s in theme.STATUSES for s in items):
        raise InvalidArgumentError(
            f"legend_statuses must be a collection of block statuses {list(theme.STATUSES)}; got {brief(statuses)}"
        )
    return set(items)


def _status_legend(statuses: Collection[str]) -> list[dict[str, Any]]:
    """One swatch per block status, shown for the ``statuses`` given: every frame keeps all five traces."""
    return [
        legend_entry(STATUS_LEGEND[status], theme.STATUS_COLORS[status], group=f"status {status}",
                     visible=status in statuses)
        for status in theme.STATUSES
    ]  # fmt: skip


def _layout(
    ttl: dict[str, Any], state: BlockPoolState, shape: _Shape, data: list[dict[str, Any]], top: int
) -> dict[str, Any]:
    """Heights in px: the grid, a gap for the tables' axis, the tables; the legend under them."""
    cols, rows, tcols, trows = shape.cols, shape.rows, shape.tcols, shape.trows
    cell_px = 52 if shape.show_text else 18  # room for the id and a two-line owner
    grid_h, gap_h, tables_h = rows * cell_px, 58, trows * 34
    plot_h = grid_h + gap_h + tables_h
    xcols = max(cols, tcols)  # the tables use the grid's cell width unless they are longer than a grid row
    ticks_every = 1 if tcols <= 24 else math.ceil(tcols / 12)
    grid_ticks = list(range(0, cols, 1 if cols <= 16 else 4))
    return legend_below_layout(
        ttl, data, plot_h=plot_h, top=top, left=shape.left, gap=LEGEND_GAP, pad=LEGEND_GAP + 10,
        xaxis={"domain": [0, 1], "range": [-0.5 - EDGE, cols - 0.5 + EDGE], "showgrid": False, "zeroline": False,
               "tickmode": "array", "tickvals": grid_ticks,
               "ticktext": [f"+{c}" if rows > 1 else str(c) for c in grid_ticks], "tickangle": 0,
               "side": "top", "fixedrange": True, "tickfont": {"size": 10},
               "title": {"text": "physical blocks" + (" (id = row start + column)" if rows > 1 else ""),
                         "standoff": 4, "font": {"size": 12}}},
        yaxis={"domain": [1 - grid_h / plot_h, 1], "range": [rows - 0.5 + EDGE, -0.5 - EDGE],
               "showgrid": False, "zeroline": False, "tickmode": "array",
               "tickvals": list(range(rows)), "ticktext": [str(r * cols) for r in range(rows)],
               "visible": rows > 1, "fixedrange": True, "tickfont": {"size": 10}},
        xaxis2={"domain": [0, 1], "range": [-0.5 - EDGE, xcols - 0.5 + EDGE], "showgrid": False, "zeroline": False,
                "tickmode": "array", "tickvals": list(range(0, tcols, ticks_every)),
                "ticktext": [f"L{i}" for i in range(0, tcols, ticks_every)], "side": "top", "fixedrange": True,
                "anchor": "y2", "tickfont": {"size": 10},
                "title": {"text": "block tables: logical block → physical block", "standoff": 4,
                          "font": {"size": 12}}},
        yaxis2={"domain": [0, tables_h / plot_h],
                "range": [trows - 0.5 + EDGE, -0.5 - EDGE], "showgrid": False, "zeroline": False, "tickmode": "array",
                "tickvals": list(range(trows)), "ticktext": list(shape.table_labels), "anchor": "x2",
                "fixedrange": True, "tickfont": {"size": 11}},
        # always one annotation, empty when there are tables, so every frame has the same layout keys
        annotations=[{"text": "" if state.tables else "no block tables", "xref": "x2", "yref": "y2",
                      "x": (min(xcols, 8) - 1) / 2, "y": 0, "showarrow": False, "font": {"color": theme.GREY}}],
    )  # fmt: skip


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
    legend_statuses: Collection[str] | None = None,
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
    this snapshot shows) and ``legend_statuses`` the block statuses (default:
    those its blocks have); a ``highlight`` is listed even in a snapshot that
    cannot show it, so an animation's legend is the same in every frame.
    """
    check_state("state", state, BlockPoolState)
    if previous is not None:
        check_state("previous", previous, BlockPoolState)
        state = step_state(state, previous)
    shown = set(block_pool_marks(state) if legend_marks is None else legend_marks)
    try:
        hl = _check_highlight(state, highlight)
    except (InvalidArgumentError, UnknownRequestError):
        if strict:
            raise
        hl = None
    shape = _shape(state, table_rows, table_cols, label_px)
    tables, where_in_tables = _tables_trace(state, shape)
    statuses = block_statuses(state) if legend_statuses is None else _check_statuses(legend_statuses)
    data = [_grid_trace(state, shape), tables, *_status_legend(statuses)]
    data += _change_marks(state, shape, where_in_tables, shown)
    highlighted, hl_text = _highlight_traces(state, shape, hl, legend=highlight is not None)
    data += highlighted
    ttl = title_text(caption or title or "Block pool", _subtitle(state, hl_text))
    top = top_margin(ttl, True, head_lines, sub_lines)
    return {"data": data, "layout": _layout(ttl, state, shape, data, top)}


def block_pool_figure(
    state: BlockPoolState, highlight: tuple[str, int] | None = None, *, title: str | None = None
) -> go.Figure:
    """Examples 2-5 and 7: blocks coloured by status, above the block tables that point into them.

    ``highlight=("A", 36)`` shows where token 36 of request A lives: logical
    block, offset, physical block and slot (example 2's translation).
    """
    return go.Figure(block_pool_spec(state, highlight=highlight, title=check_title(title)))


def step_state(state: BlockPoolState, previous: BlockPoolState | None) -> BlockPoolState:
    """``state`` with only the marks of its own step: none when the step changed nothing.

    A snapshot carries what the pool's last operation did. A step that changes
    nothing (a request that waits because its blocks do not fit) repeats the
    snapshot before it, marks included; drawn as they are, they would show the
    previous step's allocation as this step's.
    """
    if previous is None or state != previous:
        return state
    return replace(state, hit_block_ids=(), new_block_ids=(), evicted_block_ids=(), copied_blocks=())


def block_pool_marks(state: BlockPoolState, previous: BlockPoolState | None = None) -> set[str]:
    """The marks a block-pool snapshot shows: what its operation hit, allocated, copied, evicted
    (nothing, for a step that changed nothing since ``previous``)."""
    state = step_state(state, previous)
    found = {"hit": state.hit_block_ids, "new": state.new_block_ids, "copied": state.copied_blocks,
             "evicted": state.evicted_block_ids}  # fmt: skip
    return {k for k, v in found.items() if v}


def block_pool_hints(states: Sequence[BlockPoolState]) -> dict[str, Any]:
    """The room every snapshot of a history needs, so that all its frames share one set of axes."""
    labels = [table_label(rid, n) for s in states for rid, n in s.token_counts]
    before = [None, *states][: len(states)]  # each snapshot's previous one: its own step's marks
    return {
        "table_rows": max((len(s.tables) for s in states), default=0),
        "table_cols": max((len(t) for s in states for _, t in s.tables), default=0),
        "label_px": _label_px(labels),
        "legend_marks": set().union(*(block_pool_marks(s, p) for s, p in zip(states, before, strict=True))),
        "legend_statuses": set().union(*(block_statuses(s) for s in states)),
    }
