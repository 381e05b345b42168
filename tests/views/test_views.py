"""kvlab.views figures and animations: what they draw for real model runs, edge-case pools, bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from kvlab.core import hashing
from kvlab.core.snapshots import BlockPoolState, BlockState, ContiguousState, History, Region
from kvlab.errors import InvalidArgumentError, KvlabError, UnknownRequestError
from kvlab.lessons import ex01, ex02, ex03, ex04, ex07, ex08
from kvlab.models import paged, radix
from kvlab.models.prefix_cache import PrefixCache
from kvlab.views import (
    block_pool_animation,
    block_pool_figure,
    cache_n_figure,
    contiguous_animation,
    contiguous_figure,
    free_queue_animation,
    free_queue_figure,
    hash_chain_figure,
    hit_rate_figure,
    radix_animation,
    radix_tree_figure,
    setup,
    theme,
    tokens_per_turn_figure,
    utilization_figure,
)
from kvlab.views._common import LABEL_WIDTH, NARROWEST, STATUS_CODE, legend_height, text_px
from kvlab.views.block_pool import STATUS_LEGEND, block_pool_spec, grid_shape
from kvlab.views.charts import per_turn_figure
from kvlab.views.text import caption

# ---------------------------------------------------------------------- helpers


def grid_cells(fig: go.Figure, trace: int = 0) -> dict[tuple[int, int], tuple[float, str, str]]:
    """(column, row) -> (z, label, hover) of a heatmap trace, gaps left out."""
    hm = fig.data[trace].to_plotly_json()  # plain lists: plotly's property access is slow cell by cell
    z_rows, text, hover = (list(map(list, hm[k])) for k in ("z", "text", "hovertext"))
    out = {}
    for r, row in enumerate(z_rows):
        for c, z in enumerate(row):
            if z is not None and not (isinstance(z, float) and math.isnan(z)):
                out[(c, r)] = (z, text[r][c], hover[r][c])
    return out


def block_cell(fig: go.Figure, state: BlockPoolState, block_id: int, cells: dict | None = None) -> tuple:
    cols, _ = grid_shape(state.num_blocks)
    r, c = divmod(block_id, cols)
    return (cells if cells is not None else grid_cells(fig))[(c, r)]


def trace_named(fig: go.Figure, name: str) -> go.Scatter:
    matches = [t for t in fig.data if t.name == name]
    assert matches, f"no trace {name!r}; traces: {[t.name for t in fig.data]}"
    return matches[0]


def outlined_cells(trace: go.Scatter) -> set[tuple[float, float]]:
    """Centres of the rectangles a mark trace draws (5 points and a gap each)."""
    xs, ys = list(trace.x or []), list(trace.y or [])
    out = set()
    for i in range(0, len(xs) - 4, 6):
        if xs[i] is None:
            continue
        out.add((round((xs[i] + xs[i + 1]) / 2, 3), round((ys[i] + ys[i + 2]) / 2, 3)))
    return out


def legend_names(fig: go.Figure) -> set[str]:
    return {t.name for t in fig.data if t.showlegend}


# ---------------------------------------------------------------------- edge-case pools


def _pools() -> dict[str, BlockPoolState]:
    one = PrefixCache(1, 16)
    one.allocate("A", list(range(10)))
    full = PrefixCache(12, 4)
    for k in range(4):
        full.allocate(f"r{k}", list(range(100 * k, 100 * k + 12)))
    tiny = PrefixCache(10, 1)
    tiny.allocate("A", [1, 2, 3, 4])
    tiny.allocate("B", [1, 2, 3, 9, 9])
    tiny.free("A")
    big = PrefixCache(512, 16)
    for k in range(12):
        big.allocate(f"r{k}", list(range(1000, 1100)) + list(range(10_000 * (k + 1), 10_000 * (k + 1) + 300)))
    for k in range(0, 12, 3):
        big.free(f"r{k}")
    return {
        "no blocks": BlockPoolState(block_size=16, blocks=()),
        "empty": PrefixCache(8, 16).snapshot(),
        "one block": one.snapshot(),
        "full": full.snapshot(),
        "1-token blocks": tiny.snapshot(),
        "512 blocks": big.snapshot(),
    }


POOLS = _pools()


@pytest.mark.parametrize("name", list(POOLS))
def test_block_pool_figure_draws_every_block_with_its_status(name: str) -> None:
    state = POOLS[name]
    fig = block_pool_figure(state)
    cells = grid_cells(fig)
    assert len(cells) == state.num_blocks
    for block in state.blocks:
        z, _, hover = block_cell(fig, state, block.block_id, cells)
        assert z == STATUS_CODE[block.status]
        # a pool too large to label its cells gets one plain line per block (the compact hover)
        assert f"block {block.block_id}</b> · {block.status}" in hover or hover.startswith(
            f"block {block.block_id}: {block.status},"
        )
        if block.tokens:
            assert f"{block.num_tokens}/{state.block_size} tokens" in hover
    table_rows = [t for t in fig.layout.yaxis2.ticktext if t]
    assert table_rows == [f"{rid} · {n} tok" for rid, n in state.token_counts]
    assert {STATUS_LEGEND[b.status] for b in state.blocks} <= legend_names(fig)
    assert ("free, cached" in legend_names(fig)) == any(b.status == "free, cached" for b in state.blocks)
    json.loads(fig.to_json())  # a valid figure end to end


@pytest.mark.parametrize("name", list(POOLS))
def test_free_queue_figure_lists_the_queue_front_to_back(name: str) -> None:
    state = POOLS[name]
    fig = free_queue_figure(state)
    assert "free queue" in fig.layout.title.text.lower()
    cells = grid_cells(fig)
    cols = len(fig.data[0].z[0])
    shown = []
    for (c, r), (_, _, hover) in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if r >= 1:
            shown.append((r - 1) * cols + c)
            assert f"free queue position {(r - 1) * cols + c}" in hover
    assert shown == list(range(len(state.free_queue)))
    for i, b in enumerate(state.free_queue):
        r, c = divmod(i, cols)
        assert cells[(c, r + 1)][2].startswith(f"<b>block {b}</b>")


@pytest.mark.parametrize("name", list(POOLS))
def test_pool_animations_have_one_frame_per_snapshot(name: str) -> None:
    state = POOLS[name]
    history = History()
    history.add(
        "before",
        BlockPoolState(
            block_size=state.block_size,
            blocks=tuple(BlockState(b.block_id, is_null=b.is_null) for b in state.blocks),
            free_queue=tuple(range(state.num_blocks)),
        ),
    )
    history.add("after", state)
    for fig in (block_pool_animation(history), free_queue_animation(history)):
        assert len(fig.frames) == 2
        assert [s.label for s in fig.layout.sliders[0].steps] == ["0", "1"]
    last = block_pool_animation(history).frames[1]
    assert list(last.data[0].z) == list(block_pool_figure(state).data[0].z)


# ---------------------------------------------------------------------- the lesson's examples


def test_example_2_highlight_shows_the_slot_of_token_36() -> None:
    state = ex02.example_2().history[-1].state
    fig = block_pool_figure(state, highlight=("A", 36))
    assert (
        "A token 36 → logical block 2, offset 4 → physical block 9 → slot 9×16+4 = 148"
        in fig.layout.title.text
    )
    rows = {t: i for i, t in enumerate(fig.layout.yaxis2.ticktext)}
    tables = fig.data[1]
    assert list(tables.text[rows["A · 37 tok"]][:3]) == ["7", "2", "9"]
    assert list(tables.text[rows["B · 20 tok"]][:2]) == ["4", "0"]
    cols, _ = grid_shape(state.num_blocks)
    highlight = [t for t in fig.data if t.name == theme.MARK_STYLES["highlight"]["label"]]
    assert outlined_cells(highlight[0]) == {(9 % cols, 9 // cols)}  # physical block 9 in the grid
    assert outlined_cells(highlight[1]) == {(2, rows["A · 37 tok"])}  # logical block 2 in A's table
    slot = trace_named(fig, "the chosen token's slot")
    assert list(slot.hovertext) == ["A token 36: slot 148"] * 2
    assert slot.x[0] == pytest.approx(9 - 0.5 + 4.5 / 16)  # offset 4 of 16 inside block 9


def test_example_4_marks_the_copy_on_write_target_and_shared_blocks() -> None:
    history = ex04.example_4().history
    cow = next(s.state for s in history if s.state.copied_blocks)
    fig = block_pool_figure(cow)
    ((source, target),) = cow.copied_blocks
    copied = trace_named(fig, theme.MARK_STYLES["copied"]["label"])
    assert outlined_cells(copied) == {(target, 0)}
    last = history[-1].state
    fig = block_pool_figure(last)
    assert block_cell(fig, last, 0)[1] == "<b>0</b><br>ref 3"  # shared by three samples
    # an owner's name is kept whole, broken before its number where the cell is narrow; never "s0"
    assert block_cell(fig, last, target)[1] in ("<b>3</b><br>sample 0", "<b>3</b><br>sample<br>0")


def test_example_7_free_queue_shows_evictions_with_their_hashes() -> None:
    history = ex07.example_7().history
    d_step = next(i for i, s in enumerate(history) if caption(s).startswith("allocate D"))
    fig = free_queue_figure(history[d_step].state, history[d_step - 1].state)
    left = {c: label for (c, r), (_, label, _) in grid_cells(fig).items() if r == 0}
    # D took blocks 2, 4, 3 from the front and evicted a3, b2, b1, drawn where they left from
    assert left == {0: "<b>2</b><br>evict a3", 1: "<b>4</b><br>evict b2", 2: "<b>3</b><br>evict b1"}
    crosses = trace_named(fig, theme.MARK_STYLES["evicted"]["label"])
    assert len([x for x in crosses.x if x is not None]) == 3 * 4  # one cross (two strokes) per eviction
    c_step = next(i for i, s in enumerate(history) if caption(s).startswith("allocate C"))
    fig = free_queue_figure(history[c_step].state, history[c_step - 1].state)
    left = {label for (c, r), (_, label, _) in grid_cells(fig).items() if r == 0}
    assert left == {"<b>0</b><br>hit", "<b>1</b><br>hit", "<b>5</b><br>new"}
    final = free_queue_figure(history[-1].state)
    queue = [label for (c, r), (_, label, _) in sorted(grid_cells(final).items()) if r == 1]
    assert [q.split("</b>")[0].removeprefix("<b>") for q in queue] == ["5", "1", "0"]


def test_copy_on_write_targets_leave_the_free_queue_marked() -> None:
    """Example 4: each sample's write takes a fresh block for its copy; the queue shows it leaving."""
    history = ex04.example_4().history
    cows = [i for i, s in enumerate(history) if s.state.copied_blocks]
    assert [history[i].state.copied_blocks for i in cows] == [((2, 3),), ((2, 4),)]
    copy_label = theme.MARK_STYLES["copied"]["label"]
    for i in cows:
        state, previous = history[i].state, history[i - 1].state
        ((source, target),) = state.copied_blocks
        fig = free_queue_figure(state, previous)
        left = {c: label for (c, r), (_, label, _) in grid_cells(fig).items() if r == 0}
        assert list(left) == [previous.free_queue.index(target)]  # drawn where it left from: the front
        assert left[0].startswith(f"<b>{target}</b><br>") and "copy" in left[0] and str(source) in left[0]
        hover = grid_cells(fig)[(0, 0)][2]
        assert f"copy-on-write of block {source}" in hover
        assert outlined_cells(trace_named(fig, copy_label)) == {(0, 0)}
        assert copy_label in legend_names(fig)
    fork = next(i for i, s in enumerate(history) if caption(s).startswith("fork"))
    for previous in (history[fork - 1].state, None):  # a fork shares blocks in use: nothing leaves the queue
        fig = free_queue_figure(history[fork].state, previous)
        assert not [r for (_, r) in grid_cells(fig) if r == 0]
        assert not legend_names(fig) & {theme.MARK_STYLES[k]["label"] for k in ("hit", "copied", "new")}
    anim = free_queue_animation(history)
    assert copy_label in {t.name for t in anim.data if t.showlegend}
    for i in cows:
        target = history[i].state.copied_blocks[0][1]
        assert str(anim.frames[i].data[0].text[0][0]).startswith(f"<b>{target}</b>")


