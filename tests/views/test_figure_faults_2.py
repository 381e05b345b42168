"""More faults a reader saw in the rendered figures of notebooks 01-05 and 13, each pinned by a test.

- Block-pool animations (02-05): the legend lists the same entries in every frame (a highlight's
  entries too, before the token exists), so it never jumps; it sits clear of the last block-table row;
  the highlight's outline is not cut off at the plot's edge.
- Block-pool vocabulary (02-05, 07): a never-used block is free, so the subtitle's free count is the
  free list the notebooks print beside it ("3 free (never used)", never "0 free ... 3 never used"), and
  the legend names only the statuses the pool's blocks have: no "free, cached" before notebook 07.
- Block-pool marks (03, 04): a step that changes nothing (notebook 03's r8 waiting) marks nothing, though
  its snapshot repeats the previous allocation's marks; the fixed legend lists only the marks some frame
  draws. A hover never lists placeholder token ids ("[-1, -1, ...]") for a run written by count.
- Captions: one arrow ("→") across the package, singular and plural nouns ("1 token", never
  "token(s)"), long block lists written as runs (an 88-block allocation filled notebook 03's title
  with ten lines of ids), thousands separators.
- Notebook 13: the bar labels never cross the fixed prefix's line, never shrink to fit a thin bar
  (they go outside it or are left to the hover), and a policy's count never runs into a name that ends
  in a number ("one summary at 12 400").
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.core.snapshots import Event
from kvlab.errors import InvalidArgumentError
from kvlab.lessons import ex01, ex02, ex03, ex04, ex05, ex07
from kvlab.lessons.ex13 import example_13
from kvlab.models.paged import UNKNOWN_TOKEN
from kvlab.views import block_pool_animation, block_pool_figure, contiguous_figure, theme
from kvlab.views import text as text_package
from kvlab.views._common import text_px
from kvlab.views.agents import (
    agent_turn_spec,
    agent_turns_animation,
    agent_turns_hints,
    agent_turns_history,
    prompt_split_figure,
)
from kvlab.views.block_pool import NO_TOKEN_ID, SLOT_LABEL, block_pool_marks, block_pool_spec
from kvlab.views.text import block_list, caption, captions, plural
from kvlab.views.wrapping import title_lines

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def legend_names(data) -> list[str]:
    return [t["name"] for t in data if t.get("showlegend")]


def block_pool_histories():
    return {
        "02": (ex02.example_2().history, ("A", 36)),
        "03": (ex03.example_3().paged.history, None),
        "04": (ex04.example_4().history, None),
        "05": (ex05.example_5().history, None),
        "07": (ex07.example_7().history, None),
    }


# ---------------------------------------------------------------------- block-pool marks and hovers


def drawn_marks(data) -> set[str]:
    """The mark kinds a frame draws (an outline or cross with at least one point)."""
    names = {style["label"]: kind for kind, style in theme.MARK_STYLES.items()}
    return {
        names[t["name"]]
        for t in data
        if t.get("name") in names and any(x is not None for x in t.get("x") or [])
    }


def test_a_step_that_allocates_nothing_marks_nothing() -> None:
    history = ex03.example_3().paged.history
    last, before = history.steps[-1], history.steps[-2]
    assert last.event.kind == "utilization.wait" and last.state.blocks == before.state.blocks  # r8 waits
    assert not last.state.new_block_ids  # the wait allocates nothing, and its snapshot says so
    fig = block_pool_animation(history).to_dict()
    assert drawn_marks(fig["frames"][-2]["data"]) == {"new"}  # r7's own step outlines its blocks
    assert drawn_marks(fig["frames"][-1]["data"]) == set()
    spec = block_pool_spec(last.state, before.state)
    assert drawn_marks(spec["data"]) == set() and block_pool_marks(last.state, before.state) == set()
    assert block_pool_marks(before.state, history.steps[-3].state) == {"new"}


@pytest.mark.parametrize("notebook", ["02", "03", "04", "05"])
def test_the_legend_lists_only_marks_some_frame_draws(notebook: str) -> None:
    history, highlight = block_pool_histories()[notebook]
    fig = block_pool_animation(history, highlight=highlight).to_dict()
    drawn = set().union(*(drawn_marks(frame["data"]) for frame in fig["frames"]))
    listed = {
        kind for kind, style in theme.MARK_STYLES.items() if style["label"] in legend_names(fig["data"])
    }
    assert listed == drawn, notebook
    if notebook == "04":  # the forks share the prompt's blocks: drawn as reused, before any prefix cache
        assert drawn == {"new", "hit", "copied"}


def test_a_hover_says_when_a_run_has_no_token_ids() -> None:
    state = ex02.example_2().history[-1].state
    hovers = [h for row in block_pool_spec(state)["data"][0]["hovertext"] for h in row if h]
    held = [h for h in hovers if "tokens" in h and "0/16 tokens" not in h]
    assert held and all("no token ids in this run" in h and "-1" not in h for h in held)
    with_ids = ex05.example_5().history[-1].state  # token ids given: the hover lists them
    hovers = [h for row in block_pool_spec(with_ids)["data"][0]["hovertext"] for h in row if h]
    assert any("[1000, 1001," in h for h in hovers) and not any("no token ids" in h for h in hovers)
    assert NO_TOKEN_ID == UNKNOWN_TOKEN


# ---------------------------------------------------------------------- block-pool legends


@pytest.mark.parametrize("notebook", ["02", "03", "04", "05", "07"])
def test_every_block_pool_frame_lists_the_same_legend(notebook: str) -> None:
    history, highlight = block_pool_histories()[notebook]
    fig = block_pool_animation(history, highlight=highlight).to_dict()
    first = legend_names(fig["data"])
    assert all(legend_names(frame["data"]) == first for frame in fig["frames"]), notebook
    if highlight is not None:
        # example 2's token A 36 exists only from step 2; its entries are there from step 0
        assert "the chosen token's block" in first and SLOT_LABEL in first


def test_the_slot_is_named_in_its_hover_not_in_the_legend() -> None:
    state = ex02.example_2().history[-1].state
    fig = block_pool_figure(state, highlight=("A", 36))
    slot = next(t for t in fig.data if t.name == SLOT_LABEL)
    assert slot.showlegend and list(slot.hovertext) == ["A token 36: slot 148"] * 2
    assert "slot 9×16+4 = 148" in fig.layout.title.text


@pytest.mark.parametrize("notebook", ["02", "03", "04", "05"])
def test_the_legend_sits_clear_of_the_last_block_table_row(notebook: str) -> None:
    history, highlight = block_pool_histories()[notebook]
    for fig in (block_pool_figure(history[-1].state, highlight=highlight), block_pool_animation(history)):
        layout = fig.layout
        plot_h = layout.height - layout.margin.t - layout.margin.b
        rows_bottom = layout.yaxis2.domain[0] * plot_h  # px above the plot's bottom edge
        legend_top = layout.legend.y * plot_h  # negative: below the plot's bottom edge
        assert rows_bottom - legend_top >= 12, (notebook, rows_bottom, legend_top)


def test_the_highlight_outline_lies_inside_the_axes() -> None:
    """plotly clips a line to its axes: an outline drawn outside the range loses its top and bottom."""
    fig = block_pool_figure(ex02.example_2().history[-1].state, highlight=("A", 36))
    outlines = [t for t in fig.data if t.name == "the chosen token's block"]
    for trace in outlines:
        axes = fig.layout.xaxis2 if trace.xaxis == "x2" else fig.layout.xaxis
        yaxes = fig.layout.yaxis2 if trace.yaxis == "y2" else fig.layout.yaxis
        xs = [x for x in trace.x if x is not None]
        ys = [y for y in trace.y if y is not None]
        assert min(axes.range) < min(xs) and max(xs) < max(axes.range)
        assert min(yaxes.range) < min(ys) and max(ys) < max(yaxes.range)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_in_a_browser_the_legend_keeps_its_entries_and_place(tmp_path) -> None:
    """Step notebook 02's animation in Chromium as its slider does and read the legend drawn in each frame."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    history, highlight = block_pool_histories()["02"]
    fig = block_pool_animation(history, highlight=highlight, title="Example 2")
    page_file = tmp_path / "pool.html"
    fig.write_html(page_file, include_plotlyjs=True, div_id="gd")
    measure = """() => {
        const legend = document.querySelector('#gd .legend');
        const names = Array.from(legend.querySelectorAll('.legendtext')).map(t => t.textContent);
        const box = legend.getBoundingClientRect();
        return {names, top: box.top, height: box.height}; }"""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 700, "height": 900})
        page.goto(page_file.as_uri())
        page.wait_for_function("() => document.getElementById('gd')._fullLayout !== undefined")
        seen = []
        for i in [*range(len(fig.frames)), 0]:
            page.evaluate(
                f"() => Plotly.animate('gd', ['{i}'], {{mode: 'immediate', "
                "frame: {duration: 0, redraw: true}, transition: {duration: 0}})"
            )
            page.wait_for_timeout(150)
            seen.append(page.evaluate(measure))
        browser.close()
    assert all(s == seen[0] for s in seen), seen
    assert SLOT_LABEL in seen[0]["names"]


