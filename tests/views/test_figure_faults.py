"""Faults a reader saw in the rendered figures, each pinned by a test that would have caught it.

- Notebook 08's radix animation: the root box and the root's edges must move together in every frame
  (checked on the frames' data, and in Chromium after stepping the animation as its slider does).
- Animation titles wrap only at phrase boundaries, never inside "Step N of M".
- The hash-chain figure calls a block the first row never hashed "new", not "changed" (notebook 15).
- Radix box labels fit their boxes at plotly's default width.
- The routing figure (notebook 16) uses kvlab's template and chart layout, with titled axes.
"""

from __future__ import annotations

import re
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.hashing import hash_chain
from kvlab.lessons.capstone import most_cached, round_robin, route_fleet, user_hash
from kvlab.lessons.ex07 import example_7
from kvlab.lessons.ex08 import example_8
from kvlab.models.radix import RadixTree
from kvlab.views import theme
from kvlab.views._common import HEAD_WIDTH, LABEL_WIDTH, text_px, wrap
from kvlab.views.animations import free_queue_animation, radix_animation, step_caption
from kvlab.views.hash_chain import hash_chain_figure
from kvlab.views.routing import replica_load_figure

# ---------------------------------------------------------------------- the radix root moves with its edges


def _root_and_edges(data) -> tuple[tuple[float, float, float], list[tuple[float, float]]]:
    """(centre x, centre y, half height) of the root box, and where each edge from the root starts."""
    root = next(t for t in data if t["name"] == "root")
    xs, ys = root["x"][:4], root["y"][:4]
    cx, cy, half = (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2, (max(ys) - min(ys)) / 2
    edges = next(t for t in data if t["name"] == "edges")
    starts, new = [], True
    for x, y in zip(edges["x"], edges["y"], strict=True):
        if x is None:
            new = True
        elif new:
            starts.append((x, y))
            new = False
    return (cx, cy, half), starts


def wide_tree() -> RadixTree:
    """Ten leaves under one root: the view grows to the right (across)."""
    tree = RadixTree(record=True)
    for i in range(10):
        tree.insert([i + 1, 100 + i])
    return tree


def test_every_radix_frame_draws_the_root_where_its_edges_start() -> None:
    for history, across in ((example_8().history, False), (wide_tree().history, True)):
        fig = radix_animation(history, title="Example 8")
        for frame in fig.frames:
            (cx, cy, half), starts = _root_and_edges([t.to_plotly_json() for t in frame.data])
            if across:  # the root's edges leave its right side, at its centre height
                root_edges = [s for s in starts if s[0] == pytest.approx(cx + 0.2)]
                assert all(y == pytest.approx(cy) for _, y in root_edges), frame.name
            else:  # they leave the root box's bottom, at its centre
                root_edges = [s for s in starts if s[1] == pytest.approx(cy + half)]
                assert all(x == pytest.approx(cx) for x, _ in root_edges), (frame.name, cx, root_edges)
            assert len(root_edges) == len(history[int(frame.name)].state.root.children), frame.name


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_in_a_browser_the_root_box_follows_every_frame(tmp_path) -> None:
    """Step notebook 08's animation in Chromium, frame after frame and back, and measure the drawn SVG."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    fig = radix_animation(example_8().history, title="Example 8")
    page_file = tmp_path / "radix.html"
    fig.write_html(page_file, include_plotlyjs=True, div_id="gd")
    grey = "rgb(158, 158, 158)"  # theme.GREY, the edges' colour
    root_fill = "rgb(68, 68, 68)"  # theme.NODE_COLORS["root"]
    measure = f"""() => {{
        const paths = Array.from(document.querySelectorAll('#gd .scatterlayer path'));
        const box = paths.find(p => (p.style.fill || '') === '{root_fill}').getBBox();
        const edges = paths.filter(p => (p.style.stroke || '') === '{grey}' && p.getAttribute('d'));
        const starts = edges.flatMap(p => p.getAttribute('d').split('M').slice(1)
                                      .map(seg => seg.split('L')[0].split(',').map(Number)));
        return {{cx: box.x + box.width / 2, bottom: box.y + box.height, starts}}; }}"""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 700, "height": 900})
        page.goto(page_file.as_uri())
        page.wait_for_function("() => document.getElementById('gd')._fullLayout !== undefined")
        order = [*range(len(fig.frames)), 0, len(fig.frames) - 1, 2, 1]
        for i in order:
            for redraw in ("true", "false"):  # the slider redraws; a paused or plain animate may not
                page.evaluate(
                    f"() => Plotly.animate('gd', ['{i}'], {{mode: 'immediate', "
                    f"frame: {{duration: 0, redraw: {redraw}}}, transition: {{duration: 0}}}})"
                )
                page.wait_for_timeout(150)
                got = page.evaluate(measure)
                root_edges = [s for s in got["starts"] if abs(s[1] - got["bottom"]) < 2]
                children = len(example_8().history[i].state.root.children)
                assert len(root_edges) == children, (i, redraw, got)
                assert all(abs(x - got["cx"]) < 1.5 for x, _ in root_edges), (i, redraw, got)
        browser.close()


# ---------------------------------------------------------------------- titles break between phrases


STEP = re.compile(r"Step\s*(?:<br>)?\s*\d+\s*(?:<br>)\s*of|Step\s*<br>\s*\d+|of\s*<br>\s*\d+")


def test_the_free_queue_title_breaks_after_the_step_not_inside_it() -> None:
    fig = free_queue_animation(example_7().history, title="Example 7")
    for frame in fig.frames:
        head = frame.layout.title.text.split("</b>")[0]
        assert not STEP.search(head), head
    first = fig.frames[0].layout.title.text.split("</b>")[0]
    assert "Step 0 of 7:<br>" in first  # the break falls at the phrase's end


def test_the_radix_titles_keep_each_token_list_whole() -> None:
    fig = radix_animation(example_8().history, title="Example 8")
    for frame in fig.frames:
        head = frame.layout.title.text.split("</b>")[0].removeprefix("<b>")
        assert not STEP.search(head), head
        for line in head.split("<br>"):
            assert line.count("[") == line.count("]"), head  # a bracketed run never spans two lines
            assert len(line) <= HEAD_WIDTH


words = st.text(alphabet="abcdefghij", min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    prefix=st.lists(words, max_size=4),
    index=st.integers(0, 999),
    count=st.integers(1, 999),
    rest=st.lists(words, min_size=1, max_size=14),
)
def test_wrap_never_splits_step_n_of_m(prefix: list[str], index: int, count: int, rest: list[str]) -> None:
    title = " · ".join([*(prefix and [" ".join(prefix)]), step_caption(index, count + 1, " ".join(rest))])
    wrapped = wrap(title, HEAD_WIDTH)
    assert f"Step {index} of {count}:" in wrapped.replace("<br>", "\n")
    assert wrapped.replace("<br>", " ") == title
    assert all(len(line) <= HEAD_WIDTH for line in wrapped.split("<br>"))


def test_wrap_prefers_a_phrase_end_and_keeps_given_breaks() -> None:
    assert wrap("Free queue · Example 7 · Step 0 of 7: 6 free blocks of 16 tokens", 62) == (
        "Free queue · Example 7 · Step 0 of 7:<br>6 free blocks of 16 tokens"
    )
    long = "The engine's prefix cache across four chat turns · Step 5 of 10: free req-1: [4] to the front"
    assert not any(line.startswith("·") for line in wrap(long, 62).split("<br>"))  # the dot ends a line
    assert wrap("short<br>kept", 62) == "short<br>kept"
    assert wrap("x" * 80, 62) == "x" * 80  # a word longer than a line stays whole


# ---------------------------------------------------------------------- hash chains: new is not changed


def test_blocks_the_first_row_never_hashed_are_new_not_changed() -> None:
    """Notebook 15: turn 2 appends a message; its extra blocks are new, and nothing is changed."""
    turn1 = list(range(100, 123))  # 5 full blocks of 4 and 3 tokens left over
    turn2 = turn1 + [401, 402, 403, 404, 405, 406, 407]  # 7 full blocks and 2 left over
    fig = hash_chain_figure({"turn 1 (cached)": hash_chain(turn1, 4), "turn 2 prompt": hash_chain(turn2, 4)})
    cells = fig.data[0]
    labels = [t.split("<br>")[1] for t in cells.text[1] if t]
    assert labels[:5] == ["same"] * 5 and labels[5:7] == ["new", "new"] and labels[7] == "no hash"
    kinds = list(theme.CHAIN_COLORS)
    assert [kinds[z] for z in cells.z[1][5:7]] == ["new (the first row has no such block)"] * 2
    assert "changed" not in " ".join(cells.text[1])
    assert "first time" in cells.hovertext[1][5]
    legend = [t.name for t in fig.data[1:]]
    assert "changed" not in legend and "new (the first row has no such block)" in legend


def test_a_changed_block_is_still_changed() -> None:
    base = [11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42]
    late = list(base)
    late[9] = 99
    fig = hash_chain_figure({"base": hash_chain(base, 4), "late edit": hash_chain(late, 4)})
    labels = [t.split("<br>")[1] for t in fig.data[0].text[1] if t]
    assert labels == ["same", "same", "changed", "no hash"]
    assert "new (the first row has no such block)" not in [t.name for t in fig.data[1:]]


def test_row_names_get_the_room_they_need() -> None:
    name = "timestamp before the system prompt"  # about 240 px of 13 px text: more than a fixed 110 px margin
    fig = hash_chain_figure({name: hash_chain([1, 2, 3, 4], 4), "turn 2": hash_chain([1], 4)})
    assert list(fig.layout.yaxis.ticktext) == [name, "turn 2"]
    assert fig.layout.margin.l >= text_px(name, 13)
    long = hash_chain_figure({"x" * 500: hash_chain([1, 2, 3, 4], 4)})
    assert long.layout.margin.l <= 300 and long.layout.yaxis.ticktext[0].endswith("…")  # cut, not the plot


# ---------------------------------------------------------------------- radix labels fit their boxes


def test_radix_box_labels_fit_their_boxes_at_the_default_width() -> None:
    fig = radix_animation(example_8().history, title="Example 8")
    plot_px = LABEL_WIDTH - 40
    char_px = 0.602 * 11  # DejaVu Sans Mono at 11 px
    for frame in fig.frames:
        x_range = fig.layout.xaxis.range
        px_per_unit = plot_px / (x_range[1] - x_range[0])
        box = next(t for t in frame.data if t.name == "unlocked").x or [-0.44, 0.44]
        box_px = (max(v for v in box[:4]) - min(v for v in box[:4])) * px_per_unit
        labels = next(t for t in frame.data if t.name == "nodes").text
        for label in labels:
            for line in re.sub(r"</?b>", "", label).split("<br>"):
                assert len(line) * char_px <= box_px, (frame.name, line, box_px)


# ---------------------------------------------------------------------- routing uses the shared layout


def test_the_routing_figure_uses_kvlab_s_template_and_titled_axes() -> None:
    results = [
        route_fleet(r, users=8, turns=2, system_tokens=64, capacity_blocks=400)
        for r in (round_robin, user_hash, most_cached)
    ]
    fig = replica_load_figure(results)
    assert fig.layout.template.layout.font.family == theme.FONT_FAMILY
    assert fig.layout.xaxis.title.text == fig.layout.xaxis2.title.text == "replica"
    assert fig.layout.yaxis.title.text and fig.layout.yaxis2.title.text
    assert [t.marker.color for t in fig.data if t.showlegend] == [theme.BLUE, theme.VERMILLION, theme.GREEN]
    # the legend hangs below the x-axis titles, in a bottom margin that holds it
    assert fig.layout.legend.yanchor == "top" and fig.layout.legend.y < 0
    assert fig.layout.margin.b >= 56 + 29
