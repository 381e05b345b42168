"""Example 8's view: SGLang's radix tree, one box per node, with its token run, lock count and last access.

Up to 8 leaves the tree grows downwards; a wider tree grows to the right, one
row per leaf, so its labels keep their room. What the last operation did is
outlined: the nodes a split created, the node where the last match ended, and
the runs an eviction removed (drawn beside the tree, as the snapshot keeps
them). kvlab's ``lock_ref`` and ``last_access`` are SGLang's ``TreeNode.lock_ref``
and ``last_access_time`` (a logical clock here).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from kvlab.core.snapshots import RadixNodeState, RadixState
from kvlab.errors import InvalidArgumentError, brief
from kvlab.views import theme
from kvlab.views._common import (
    LABEL_WIDTH,
    Spec,
    check_state,
    check_title,
    legend_below_layout,
    legend_entry,
    line_trace,
    rect_path,
    title_text,
    tokens_text,
    top_margin,
)

_Point = tuple[float, float]
#: The plot's width in px that box labels are fitted for: ``LABEL_WIDTH`` less the 20 px margins.
_PLOT_PX = LABEL_WIDTH - 40


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


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


@dataclass(frozen=True)
class _Frame:
    """Where every node goes and how big its box is, in data units."""

    pos: dict[int, tuple[float, int]]  # node id -> (leaf coordinate u, depth d)
    leaves: int
    max_u: int
    max_d: int
    n_evicted: int  # evicted runs to leave room for
    across: bool  # grow to the right, one row per leaf
    half_w: float
    half_h: float
    chars: int  # characters of a label line that fit in a box
    evicted_at: tuple[_Point, ...]

    def xy(self, node_id: int) -> _Point:
        u, d = self.pos[node_id]
        return (float(d), u) if self.across else (u, float(d))

    @property
    def root_half(self) -> tuple[float, float]:
        return (0.2, self.half_h) if self.across else (min(self.half_w, 0.2), 0.22)


def _frame(
    state: RadixState, pos: dict[int, tuple[float, int]], n_nodes_leaves: int, extent: tuple[int, int, int]
) -> _Frame:
    leaves = max(n_nodes_leaves, extent[0], 1)
    n_evicted = max(len(state.evicted_runs), extent[2])
    max_u = leaves - 1
    max_d = max(max((d for _, d in pos.values()), default=0), extent[1])
    across = leaves > 8
    runs = range(len(state.evicted_runs))
    if across:
        half_w, half_h = 0.44, 0.36  # along depth (x), along leaves (y)
        evicted_at = tuple((max_d + 1.3, float(i)) for i in runs)
        unit_px = _PLOT_PX / (max_d + 1 + (1.3 if n_evicted else 0))
    else:
        half_w, half_h = 0.44, 0.32  # along leaves (x), along depth (y)
        evicted_at = tuple((max_u + 1.3, 1.0 + i) for i in runs)
        unit_px = _PLOT_PX / (max_u + 1 + (1.3 if n_evicted else 0))
    chars = max(4, int(2 * half_w * unit_px / 6.8))
    return _Frame(pos, leaves, max_u, max_d, n_evicted, across, half_w, half_h, chars, evicted_at)


def _edges(
    order: list[tuple[RadixNodeState, int]], fr: _Frame
) -> tuple[list[float | None], list[float | None]]:
    """Elbow lines from each node's box to its children's boxes."""
    root_w, root_h = fr.root_half
    ex: list[float | None] = []
    ey: list[float | None] = []
    for node, depth in order:
        x0, y0 = fr.xy(node.node_id)
        for child in node.children:
            x1, y1 = fr.xy(child.node_id)
            if fr.across:
                start = x0 + (root_w if depth == 0 else fr.half_w)
                mid = (start + x1 - fr.half_w) / 2
                ex += [start, mid, mid, x1 - fr.half_w, None]
                ey += [y0, y0, y1, y1, None]
            else:
                start = y0 + (root_h if depth == 0 else fr.half_h)
                mid = (start + y1 - fr.half_h) / 2
                ex += [x0, x0, x1, x1, None]
                ey += [start, mid, mid, y1 - fr.half_h, None]
    return ex, ey


def _node_text(
    state: RadixState, node: RadixNodeState, depth: int, prefix: int, chars: int
) -> tuple[str, str]:
    """(box label, hover text) of one node; ``prefix`` is its prefix length from the root."""
    if depth == 0:
        return "<b>root</b>", f"<b>root</b> (node {node.node_id})<br>{state.total_tokens} tokens cached below"
    lock = (f"lock {node.lock_ref}" if node.lock_ref else "unlocked") + f" · t={node.last_access}"
    if len(lock) > chars:
        lock = f"L{node.lock_ref} t{node.last_access}"
    ns = f"<br>ns {_short(node.extra_key, chars - 3)}" if node.extra_key is not None else ""
    extra = f"<br>namespace (extra_key) {node.extra_key}" if node.extra_key is not None else ""
    hover = (
        f"<b>node {node.node_id}</b> · {len(node.key)} tokens {tokens_text(node.key, 16)}<br>"
        f"lock_ref {node.lock_ref} ({'protected' if node.lock_ref else 'evictable'})"
        f" · last access t={node.last_access}<br>"
        f"prefix from the root: {prefix} tokens"
        f"{' · leaf' if not node.children else ''}{extra}"
    )
    return f"{_fit_run(node.key, chars)}<br>{lock}{ns}", hover


def _boxes_and_labels(
    state: RadixState, order: list[tuple[RadixNodeState, int]], fr: _Frame
) -> tuple[dict[str, list[_Point]], dict[str, Any]]:
    """Box centres by kind (root, unlocked, locked) and the text trace over nodes and evicted runs."""
    boxes: dict[str, list[_Point]] = {k: [] for k in ("root", "unlocked", "locked")}
    tx, ty, ttext, tcolor, hover = [], [], [], [], []
    prefix_len: dict[int, int] = {state.root.node_id: 0}
    for node, depth in order:
        for child in node.children:
            prefix_len[child.node_id] = prefix_len[node.node_id] + len(child.key)
        kind = "root" if depth == 0 else ("locked" if node.lock_ref > 0 else "unlocked")
        x0, y0 = fr.xy(node.node_id)
        boxes[kind].append((x0, y0))
        label, tip = _node_text(state, node, depth, prefix_len[node.node_id], fr.chars)
        tx.append(x0)
        ty.append(y0)
        ttext.append(label)
        hover.append(tip)
        tcolor.append("white" if kind in ("root", "locked") else theme.INK)
    for (x, y), run in zip(fr.evicted_at, state.evicted_runs, strict=True):
        tx.append(x)
        ty.append(y)
        ttext.append(f"{_fit_run(run, fr.chars)}<br>evicted")
        tcolor.append(theme.VERMILLION)
        hover.append(f"<b>evicted by this op</b>: {len(run)} tokens {tokens_text(run, 16)}")
    text = {"type": "scatter", "mode": "text", "x": tx, "y": ty, "text": ttext, "hovertext": hover,
            "hovertemplate": "%{hovertext}<extra></extra>", "textfont": {"size": 11, "color": tcolor,
            "family": theme.MONO_FAMILY}, "showlegend": False, "name": "nodes"}  # fmt: skip
    return boxes, text


def _traces(
    state: RadixState, order: list[tuple[RadixNodeState, int]], fr: _Frame, shown: set[str]
) -> list[dict[str, Any]]:
    ex, ey = _edges(order, fr)
    boxes, text = _boxes_and_labels(state, order, fr)
    root_w, root_h = fr.root_half

    def filled(kind: str) -> dict[str, Any]:
        w, h = (root_w, root_h) if kind == "root" else (fr.half_w, fr.half_h)
        xs, ys = rect_path(boxes[kind], w, h)
        return {"type": "scatter", "mode": "lines", "x": xs, "y": ys, "fill": "toself",
                "fillcolor": theme.NODE_COLORS[kind], "line": {"color": theme.INK, "width": 1}, "name": kind,
                "hoverinfo": "skip", "showlegend": False, "legendgroup": kind}  # fmt: skip

    pad_w, pad_h = (0.03, 0.05) if fr.across else (0.03, 0.06)
    split_x, split_y = rect_path(
        [fr.xy(i) for i in state.split_nodes if i in fr.pos], fr.half_w + pad_w, fr.half_h + pad_h
    )
    matched = [fr.xy(state.matched_node)] if state.matched_node in fr.pos else []
    mx, my = rect_path(matched, fr.half_w + 2 * pad_w, fr.half_h + 2 * pad_h)
    evx, evy = rect_path(fr.evicted_at, fr.half_w, fr.half_h)
    return [
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
        text,
    ]  # fmt: skip


def _layout(ttl: dict[str, Any], fr: _Frame, data: list[dict[str, Any]], top: int) -> dict[str, Any]:
    # one annotation always (empty when nothing was evicted), so frames share their layout keys
    label_at = (fr.max_d + 1.3, -0.75) if fr.across else (fr.max_u + 1.3, 0.4)
    annotations = [{"x": label_at[0], "y": label_at[1], "text": "<b>evicted by this op</b>" if fr.evicted_at else "",
                    "showarrow": False, "font": {"color": theme.VERMILLION, "size": 12}}]  # fmt: skip
    if fr.across:
        rows = max(fr.leaves, fr.n_evicted)
        plot_h = rows * 46 + 40
        xr = [-0.6, (fr.max_d + 1.3 if fr.n_evicted else fr.max_d) + 0.6]
        yr = [rows - 1 + 0.6, -1.0]
    else:
        lowest = max(fr.max_d, fr.n_evicted)
        plot_h = (lowest + 1) * 95
        xr = [-0.6, (fr.max_u + 1.3 if fr.n_evicted else fr.max_u) + 0.6]
        yr = [lowest + 0.6, -0.6]
    return legend_below_layout(
        ttl, data, plot_h=plot_h, top=top, left=20, gap=4, pad=14,
        xaxis={"visible": False, "range": xr, "fixedrange": True},
        yaxis={"visible": False, "range": yr, "fixedrange": True},
        annotations=annotations,
    )  # fmt: skip


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

    ``extent=(leaves, depth, evicted runs)`` reserves room for a larger tree so
    that every frame of an animation keeps the same scale and direction.
    ``legend_marks`` lists the marks the legend explains (default: those this
    snapshot shows).
    """
    check_state("state", state, RadixState)
    shown = set(radix_marks(state) if legend_marks is None else legend_marks)
    pos, order = _radix_layout(state.root)
    nodes = [n for n, _ in order]
    fr = _frame(state, pos, sum(1 for n in nodes if not n.children), extent)
    data = _traces(state, order, fr, shown)
    sub = (f"{state.total_tokens} tokens in {len(nodes) - 1} nodes · evictable {state.evictable_size}, "
           f"protected {state.protected_size}" + (f" · page size {state.page_size}" if state.page_size > 1 else "")
           + " · t = last access")  # fmt: skip
    ttl = title_text(caption or title or "Radix tree", sub)
    top = top_margin(ttl, False, head_lines, sub_lines)
    return {"data": data, "layout": _layout(ttl, fr, data, top)}