# ---------------------------------------------------------------------- captions


def lesson_captions() -> list[str]:
    ex1 = ex01.example_1()
    histories = [h for h, _ in block_pool_histories().values()]
    histories += [ex1.reserve_max.history, ex1.exact_fit.history]
    histories.append(agent_turns_history(example_13()))
    return [c for h in histories for c in captions(h)]


def test_captions_write_one_arrow_and_no_s_in_brackets() -> None:
    lines = lesson_captions()
    assert lines and not [c for c in lines if "->" in c or "(s)" in c]
    assert any("→" in c for c in lines)  # forks, copies and allocations read with the arrow
    assert caption(Event.of("swa.sample", n_sampled=1, n_tokens=5)) == "sampled 1 token; the slot keeps 5"
    assert caption(Event.of("swa.sample", n_sampled=2, n_tokens=1841)).startswith("sampled 2 tokens;")


def test_no_caption_module_writes_an_ascii_arrow_or_s_in_brackets() -> None:
    """Every string literal of kvlab.views.text (the captions' words), not only those the lessons reach."""
    folder = Path(text_package.__file__).parent
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                      and isinstance(n.body[0], ast.Expr)}  # fmt: skip
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                assert "->" not in node.value and "(s)" not in node.value, (path.name, node.value)


def test_a_paged_title_stays_short_however_many_blocks_a_request_takes() -> None:
    """Notebook 03: r4's 1,406 tokens took 88 blocks, and the title listed every id over ten lines."""
    history = ex03.example_3().paged.history
    lines = captions(history)
    assert "allocate r4: 1,406 tokens → blocks [194–281] (88 blocks)" in lines
    fig = block_pool_animation(history, title="Paged pool")
    assert max(title_lines(f"Paged pool · {c}") for c in lines) <= 3
    assert fig.layout.margin.t <= 160  # the plot starts under a three-line title, not under ten
    assert "r8 (1,022 tokens) needs 64 blocks, 38 free: it waits" in lines


