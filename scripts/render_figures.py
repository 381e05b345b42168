"""Render every kvlab view to PNG, from real runs of the lesson examples, for review.

    python scripts/render_figures.py [--out renders] [--only NAME ...] [--scale 1] [--width 1100 ...]

Each figure is drawn from the model that the notebooks use (``example_1()``
... ``example_13()``, the fleet table of lesson 002), plus edge cases (an
empty pool, one block, a full pool, 1-token blocks, 512 blocks) and a few
frames of every animation, each with its slider. Images go to ``--out``
(default ``renders/``, ignored by git), written by kaleido with Chromium
(Debian's ``chromium``; set ``BROWSER_PATH`` to use another build). Several
``--width`` values (say ``--width 700 1200``, a narrow notebook and a wide
one) put each width's images in its own folder, ``renders/w700/`` and so on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import plotly.graph_objects as go

from kvlab import views
from kvlab.core import hashing
from kvlab.core.snapshots import BlockPoolState, BlockState
from kvlab.lessons import ex01, ex02, ex03, ex04, ex05, ex07, ex08
from kvlab.models import radix
from kvlab.models.prefix_cache import PrefixCache
from kvlab.views import animations
from kvlab.views.live import Stepper
from kvlab.views.playground import Playground
from kvlab.views.text import caption

WIDTH = 1100

Render = tuple[str, Callable[[], go.Figure]]


def frame_figure(fig: go.Figure, index: int) -> go.Figure:
    """The animation ``fig`` as it looks on frame ``index``, slider included."""
    frame = fig.frames[index]
    out = go.Figure(fig)
    out.frames = []
    for trace, new in zip(out.data, frame.data, strict=True):
        trace.update(new.to_plotly_json(), overwrite=True)
    if frame.layout is not None:
        for key, value in frame.layout.to_plotly_json().items():
            out.layout[key] = value  # replace, as plotly.js does when it animates to the frame
    out.layout.sliders[0].active = index
    return out


def animation_frames(name: str, fig: go.Figure, picks: list[int]) -> Iterator[Render]:
    last = len(fig.frames) - 1
    for i in sorted({min(p if p >= 0 else last + 1 + p, last) for p in picks}):
        yield f"{name}_frame{i:02d}", lambda i=i: frame_figure(fig, i)


def renders() -> Iterator[Render]:
    # example 1: contiguous regions
    ex1 = ex01.example_1()
    yield (
        "ex1_reserve_max",
        lambda: views.contiguous_figure(
            ex1.reserve_max.history[-1].state, title="Reserve 2,048 slots per request"
        ),
    )
    yield (
        "ex1_exact_fit",
        lambda: views.contiguous_figure(
            ex1.exact_fit.history[-1].state, title="Exact sizes, first fit, after q1 and q3 finish"
        ),
    )
    yield from animation_frames(
        "ex1_anim", animations.contiguous_animation(ex1.exact_fit.history), [0, 6, -1]
    )

    # example 2: block tables and the slot of one token
    ex2 = ex02.example_2()
    yield "ex2_block_tables", lambda: views.block_pool_figure(ex2.history[-1].state, highlight=("A", 36))
    yield "ex2_slot_B19", lambda: views.block_pool_figure(ex2.history[-1].state, highlight=("B", 19))

    # example 3: utilization, 512 blocks
    ex3 = ex03.example_3()
    yield "ex3_utilization", lambda: views.utilization_figure([ex3.reserving, ex3.paged])
    assert ex3.paged.history is not None and ex3.reserving.history is not None
    yield (
        "ex3_paged_512_blocks",
        lambda: views.block_pool_figure(ex3.paged.history[-1].state, title="8 requests on 16-token blocks"),
    )
    yield "ex3_reserving", lambda: views.contiguous_figure(ex3.reserving.history[-1].state)

    # example 4: fork and copy-on-write
    ex4 = ex04.example_4()
    states4 = ex4.history
    yield "ex4_after_fork", lambda: views.block_pool_figure(states4[3].state, title="After the fork")
    yield "ex4_after_cow", lambda: views.block_pool_figure(states4[-1].state, title="After copy-on-write")
    yield from animation_frames("ex4_anim", animations.block_pool_animation(states4), [0, 4, -1])
    yield (
        "ex4_free_list_cow",
        lambda: views.free_queue_figure(states4[4].state, states4[3].state, title=caption(states4[4])),
    )

    # example 5: a shared system prompt
    ex5 = ex05.example_5()
    yield (
        "ex5_shared_prefix",
        lambda: views.block_pool_figure(ex5.history[-1].state, highlight=("request 2", 64)),
    )

    # example 6: chained hashes
    base = [11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42]
    late, early = list(base), list(base)
    late[9], early[1] = 99, 99
    rows = {"base": base, "late edit": late, "early edit": early}
    chains = {name: hashing.hash_chain(tokens, 4) for name, tokens in rows.items()}
    chains["cache salt"] = hashing.hash_chain(base, 4, salt="tenant-b")
    yield "ex6_hash_chain", lambda: views.hash_chain_figure(chains)
    digests = {
        "lesson": hashing.block_hashes(base, 4),
        "vllm scheme": hashing.block_hashes(base, 4, scheme="vllm"),
    }
    yield "ex6_digests", lambda: views.hash_chain_figure(digests, title="Same tokens, two hash schemes")

    # example 7: the free queue and LRU eviction
    ex7 = ex07.example_7()
    h7 = ex7.history
    for i in range(1, len(h7)):
        yield (
            f"ex7_free_queue_{i}",
            lambda i=i: views.free_queue_figure(h7[i].state, h7[i - 1].state, title=caption(h7[i])),
        )
    yield "ex7_pool_after_D", lambda: views.block_pool_figure(h7[6].state, title=caption(h7[6]))
    yield from animation_frames("ex7_queue_anim", animations.free_queue_animation(h7), [0, 5, 6])
    yield from animation_frames("ex7_pool_anim", animations.block_pool_animation(h7), [5, 6])

    # example 8: the radix tree
    ex8 = ex08.example_8()
    for step in ex8.history:
        yield (
            f"ex8_radix_{step.index}",
            lambda step=step: views.radix_tree_figure(step.state, title=caption(step)),
        )
    yield from animation_frames("ex8_anim", animations.radix_animation(ex8.history), [2, 4, -1])

    # examples 9, 10, 13 and lesson 002: bars and lines
    from kvlab.lessons.ex09 import example_9
    from kvlab.lessons.ex10 import example_10
    from kvlab.lessons.ex13 import example_13
    from kvlab.lessons.fleet import lesson_table

    ex9 = example_9()
    yield (
        "ex9_hit_rates",
        lambda: views.hit_rate_figure(ex9, title="Prompt layout and hit rate (example 9)"),
    )
    yield (
        "ex9_computed_per_turn",
        lambda: views.per_turn_figure(
            {name: [t.computed_tokens for t in run.turns] for name, run in ex9.items()},
            y_title="tokens computed",
            title="Tokens computed per turn (example 9)",
        ),
    )
    ex10 = example_10()
    yield (
        "ex10_cache_n",
        lambda: views.cache_n_figure(
            {"append-only": ex10.kvlab_append_only, "clock in system prompt": ex10.kvlab_clock}
        ),
    )
    yield (
        "ex10_cache_n_lesson",
        lambda: views.cache_n_figure(
            {"append-only": ex10.lesson_append_only, "clock in system prompt": ex10.lesson_clock},
            title="llama-server's counters as the lesson recorded them",
        ),
    )
    ex13 = example_13()
    yield "ex13_tokens_per_turn", lambda: views.tokens_per_turn_figure(ex13)
    yield "ex13_cumulative", lambda: views.tokens_per_turn_figure(ex13, cumulative=True)
    table = lesson_table()
    yield "fleet_hit_rates", lambda: views.hit_rate_figure(table, title="200 chat users (lesson 002)")
    yield (
        "fleet_hit_rate_by_turn",
        lambda: views.per_turn_figure(
            {r.scenario: [100 * v for v in r.trace.hit_rate_by_turn()] for r in table[1:4]},
            y_title="hit rate (%)",
            title="Hit rate by the user's turn number (lesson 002)",
        ),
    )

    # edge cases: the same builders on unusual pools
    for name, state in edge_pools():
        yield f"edge_pool_{name}", lambda state=state, name=name: views.block_pool_figure(state, title=name)
        yield (
            f"edge_queue_{name}",
            lambda state=state, name=name: views.free_queue_figure(state, title=name),
        )
    yield (
        "edge_radix_empty",
        lambda: views.radix_tree_figure(radix.RadixTree().snapshot(), title="empty tree"),
    )
    wide = radix.RadixTree()
    for k in range(24):
        wide.insert([1, 2, 3, 100 + k, 200 + k])
    yield "edge_radix_24_leaves", lambda: views.radix_tree_figure(wide.snapshot(), title="24 leaves")

    # the widgets' figures as they look after some steps
    stepper = Stepper(h7)
    stepper.slider.value = 6
    yield "widget_stepper_pool", lambda: go.Figure(stepper.figures[0].widget.to_dict())
    yield "widget_stepper_queue", lambda: go.Figure(stepper.figures[1].widget.to_dict())
    pg = Playground("block-pool", num_blocks=12, block_size=4)
    pg.allocate("A", 10, 8)
    pg.fork("A", "B")
    pg.append("B", 1)
    pg.allocate("C", 9, 8)
    yield "widget_playground_pool", lambda: go.Figure(pg.pool_figure.widget.to_dict())
    yield "widget_playground_queue", lambda: go.Figure(pg.queue_figure.widget.to_dict())


def edge_pools() -> Iterator[tuple[str, BlockPoolState]]:
    yield "no blocks", BlockPoolState(block_size=16, blocks=())
    yield "empty 8 blocks", PrefixCache(8, 16).snapshot()
    one = PrefixCache(1, 16)
    one.allocate("A", list(range(10)))
    yield "one block", one.snapshot()
    full = PrefixCache(12, 4, record=True)
    for k in range(4):
        full.allocate(f"r{k}", list(range(100 * k, 100 * k + 12)))
    yield "full pool", full.snapshot()
    tiny = PrefixCache(10, 1)
    tiny.allocate("A", [1, 2, 3, 4])
    tiny.allocate("B", [1, 2, 3, 9, 9])
    tiny.free("A")
    yield "1-token blocks", tiny.snapshot()
    big = PrefixCache(512, 16)
    for k in range(12):
        big.allocate(f"r{k}", list(range(1000, 1100)) + list(range(10_000 * (k + 1), 10_000 * (k + 1) + 300)))
    for k in range(0, 12, 3):
        big.free(f"r{k}")
    yield "512 blocks", big.snapshot()
    yield (
        "null block",
        BlockPoolState(
            block_size=4,
            blocks=(BlockState(0, is_null=True),) + tuple(BlockState(i) for i in range(1, 6)),
            free_queue=(1, 2, 3, 4, 5),
            null_block=0,
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="renders", help="folder for the PNGs (default: renders/)")
    parser.add_argument("--only", nargs="*", default=None, help="render only names starting with these")
    parser.add_argument("--scale", type=float, default=1.0, help="pixel scale (default 1)")
    parser.add_argument(
        "--width",
        type=int,
        nargs="+",
        default=[WIDTH],
        help=f"figure width(s) in px (default {WIDTH}); several go to one folder each",
    )
    args = parser.parse_args(argv)
    if not os.environ.get("BROWSER_PATH"):
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium:
            os.environ["BROWSER_PATH"] = chromium  # kaleido looks here before it tries to find Chrome
    jobs = [(name, make) for name, make in renders() if not args.only or name.startswith(tuple(args.only))]
    figs, names = [], []
    start = time.perf_counter()
    for name, make in jobs:
        figs.append(make())
        names.append(f"{name.replace(' ', '_')}.png")
    heights = [fig.layout.height or 500 for fig in figs]  # kaleido ignores layout.height otherwise
    paths = []
    for width in args.width:
        out = Path(args.out) / f"w{width}" if len(args.width) > 1 else Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        these = [out / name for name in names]
        try:
            import kaleido  # noqa: F401  (kaleido >= 1 renders many figures with one browser)
            import plotly.io as pio

            pio.write_images(figs, these, width=width, height=heights, scale=args.scale)
        except Exception as exc:  # noqa: BLE001 - say what is missing, in one line
            print(f"render_figures: cannot write PNGs ({type(exc).__name__}: {exc}); "
                  "install kaleido and Chromium (apt-get install chromium)", file=sys.stderr)  # fmt: skip
            return 1
        paths += these
    for path in paths:
        print(path)
    print(f"{len(paths)} images in {time.perf_counter() - start:.1f} s -> {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