def test_block_labels_name_their_owner_in_full_up_to_64_blocks() -> None:
    """Owner names are kept whole (over two lines if need be) where the default figure has room."""
    names = ["sample 0", "request 12", "others", "B"]
    for num_blocks in (8, 12, 13, 40, 64):
        pool = paged.BlockPool(num_blocks, 4, share_prefixes=False)
        per = max(1, num_blocks // len(names))
        for name in names:
            pool.allocate(name, 4 * per)
        state = pool.snapshot()
        fig = block_pool_figure(state)
        cells = grid_cells(fig)
        cols, _ = grid_shape(num_blocks)
        assert cols <= 12
        room = (LABEL_WIDTH - fig.layout.margin.l - 20) / cols - 6  # px across a cell at the default width
        for rid, table in state.tables:
            for b in table:
                label = block_cell(fig, state, b, cells)[1]
                owner_lines = label.split("<br>")[1:]
                assert " ".join(owner_lines) == rid, (num_blocks, label)  # whole: no initials, no cut
                assert all(text_px(line) <= room for line in owner_lines), (num_blocks, label)


def test_chart_legends_sit_under_the_x_axis_title() -> None:
    """The legend starts below the tick labels and axis title, and the figure has room for it when it wraps."""
    ex3 = ex03.example_3(record=False)
    figs = [
        utilization_figure([ex3.reserving, ex3.paged]),
        hit_rate_figure({"a": 0.5, "b": 0.25}),
        per_turn_figure({"x": [1, 2, 3], "y": [3, 2, 1]}, y_title="tokens", title="t"),
        cache_n_figure({"one": [(0, 10), (8, 3)], "two": [(0, 10), (2, 9)]}),
    ]
    for fig in figs:
        m, height = fig.layout.margin, fig.layout.height
        plot_h = height - m.t - m.b
        below_plot = -fig.layout.legend.y * plot_h
        assert fig.layout.legend.yanchor == "top" and below_plot >= 50  # under ticks and the axis title
        need = legend_height(
            [t.to_plotly_json() for t in fig.data], left=m.l, font_px=13, traceorder="normal"
        )
        assert m.b >= below_plot + need  # room for the legend as wrapped at the narrowest width


@pytest.mark.parametrize("make", [
    lambda: contiguous_animation(ex01.example_1().exact_fit.history),
    lambda: block_pool_animation(ex04.example_4().history),
    lambda: free_queue_animation(ex07.example_7().history),
    lambda: radix_animation(ex08.example_8().history),
])  # fmt: skip
def test_animation_controls_have_their_own_rows_under_the_legend(make) -> None:
    """Buttons on a row of their own, the slider across the whole width under them, both under the legend."""
    fig = make()
    m, height = fig.layout.margin, fig.layout.height
    plot_h = height - m.t - m.b
    slider, menu = fig.layout.sliders[0], fig.layout.updatemenus[0]
    assert slider.x == 0 and slider.len == 1 and menu.x == 0 and menu.xanchor == "left"
    buttons_top, slider_top = -menu.y * plot_h, -slider.y * plot_h  # px under the plot
    assert slider_top - buttons_top >= 36  # a button is about 30 px tall
    legend_bottom = -fig.layout.legend.y * plot_h + legend_height(
        [t.to_plotly_json() for t in fig.data],
        left=m.l,
        width=NARROWEST,
        font_px=fig.layout.legend.font.size or 13,
        traceorder=fig.layout.legend.traceorder,
    )
    assert buttons_top >= legend_bottom
    assert m.b >= slider_top + 70  # the slider's rail and step numbers fit in the figure


def test_example_8_radix_tree_shows_locks_and_the_evicted_leaf() -> None:
    ex = ex08.example_8()
    fig = radix_tree_figure(ex.tree_after_evict)
    texts = list(trace_named(fig, "nodes").text)
    assert "[1, 2, 3, 4, 5, 6]<br>lock 1 · t=" in " ".join(texts)
    assert any(t.startswith("[20, 21, 22]<br>lock 1") for t in texts)
    assert any(t.startswith("[10, 11]<br>unlocked") for t in texts)
    assert "[30, 31]<br>evicted" in texts
    assert "evictable 2, protected 9" in fig.layout.title.text
    anim = radix_animation(ex.history)
    assert len(anim.frames) == len(ex.history)
    for frame, step in zip(anim.frames, ex.history, strict=True):
        assert caption(step) in frame.layout.title.text.replace("<br>", " ")


def test_example_8_wide_tree_grows_to_the_right() -> None:
    tree = radix.RadixTree()
    for k in range(24):
        tree.insert([1, 2, 3, 100 + k, 200 + k])
    fig = radix_tree_figure(tree.snapshot())
    nodes = trace_named(fig, "nodes")
    leaves = [y for x, y in zip(nodes.x, nodes.y, strict=True) if x == 2]
    assert sorted(leaves) == list(range(24))


def test_example_6_hash_chain_marks_changed_blocks() -> None:
    base = [11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42]
    late, early = list(base), list(base)
    late[9], early[1] = 99, 99
    rows = {"base": base, "late": late, "early": early}
    chains = {name: hashing.hash_chain(tokens, 4) for name, tokens in rows.items()}
    fig = hash_chain_figure(chains | {"salt": hashing.hash_chain(base, 4, salt="tenant-b")})
    text = fig.data[0].text
    assert [t.split("</b>")[0][3:] for t in text[0][:3]] == ["6cfd527e", "9f569157", "e0297480"]
    assert [t.split("<br>")[1] for t in text[1][:3]] == ["same", "same", "changed"]
    assert text[1][2].startswith("<b>6417173d")
    assert [t.split("<br>")[1] for t in text[2][:3]] == ["changed"] * 3
    assert text[3][0].startswith("<b>6057b827")
    assert text[0][3] == "2 tok<br>no hash"  # the partial block is never hashed
    digests = hash_chain_figure(
        {"a": hashing.block_hashes(base, 4), "b": [d.hex() for d in hashing.block_hashes(late, 4)]}
    )
    assert [t.split("<br>")[1] for t in digests.data[0].text[1]] == ["same", "same", "changed"]


def test_example_1_strip_shows_regions_waste_and_gaps() -> None:
    ex = ex01.example_1()
    part1 = contiguous_figure(ex.reserve_max.history[-1].state)
    stored = trace_named(part1, "stores KV")
    assert list(stored.x) == [300, 1200, 150, 700]
    spare = trace_named(part1, "reserved, unused")
    assert list(spare.x) == [2048 - 300, 2048 - 1200, 2048 - 150, 2048 - 700]
    assert "28.7% of the pool" in part1.layout.title.text and "refused so far: r4" in part1.layout.title.text
    gaps_state = ex.exact_fit.history[-1].state
    gaps = trace_named(contiguous_figure(gaps_state), "free gap")
    assert list(gaps.x) == [600, 400, 892]
    anim = contiguous_animation(ex.exact_fit.history)
    assert len(anim.frames) == len(ex.exact_fit.history)
    assert list(anim.frames[-1].data[2].x) == [600, 400, 892]


@pytest.mark.parametrize("pool", [
    ContiguousState(1, ()), ContiguousState(1, (Region("A", 0, 1, 1),)), ContiguousState(100, ()),
    ContiguousState(512, tuple(Region(f"r{i}", i, 1, i % 2) for i in range(512))),
])  # fmt: skip
def test_contiguous_figure_handles_edge_pools(pool: ContiguousState) -> None:
    fig = contiguous_figure(pool)
    assert len(trace_named(fig, "stores KV").x) == len(pool.regions)
    assert sum(trace_named(fig, "free gap").x) == pool.pool_size - pool.reserved


def test_frames_match_snapshots_in_number_and_content() -> None:
    history = ex07.example_7().history
    anim = free_queue_animation(history)
    pool_anim = block_pool_animation(history)
    assert len(anim.frames) == len(pool_anim.frames) == len(history)
    assert len(anim.layout.sliders[0].steps) == len(history)
    for i, (frame, step) in enumerate(zip(pool_anim.frames, history, strict=True)):
        state = step.state
        assert frame.name == str(i)
        assert f"Step {i} of {len(history) - 1}: " in frame.layout.title.text
        cols, _ = grid_shape(state.num_blocks)
        z = frame.data[0].z
        assert [z[b // cols][b % cols] for b in range(state.num_blocks)] == [
            STATUS_CODE[b.status] for b in state.blocks
        ]
        tables = [t for t in frame.layout.yaxis2.ticktext if t]
        assert tables == [f"{rid} · {n} tok" for rid, n in state.token_counts]
    for frame, step in zip(anim.frames, history, strict=True):
        queue = [label.split("</b>")[0].removeprefix("<b>") for label in frame.data[0].text[1] if label]
        assert queue == [str(b) for b in step.state.free_queue]


def test_animation_plays_without_a_kernel(tmp_path) -> None:
    fig = free_queue_animation(ex07.example_7().history)
    path = tmp_path / "anim.html"
    fig.write_html(path, include_plotlyjs=True, auto_play=False)
    page = path.read_text()
    assert '<script src="http' not in page  # plotly.js is inlined: no network needed
    assert "Plotly.addFrames" in page or '"frames"' in page
    play, pause = fig.layout.updatemenus[0].buttons
    assert play.method == "animate" and play.args[0] is None
    assert list(pause.args[0]) == [None]


def test_highlight_in_animation_is_skipped_where_the_request_is_absent() -> None:
    history = ex02.example_2().history
    anim = block_pool_animation(history, highlight=("A", 36))
    drawn = [
        any(x is not None for t in f.data if t.name == "the chosen token's slot" for x in t.x)
        for f in anim.frames
    ]
    assert drawn == [False, False, True, True]


# ---------------------------------------------------------------------- bars and lines


def test_hit_rate_and_utilization_figures_take_model_records() -> None:
    ex3 = ex03.example_3(record=False)
    fig = utilization_figure([ex3.reserving, ex3.paged])
    stored = trace_named(fig, "stores KV")
    assert [round(v, 1) for v in stored.x] == [37.6, 92.0]
    assert "4 requests" in stored.text[0] and "8 requests" in stored.text[1]
    rates = hit_rate_figure({"stable prefix": 11696 / 13700, "timestamp first": 0.0,
                             "tools in random order": {"cached_tokens": 2736, "total_tokens": 13700}})  # fmt: skip
    hit, miss = rates.data
    assert list(hit.text) == ["85.4%", "", "20.0%"]
    assert list(miss.text) == ["", "hit 0.0%", ""]  # too short a bar: the label moves onto the miss bar


def test_per_turn_figures() -> None:
    append_only = [2400] + [400] * 19
    trimmed = [2400, 400, 400, 400, 400] + [2000] * 15  # example 13: trimming the front rewrites the history
    fig = tokens_per_turn_figure({"append-only": append_only, "keep last 5": trimmed}, cumulative=True)
    assert fig.data[0].y[-1] == 10_000 and fig.data[1].y[-1] == 34_000
    assert fig.data[0].line.dash != fig.data[1].line.dash  # told apart without colour
    turns = [
        {"prompt_tokens": 34, "cache_n": 0, "prompt_n": 34},
        {"prompt_tokens": 56, "cache_n": 41, "prompt_n": 15},
    ]
    fig = cache_n_figure({"append-only": turns, "clock": [(3, 43), (10, 58)]})
    assert list(fig.data[0].y) == [0, 41] and list(fig.data[1].y) == [34, 15]
    assert list(fig.data[2].y) == [3, 10] and list(fig.data[3].y) == [43, 58]


# ---------------------------------------------------------------------- bad input and setup


@pytest.mark.parametrize("call, error", [
    (lambda: block_pool_figure("not a state"), InvalidArgumentError),
    (lambda: block_pool_figure(POOLS["full"], highlight=("nobody", 0)), UnknownRequestError),
    (lambda: block_pool_figure(POOLS["full"], highlight=("r0", 12)), InvalidArgumentError),
    (lambda: block_pool_figure(POOLS["full"], highlight=("r0",)), InvalidArgumentError),
    (lambda: free_queue_figure(POOLS["full"], previous=3), InvalidArgumentError),
    (lambda: radix_tree_figure(POOLS["full"]), InvalidArgumentError),
    (lambda: block_pool_animation(History()), InvalidArgumentError),
    (lambda: block_pool_animation([POOLS["full"], ContiguousState(1, ())]), InvalidArgumentError),
    (lambda: block_pool_animation("history"), InvalidArgumentError),
    (lambda: hash_chain_figure({"a": [1, 2, 3, 4]}), InvalidArgumentError),
    (lambda: hash_chain_figure({}), InvalidArgumentError),
    (lambda: hash_chain_figure({"a": hashing.hash_chain([1, 2], 1), "b": hashing.hash_chain([1, 2], 2)}),
     InvalidArgumentError),
    (lambda: hit_rate_figure({"a": 85.4}), InvalidArgumentError),
    (lambda: hit_rate_figure({"a": "high"}), InvalidArgumentError),
    (lambda: tokens_per_turn_figure({"a": [1, "two"]}), InvalidArgumentError),
    (lambda: cache_n_figure({"a": []}), InvalidArgumentError),
    (lambda: utilization_figure({"a": {"pool": 10, "stored": 11}}), InvalidArgumentError),
    (lambda: contiguous_figure(POOLS["full"], title=3), InvalidArgumentError),
])  # fmt: skip
def test_bad_input_is_rejected_with_a_kvlab_error(call, error) -> None:
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, KvlabError) and str(info.value)


def test_importing_the_views_leaves_the_widgets_for_later() -> None:
    """``import kvlab.views`` loads neither ipywidgets nor IPython; the widgets load on first use."""
    code = (
        "import sys, kvlab.views as v\n"
        "assert 'ipywidgets' not in sys.modules and 'IPython' not in sys.modules, 'loaded too early'\n"
        "from kvlab.views import Playground, Stepper, stepper\n"
        "import kvlab.views.playground as p, kvlab.views.live as s\n"
        "assert (Stepper, Playground, stepper) == (s.Stepper, p.Playground, s.stepper)\n"
        "assert 'ipywidgets' in sys.modules and {'Stepper', 'Playground'} <= set(dir(v))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with pytest.raises(AttributeError):
        import kvlab.views as views

        views.no_such_view  # noqa: B018


def test_kvlab_template_keeps_plotly_white_for_what_the_views_draw() -> None:
    white = pio.templates["plotly_white"].to_plotly_json()
    ours = pio.templates[theme.TEMPLATE_NAME].to_plotly_json()
    assert set(ours["data"]) == set(theme.TEMPLATE_TRACES) == {"bar", "heatmap", "scatter"}
    assert all(ours["data"][k] == white["data"][k] for k in theme.TEMPLATE_TRACES)
    for key in set(white["layout"]) - {"geo", "polar", "scene", "ternary", "font", "colorway", "hoverlabel",
                                       "title"}:  # fmt: skip
        assert ours["layout"][key] == white["layout"][key], key
    assert ours["layout"]["font"]["family"] == theme.FONT_FAMILY
    spec_types = {
        t["type"] for s in (block_pool_spec(ex02.example_2().history[-1].state),) for t in s["data"]
    }
    assert spec_types <= set(theme.TEMPLATE_TRACES)


def test_setup_configures_offline_renderers_and_rejects_unknown_ones(monkeypatch) -> None:
    before = pio.renderers.default
    try:
        monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
        assert setup() == "plotly_mimetype+notebook_connected"
        assert pio.renderers.default == "plotly_mimetype+notebook_connected"
        assert pio.templates.default == "plotly_white+kvlab"
        other = go.Figure(go.Pie(values=[1, 2]))  # a figure of the student's own: plotly_white, kvlab's fonts
        assert other.layout.template.layout.font.family == theme.FONT_FAMILY
        assert other.layout.template.data.pie == pio.templates["plotly_white"].data.pie
        with pytest.raises(InvalidArgumentError):
            setup("nonsense+json")
        assert (
            pio.renderers.default == "plotly_mimetype+notebook_connected"
        )  # a rejected call changes nothing
        assert setup("json") == "json"
    finally:
        pio.renderers.default = before
        pio.templates.default = "plotly"


def test_status_colours_are_distinct_and_all_in_the_legend() -> None:
    assert len(set(theme.STATUS_COLORS.values())) == len(theme.STATUS_COLORS)
    null_pool = BlockPoolState(block_size=4, blocks=(BlockState(0, is_null=True), BlockState(1)), free_queue=(1,),
                               null_block=0)  # fmt: skip
    fig = block_pool_figure(null_pool)
    assert legend_names(fig) == {"null", "free, never used"}  # the legend lists only the statuses present
    assert block_cell(fig, null_pool, 0)[0] == STATUS_CODE["null"]


def test_spec_is_stable_in_shape_across_snapshots() -> None:
    """Every snapshot gives the same traces in the same order: what frames and the stepper rely on."""
    history = ex07.example_7().history
    shapes = {tuple((t["type"], t.get("name")) for t in block_pool_spec(s.state)["data"]) for s in history}
    assert len({tuple(k for k, _ in shape) for shape in shapes}) == 1