def test_block_list_lists_few_ids_and_runs_of_many() -> None:
    assert block_list([7, 2, 9]) == "[7, 2, 9]"
    assert block_list(range(8)) == "[0, 1, 2, 3, 4, 5, 6, 7]"
    assert block_list(range(10)) == "[0–9] (10 blocks)"
    assert block_list([1, 2, 3, 10, 11, 20, 21, 22, 23]) == "[1–3, 10–11, 20–23] (9 blocks)"
    assert block_list(range(0, 46, 2)) == "[0, 2, 4, …, 40, 42, 44] (23 blocks)"


@given(st.lists(st.integers(0, 10_000), unique=True, max_size=2_000))
def test_block_list_stays_one_short_line(ids: list[int]) -> None:
    out = block_list(ids)
    assert len(out) <= 70
    if len(ids) > 8:
        assert out.endswith(f"({len(ids):,} blocks)") and str(ids[0]) in out and str(ids[-1]) in out
    else:
        assert out == str(ids)


def test_plural_counts_one_and_many() -> None:
    assert plural(1, "token") == "1 token" and plural(0, "token") == "0 tokens"
    assert plural(1022, "token") == "1,022 tokens" and plural(2, "leaf", "leaves") == "2 leaves"


def test_subtitles_count_in_words_with_thousands_separators() -> None:
    one = ex02.example_2().history[1].state  # the first allocation: one block table
    assert "· 1 block table" in block_pool_figure(one).layout.title.text
    assert "block table(s)" not in block_pool_figure(one).layout.title.text
    paged = ex03.example_3().paged.history[-1].state
    assert "r0 · 1,187 tok" in block_pool_figure(paged).layout.yaxis2.ticktext
    part_one = ex01.example_1().reserve_max.history[-1].state
    fig = contiguous_figure(part_one)
    assert "no slot free" in fig.layout.title.text and "gap(s)" not in fig.layout.title.text
    labels = next(t for t in fig.data if t.name == "labels").text
    assert "r1<br>1,200/2,048" in labels


