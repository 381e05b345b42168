"""How long one stepper step takes on a 256-block pool, against redrawing the figures from scratch.

A step is what happens when a student moves the slider by one: build the view
specs of the new snapshot (block pool with its tables, and the free queue),
compare them with what is on screen, and send the differences to the two
``FigureWidget``s. The goal is a median of at most 30 ms. The baselines are
building the two figures from scratch (``go.Figure``) and pushing the whole
new figure into the existing widgets with plotly's ``update``.

The history is a seeded random prefix-cache workload: 256 blocks of 16 tokens,
requests sharing parts of a 200-token system prompt, appends and frees, with
evictions once the pool fills. Each step is timed on its first visit (the
stepper caches specs, so a revisit is cheaper) with ``kvlab.core.timing``; the
median and interquartile range of wall-clock time are printed with the
process's CPU time, since a busy machine inflates the former.

    python benchmarks/stepper.py [--steps 120] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
from pathlib import Path

import plotly.graph_objects as go

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvlab.core.snapshots import History  # noqa: E402
from kvlab.core.timing import Timing, measure_once  # noqa: E402
from kvlab.errors import OutOfBlocksError  # noqa: E402
from kvlab.models.prefix_cache import PrefixCache  # noqa: E402
from kvlab.views import registry  # noqa: E402
from kvlab.views.block_pool import block_pool_spec  # noqa: E402
from kvlab.views.free_queue import free_queue_spec  # noqa: E402
from kvlab.views.live import Stepper  # noqa: E402

GOAL_MS = 30.0


def workload(num_ops: int, seed: int, num_blocks: int = 256, block_size: int = 16) -> History:
    """A recorded prefix-cache history with hits, appends, frees and evictions."""
    rng = random.Random(seed)
    cache = PrefixCache(num_blocks, block_size, record=True)
    system = list(range(1000, 1200))
    live: list[str] = []
    next_token = 100_000
    for k in range(num_ops):
        roll = rng.random()
        if live and (roll < 0.25 or cache.num_free_blocks < num_blocks // 6):
            cache.free(live.pop(rng.randrange(len(live))))
            continue
        if live and roll < 0.5:
            n = rng.randint(1, 40)
            with contextlib.suppress(OutOfBlocksError):  # a full pool refuses; that is fine here
                cache.append(rng.choice(live), list(range(next_token, next_token + n)))
            next_token += n
            continue
        n, shared = rng.randint(20, 300), rng.randint(0, len(system))
        tokens = system[:shared] + list(range(next_token, next_token + n))
        next_token += n
        try:
            cache.allocate(f"r{k}", tokens)
            live.append(f"r{k}")
        except OutOfBlocksError:
            pass
    assert cache.history is not None
    return cache.history


def timed(fn) -> tuple[float, float]:
    """One call's wall and CPU ms: a step's first visit cannot be repeated (the stepper caches specs)."""
    _, timing = measure_once(fn)
    return timing.median_ms, timing.cpu_median_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="operations in the workload (default 120)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    history = workload(args.steps, args.seed)
    states = history.states
    print(f"history: {len(history)} snapshots of a {states[0].num_blocks}-block pool "
          f"(block size {states[0].block_size}); load average {os.getloadavg()[0]:.1f}")  # fmt: skip

    stepper = Stepper(history)  # block pool + free queue, as a prefix-cache stepper shows
    step_wall, step_cpu, sent = [], [], []
    for i in range(1, len(history)):
        w, c = timed(lambda i=i: setattr(stepper.slider, "value", i))
        step_wall.append(w)
        step_cpu.append(c)
        sent.append(sum(f.updates for f in stepper.figures))

    hints = registry.get("block_pool").hints(states)

    def specs(i: int) -> tuple[dict, dict]:
        prev = states[i - 1] if i else None
        return block_pool_spec(states[i], prev, caption="step", **hints), free_queue_spec(states[i], prev)

    sample = range(1, len(history), max(1, len(history) // 30))
    rebuild_wall, rebuild_cpu = [], []
    for i in sample:
        w, c = timed(lambda i=i: [go.Figure(s) for s in specs(i)])
        rebuild_wall.append(w)
        rebuild_cpu.append(c)

    widgets = [go.FigureWidget(s) for s in specs(0)]
    push_wall, push_cpu = [], []
    for i in sample:

        def push(i: int = i) -> None:
            for fw, spec in zip(widgets, specs(i), strict=True):
                with fw.batch_update():
                    fw.update(spec, overwrite=True)

        w, c = timed(push)
        push_wall.append(w)
        push_cpu.append(c)

    ours = Timing(tuple(step_wall), tuple(step_cpu))
    rows = [
        ("stepper step (diff, in place)", ours),
        ("plotly update with the whole figure", Timing(tuple(push_wall), tuple(push_cpu))),
        ("rebuild both figures (go.Figure)", Timing(tuple(rebuild_wall), tuple(rebuild_cpu))),
    ]
    ours_w, ours_c = ours.median_ms, ours.cpu_median_ms
    print(f"{'':<40}{'median wall ms':>15}{'IQR':>14}{'median cpu ms':>15}{'x step (wall)':>15}")
    for name, t in rows:
        iqr = f"{t.q1_ms:.1f}-{t.q3_ms:.1f}"
        print(f"{name:<40}{t.median_ms:>15.1f}{iqr:>14}{t.cpu_median_ms:>15.1f}{t.ratio_to(ours):>15.1f}")
    print(f"properties sent per step: median {statistics.median(sent):.0f}; 90th percentile step "
          f"{statistics.quantiles(step_wall, n=10)[-1]:.1f} ms wall")  # fmt: skip
    verdict = "meets" if ours_w <= GOAL_MS else ("meets on CPU time" if ours_c <= GOAL_MS else "misses")
    print(f"goal <= {GOAL_MS:.0f} ms median: {verdict}")


if __name__ == "__main__":
    main()