def radix_tree_figure(state: RadixState, *, title: str | None = None) -> go.Figure:
    """Example 8: the radix tree's nodes with token runs, lock counts and access times."""
    return go.Figure(radix_tree_spec(state, title=check_title(title)))


def radix_marks(state: RadixState, previous: RadixState | None = None) -> set[str]:
    """The marks a radix snapshot shows: a split, where a match ended, evicted runs."""
    check_state("state", state, RadixState)
    found = {
        "split": state.split_nodes,
        "matched": state.matched_node is not None,
        "evicted": state.evicted_runs,
    }
    return {k for k, v in found.items() if v}


def radix_extent(state: RadixState) -> tuple[int, int, int]:
    """(leaves, depth, evicted runs) of a radix snapshot: the room its figure needs."""
    check_state("state", state, RadixState)
    leaves = depth = 0
    for d, node in state.root.walk():
        depth = max(depth, d)
        leaves += not node.children
    return leaves, depth, len(state.evicted_runs)


def radix_hints(states: Sequence[RadixState]) -> dict[str, Any]:
    """The room and the legend every frame of a history shares: the largest tree, every mark shown."""
    if not isinstance(states, (list, tuple)) or not states:
        raise InvalidArgumentError(f"states must be a non-empty list of RadixState, got {brief(states)}")
    extents = [radix_extent(s) for s in states]
    return {
        "extent": tuple(max(e[i] for e in extents) for i in range(3)),
        "legend_marks": set().union(*(radix_marks(s) for s in states)),
    }