# ---------------------------------------------------------------------- free blocks, one vocabulary


def subtitle_free_count(title: str) -> int:
    match = re.search(r"in use, ([\d,]+) free", title)
    assert match, title
    return int(match.group(1).replace(",", ""))


@pytest.mark.parametrize("notebook", ["02", "03", "04", "05", "07"])
def test_the_subtitle_counts_every_block_on_the_free_list_as_free(notebook: str) -> None:
    history, _ = block_pool_histories()[notebook]
    for step in history.steps:
        title = block_pool_figure(step.state).layout.title.text
        assert subtitle_free_count(title) == len(step.state.free_queue), (notebook, title)


def test_the_lessons_free_lists_read_the_same_in_the_figure() -> None:
    last = ex02.example_2().history[-1].state
    assert list(last.free_queue) == [5, 11, 3]
    title = block_pool_figure(last).layout.title.text
    assert "9 in use, 3 free (never used)" in title and "never used ·" not in title.replace(
        "(never used)", ""
    )
    paged = ex03.example_3().paged.history
    assert "38 free: it waits" in caption(paged.steps[-1])
    assert "474 in use, 38 free (never used)" in block_pool_figure(paged[-1].state).layout.title.text


@pytest.mark.parametrize("notebook", ["02", "03", "04", "05"])
def test_no_cached_swatch_before_a_block_is_cached(notebook: str) -> None:
    history, highlight = block_pool_histories()[notebook]
    fig = block_pool_animation(history, highlight=highlight).to_dict()
    names = legend_names(fig["data"])
    assert "free, cached" not in names and "free, never used" in names and "in use" in names
    assert "never used" not in names  # the swatch says the block is free


def test_the_cached_swatch_appears_in_every_frame_once_a_block_is_cached() -> None:
    history, _ = block_pool_histories()["07"]
    assert any(b.status == "free, cached" for s in history.steps for b in s.state.blocks)
    fig = block_pool_animation(history).to_dict()
    assert all("free, cached" in legend_names(frame["data"]) for frame in fig["frames"])
    first = history.steps[0].state  # nothing cached yet: a figure of it alone shows no cached swatch
    assert "free, cached" not in legend_names(block_pool_figure(first).to_dict()["data"])


@pytest.mark.parametrize("bad", ["in use", ["cached"], [1], {"free": 1}, 3])
def test_legend_statuses_refuses_anything_but_block_statuses(bad: object) -> None:
    state = ex02.example_2().history[-1].state
    with pytest.raises(InvalidArgumentError):
        block_pool_spec(state, legend_statuses=bad)


