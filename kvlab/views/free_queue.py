"""Example 7's view: the free queue from front (handed out next, so evicted first) to back.

vLLM keeps free blocks in one queue (``FreeKVCacheBlockQueue``) and evicts
lazily: a freed block keeps its cached hash until it is handed out again, so a
cache hit can take a block back out of the middle of the queue. The top row
shows the blocks that left the queue in the last operation, above the place
they left from, tagged by why (hit, new tokens, copy-on-write, eviction).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from kvlab.core.snapshots import BlockPoolState, BlockState
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
    mark_trace,
    rect_path,
    status_heatmap,
    status_legend,
    title_text,
    top_margin,
)
from kvlab.views.block_pool import EDGE, LEGEND_GAP, block_hover, block_owners, block_pool_marks


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
        hits = [b for b in state.hit_block_ids if b in was_queued]
    else:
        refs = {b.block_id: b.ref_count for b in state.blocks}
        hits = [b for b in state.hit_block_ids if refs.get(b, 0) <= 1]
    copies = {target: source for source, target in state.copied_blocks}
    left = list(dict.fromkeys([*state.new_block_ids, *copies, *hits]))
    return hits, copies, [b for b in left if b not in queued]


@dataclass(frozen=True)
class _Shape:
    """Columns and rows of the queue (row 0: blocks that left it in this op) and how much a label may say."""

    usable: int  # blocks that can be free: all but the null block
    cols: int
    qrows: int
    room: int
    detail: bool
    show_text: bool

    @property
    def rows(self) -> int:
        return self.qrows + 1

    def label(self, block: BlockState, extra: str = "") -> str:
        if not self.show_text:
            return ""
        if not self.detail:
            return str(block.block_id)
        tag = fit_label(extra, self.room) if extra else cut_to((block.block_hash or "")[:8], self.room)
        return f"<b>{block.block_id}</b><br>{tag}" if tag else f"<b>{block.block_id}</b>"


def _shape(state: BlockPoolState) -> _Shape:
    check_drawn_blocks(state.num_blocks)
    usable = max(1, state.num_blocks - (1 if state.null_block is not None else 0))
    cols = min(usable, 16 if usable <= 64 else 32)
    cell_w = (LABEL_WIDTH - 140) / cols  # the cell width in a figure LABEL_WIDTH px wide
    room = label_room(cell_w)
    return _Shape(usable=usable, cols=cols, qrows=max(1, math.ceil(usable / cols)), room=room,
                  detail=cols <= 16 and room >= 18,
                  show_text=cell_w >= 7 * len(str(state.num_blocks - 1)) + 4)  # fmt: skip


def _why_left(
    state: BlockPoolState, b: int, was: str, gone: str | None, copies: dict[int, int]
) -> tuple[str, str]:
    """(the cell's tag, the hover's reason) for block ``b``, which left the queue in this op."""
    if b in state.evicted_block_ids:
        tag = f"evict {gone}" if gone else "evicted"
        return tag, f"taken from the front{was}; its cached hash {gone or ''} was dropped (evicted)"
    if b in state.new_block_ids:
        return "new", f"taken from the front{was} for new tokens"
    if b in copies:
        return f"copy of {copies[b]}", f"taken from the front{was} for a copy-on-write of block {copies[b]}"
    return "hit", f"cache hit{was}: touched out of the queue, ref count now {state.blocks[b].ref_count}"


def _queue_cells(
    state: BlockPoolState, previous: BlockPoolState | None, shape: _Shape
) -> tuple[dict[str, Any], dict[int, tuple[int, int]]]:
    """The heatmap (the queue in rows 1.., the leavers in row 0) and the cell of each leaver."""
    z, text, hover = empty_grid(shape.rows, shape.cols)
    owners = block_owners(state)
    queue_pos = {b: i for i, b in enumerate(state.free_queue)}
    blocks, cols = state.blocks, shape.cols
    for i, b in enumerate(state.free_queue):
        r, c = divmod(i, cols)
        z[r + 1][c] = STATUS_CODE[blocks[b].status]
        text[r + 1][c] = shape.label(blocks[b])
        hover[r + 1][c] = block_hover(blocks[b], state, owners.get(b, []), queue_pos)
    # what left the queue: hits touched out of it, and blocks taken from the front
    prev_pos = {b: i for i, b in enumerate(previous.free_queue)} if previous is not None else {}
    prev_hash = {b.block_id: b.block_hash for b in previous.blocks} if previous is not None else {}
    _, copies, left = _queue_leavers(state, previous)
    place_at_old = previous is not None and all(prev_pos.get(b, cols) < cols for b in left)
    left_cells: dict[int, tuple[int, int]] = {}
    for k, b in enumerate(left[:cols]):
        c = prev_pos[b] if place_at_old else k
        left_cells[b] = (c, 0)
        was = f" (was position {prev_pos[b]})" if b in prev_pos else ""
        tag, why = _why_left(state, b, was, prev_hash.get(b), copies)
        z[0][c] = STATUS_CODE[blocks[b].status]
        text[0][c] = shape.label(blocks[b], tag)
        hover[0][c] = f"<b>block {b}</b> left the queue<br>{why}<br>" + block_hover(
            blocks[b], state, owners.get(b, []), queue_pos
        )
    return status_heatmap(z, text, hover, xaxis="x", yaxis="y", name="free queue", font_size=10), left_cells


def _change_marks(
    state: BlockPoolState,
    previous: BlockPoolState | None,
    shape: _Shape,
    left_cells: dict[int, tuple[int, int]],
    shown: set[str],
) -> list[dict[str, Any]]:
    """Outlines on the leavers (hit, new, copied), crosses on evictions, outlines on blocks that joined."""
    hits, copies, _ = _queue_leavers(state, previous)
    queue_pos = {b: i for i, b in enumerate(state.free_queue)}
    prev_queued = set(previous.free_queue) if previous is not None else set()

    def qcell(b: int) -> tuple[int, int]:
        r, c = divmod(queue_pos[b], shape.cols)
        return c, r + 1

    hx, hy = rect_path([left_cells[b] for b in hits if b in left_cells], inset=0.07)
    nx, ny = rect_path([left_cells[b] for b in state.new_block_ids if b in left_cells], inset=0.07)
    cx, cy = rect_path([left_cells[b] for b in copies if b in left_cells], inset=0.03)
    ex, ey = cross_path(
        [(left_cells[b][0] + 0.27, -0.22) for b in state.evicted_block_ids if b in left_cells], half=0.1
    )
    joined = [b for b in state.free_queue if previous is not None and b not in prev_queued]
    fx, fy = rect_path([qcell(b) for b in joined], inset=0.07)
    return [mark_trace("hit", hx, hy, legend="hit" in shown), mark_trace("new", nx, ny, legend="new" in shown),
            mark_trace("copied", cx, cy, legend="copied" in shown),
            mark_trace("evicted", ex, ey, width=2.5, legend="evicted" in shown),
            mark_trace("freed", fx, fy, legend="freed" in shown)]  # fmt: skip


def _titles(state: BlockPoolState, previous: BlockPoolState | None, head: str, left: bool) -> tuple[str, str]:
    """(heading, subtitle): the queue's length, front and back; the heading always says "free queue"."""
    queue = state.free_queue
    cached = sum(1 for b in queue if state.blocks[b].block_hash is not None)
    if queue:
        sub = (
            f"{len(queue)} free blocks, {cached} still cached · front (next out): block "
            f"{queue[0]} · back: block {queue[-1]}"
        )
    else:
        sub = "the free queue is empty: every block is in use"
    if previous is None and left:
        sub += " · pass previous= to place leavers where they left"
    if "free queue" not in head.lower() and "free list" not in head.lower():
        head = f"Free queue · {head}"
    return head, sub


