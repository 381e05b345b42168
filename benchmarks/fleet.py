"""Lesson 002's six-row table: kvlab.fleet against the straightforward way, side by side.

The straightforward way is the lesson's program as written: each scenario draws
its own traffic, and every turn hashes the whole prompt, then the whole prompt
plus answer, with SHA-256 over the parent digest and ``repr`` of the block.
kvlab.fleet draws the traffic once, keys each user's blocks once (the chain is
kept between turns) and interns keys instead of hashing them. Both must print
the same numbers; the script checks that, then times both in interleaved runs
(``kvlab.core.timing``) and prints medians, IQRs and the ratio.

    python benchmarks/fleet.py [--repeat N]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvlab.core.timing import measure_side_by_side  # noqa: E402
from kvlab.fleet import FleetConfig  # noqa: E402
from kvlab.lessons.fleet import LESSON_SCENARIOS, lesson_table  # noqa: E402


def straightforward_row(config: FleetConfig) -> tuple[int, int]:
    """(prefill tokens, total tokens) of one scenario, computed the plain way."""
    size = config.block_size
    rng = random.Random(config.seed)
    system = [rng.randrange(50_000) for _ in range(config.system_tokens)]
    order = [user for user in range(config.users) for _ in range(config.turns)]
    rng.shuffle(order)
    history: dict[int, list[int]] = {user: [] for user in range(config.users)}
    cached: OrderedDict[bytes, None] = OrderedDict()

    def chain(tokens: list[int], salt: str) -> list[bytes]:
        digests, parent = [], hashlib.sha256(salt.encode()).digest()
        for start in range(0, len(tokens) - len(tokens) % size, size):
            parent = hashlib.sha256(parent + repr(tokens[start : start + size]).encode()).digest()
            digests.append(parent)
        return digests

    prefill = total = 0
    for clock, user in enumerate(order):
        stamp = [clock % 997, clock // 997] if config.header == "start" else []
        message = [rng.randrange(50_000) for _ in range(rng.randint(20, 200))]
        prompt = stamp + system + history[user] + message
        answer = [rng.randrange(50_000) for _ in range(rng.randint(50, 400))]
        history[user] += message + answer
        salt = f"user-{user}" if config.salt == "user" else ""
        hit = 0
        for digest in chain(prompt, salt)[: (len(prompt) - 1) // size]:
            if digest not in cached:
                break
            cached.move_to_end(digest)
            hit += 1
        for digest in chain(prompt + answer, salt)[hit:]:
            cached[digest] = None
            if len(cached) > config.capacity_blocks:
                cached.popitem(last=False)
        total += len(prompt)
        prefill += len(prompt) - hit * size
    return prefill, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each, interleaved (default 3)")
    args = parser.parse_args()
    # one untimed run of each checks the results and warms both up
    plain = [straightforward_row(config) for _, config in LESSON_SCENARIOS]
    fast = [(r.prefill_tokens, r.total_tokens) for r in lesson_table()]
    if fast != plain:
        raise SystemExit(f"results differ:\n  straightforward {plain}\n  kvlab.fleet     {fast}")
    timings = measure_side_by_side(
        {
            "straightforward": lambda: [straightforward_row(config) for _, config in LESSON_SCENARIOS],
            "kvlab.fleet": lesson_table,
        },
        warmup=0,
        repeats=max(1, args.repeat),
    )
    slow, quick = timings["straightforward"], timings["kvlab.fleet"]
    print("lesson 002 six-row table (all six rows identical in both)")
    print(f"  straightforward (per-scenario traffic, re-hash every turn): {slow}")
    print(f"  kvlab.fleet     (shared traffic, keys once per user chain): {quick}")
    low, high = slow.ratio_spread(quick)
    print(f"  ratio of medians: {slow.ratio_to(quick):.1f}x faster (across the IQRs {low:.1f}x to {high:.1f}x; "
          f"CPU {slow.cpu_median_ms / quick.cpu_median_ms:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