# ---------------------------------------------------------------------- notebook 13's bars


def label_spans(spec, px_per_token: float):
    """(name, left, right, text) in tokens of every drawn label of the prompt panel."""
    for trace in spec["data"]:
        if trace.get("mode") != "text":
            continue
        for x, label, where in zip(trace["x"], trace["text"], trace["textposition"], strict=True):
            if label:
                width = text_px(label, trace["textfont"]["size"]) / px_per_token
                left = x if where == "middle right" else x - width / 2
                yield trace["name"], left, left + width, label


@pytest.mark.parametrize("turn", range(21))
def test_turn_labels_never_cross_the_prefix_line_or_shrink(turn: int) -> None:
    history = agent_turns_history(example_13())
    hints = agent_turns_hints(history)
    spec = agent_turn_spec(history[turn].state, prefix_tokens=2000, **hints)
    bars = spec["data"][:2]
    assert all("text" not in bar for bar in bars)  # a bar's own text shrinks to fit a thin bar
    layout = spec["layout"]
    width = 650 - layout["margin"]["l"] - layout["margin"]["r"]  # the narrowest width labels are fitted at
    px_per_token = width / layout["xaxis"]["range"][1]
    cached = bars[0]["x"]
    for name, left, right, label in label_spans(spec, px_per_token):
        assert not left < 2000 < right, (turn, label)
        assert right <= layout["xaxis"]["range"][1], (turn, label)
        if name == "cached labels":
            assert right <= max(cached), (turn, label)  # inside a cached bar


def test_a_count_never_runs_into_a_policy_name() -> None:
    """'append-only, one summary at 12 400' read as the number 12 400; the count now comes first."""
    history = agent_turns_history(example_13())
    line = caption(history[10])
    assert "400 by append-only, one summary at 12" in line
    assert not re.search(r"\d \d", line)
    fig = agent_turns_animation(example_13(), prefix_tokens=2000)
    assert all(not re.search(r"\d \d", c) for c in fig.layout.meta["kvlab_captions"])


def test_the_counts_over_neighbouring_bars_never_run_together() -> None:
    """'2,000' over twenty bars at 700 px read as '2,0002,000'; a count too wide for its slot is in thousands."""
    fig = prompt_split_figure(example_13())
    for trace in (t for t in fig.data if t.type == "scatter"):
        slot_px = (650 - 90) / (len(trace.x) + 0.2)
        assert all(text_px(label, 10) + 3 <= slot_px for label in trace.text), list(trace.text)
    keep = [list(t.text) for t in fig.data if t.type == "scatter"][1]
    assert keep[:6] == ["2.4k", "400", "400", "400", "400", "2k"]
    assert any(t.hovertemplate and "%{y:,} tokens processed" in t.hovertemplate for t in fig.data)


def test_a_large_pool_animation_stays_light() -> None:
    """Notebook 03's 512-block animation: one plain hover line per block keeps it under 1 MB of JSON."""
    fig = block_pool_animation(ex03.example_3().paged.history)
    assert len(fig.to_json()) < 1_000_000
    hover = fig.data[0].hovertext[0][0]
    assert hover.isascii() and hover.startswith("block 0: never used, 0/16 tokens")
    last = fig.frames[-1].data[0].hovertext[0][0]
    assert last.startswith("block 0: in use, r0 L0, 16/16 tokens")


def test_frames_leave_out_large_keys_every_frame_shares() -> None:
    """What is the same in every frame (notebook 03's empty label arrays) is kept once, in the figure."""
    fig = block_pool_animation(ex03.example_3().paged.history)
    grid = [f.data[0] for f in fig.frames]
    assert all(t.text is None for t in grid) and fig.data[0].text is not None  # shared: kept once
    assert all(t.hovertext is not None and t.name == "blocks" for t in grid)  # changes: in every frame