def _row_labels(shape: _Shape) -> list[str]:
    if shape.qrows == 1:
        return ["left the queue", "free queue"]
    cols, qrows = shape.cols, shape.qrows
    return ["left the queue"] + [
        f"{r * cols}–{min(shape.usable, (r + 1) * cols) - 1}"
        + (" front" if r == 0 else " back" if r == qrows - 1 else "")
        for r in range(qrows)
    ]


def _layout(ttl: dict[str, Any], shape: _Shape, data: list[dict[str, Any]], top: int) -> dict[str, Any]:
    cols, rows = shape.cols, shape.rows
    cell_px = 52 if shape.detail else 24  # room for the id and a two-line tag
    plot_h = rows * cell_px
    return legend_below_layout(
        ttl, data, plot_h=plot_h, top=top, left=120, gap=LEGEND_GAP, pad=LEGEND_GAP + 10,
        xaxis={"range": [-0.5 - EDGE, cols - 0.5 + EDGE], "showgrid": False, "zeroline": False, "fixedrange": True,
               "tickmode": "array", "tickvals": list(range(cols)), "ticktext": [str(c) for c in range(cols)],
               "side": "top", "tickfont": {"size": 10},
               "title": {"text": "queue position: front (handed out next, evicted first) → back",
                         "standoff": 4, "font": {"size": 12}}},
        yaxis={"range": [rows - 0.5 + EDGE, -0.5 - EDGE], "showgrid": False, "zeroline": False, "fixedrange": True,
               "tickmode": "array", "tickvals": list(range(rows)), "ticktext": _row_labels(shape),
               "tickfont": {"size": 11}},
        shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": 0.5, "y1": 0.5,
                 "line": {"color": theme.GREY, "width": 1, "dash": "dot"}}],
    )  # fmt: skip


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
    shape = _shape(state)
    heatmap, left_cells = _queue_cells(state, previous, shape)
    data = [heatmap, *status_legend(state.null_block is not None)]
    data += _change_marks(state, previous, shape, left_cells, shown)
    left = _queue_leavers(state, previous)[2]
    head, sub = _titles(state, previous, caption or title or "Free queue", bool(left))
    ttl = title_text(head, sub)
    top = top_margin(ttl, True, head_lines, sub_lines)
    return {"data": data, "layout": _layout(ttl, shape, data, top)}


def free_queue_figure(
    state: BlockPoolState, previous: BlockPoolState | None = None, *, title: str | None = None
) -> go.Figure:
    """Example 7: the free queue front to back; hits leaving it and evictions marked.

    Give ``previous`` (the snapshot before the op) to draw leavers above where
    they left from and to name the hashes the op evicted.
    """
    return go.Figure(free_queue_spec(state, previous, title=check_title(title)))


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


def free_queue_hints(states: Sequence[BlockPoolState]) -> dict[str, Any]:
    """The legend every frame of a history shares: every mark any of its steps shows."""
    pairs = zip(states, [None, *states[:-1]], strict=True)
    return {"legend_marks": set().union(*(free_queue_marks(s, p) for s, p in pairs))}
