"""Fuzz kvlab's radix replay against SGLang's real ``RadixCache``, record by record.

    python tools/conformance/fuzz_sglang.py --fetch                  # once: pip download + unpack SGLang
    python tools/conformance/fuzz_sglang.py --seeds 0:200 --ops 300  # 60k ops

Each seed makes one random scenario (page size 1 or more, prompts sharing
prefixes, namespaces, matches that end inside runs, locks and unlocks -- some
on a handle whose node is locked only through another handle's path -- and
evictions of any size) and runs it through ``kvlab.cli.replay.replay("radix", ...)``
and through ``sglang_harness`` (the real ``RadixCache``). Every field of every
record must agree. On a difference the scenario is shrunk, written as JSON
(``--out``), and both records are printed.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_harness  # noqa: E402
from fuzzing import fuzz, seed_range  # noqa: E402

from kvlab.cli.replay import replay as kvlab_replay  # noqa: E402

PAGE_SIZES = (1, 1, 1, 2, 3, 4)
EXTRA_KEYS = (None, None, None, None, "lora-a", "lora-b")


def generate(seed: int, num_ops: int) -> dict[str, Any]:
    """A random scenario; the real cache runs alongside so locks and unlocks name live, locked nodes."""
    rng = random.Random(seed)
    page = rng.choice(PAGE_SIZES)
    config = {"page_size": page}
    real = sglang_harness.RealRadixReplay(config)
    vocab = rng.choice((2, 3, 6, 40))
    docs = [
        [rng.randrange(vocab) for _ in range(rng.randrange(1, 12) * page + rng.randrange(page))]
        for _ in range(rng.randrange(1, 5))
    ]
    use_keys = rng.random() < 0.4
    names: list[str] = []
    ops: list[dict[str, Any]] = []

    def tokens() -> list[int]:
        doc = rng.choice(docs)
        toks = doc[: rng.randrange(len(doc) + 1)]
        if rng.random() < 0.3:
            toks = doc[: rng.randrange(len(doc) // page + 1) * page]  # ends on a page boundary
        toks = toks + [
            rng.randrange(vocab) for _ in range(rng.choice((0, 0, 1, page, rng.randrange(2 * page + 3))))
        ]
        return toks or [rng.randrange(vocab)]

    def with_key(op: dict[str, Any]) -> dict[str, Any]:
        key = rng.choice(EXTRA_KEYS) if use_keys else None
        if key is not None:
            op["extra_key"] = key
        return op

    for _ in range(num_ops):
        r = rng.random()
        alive = [h for h in names if real.alive(h)]
        locked = [h for h in alive if real.handles[h].lock_ref > 0]
        if r < 0.3:
            op = with_key({"op": "insert", "tokens": tokens()})
        elif r < 0.55:
            op = with_key({"op": "match", "tokens": tokens()})
            if rng.random() < 0.85:
                name = rng.choice(names) if names and rng.random() < 0.2 else f"h{len(names)}"
                op["as"] = name
                if name not in names:
                    names.append(name)
        elif r < 0.72 and alive:
            op = {"op": "lock", "node": rng.choice(alive)}
        elif r < 0.87 and locked:
            op = {"op": "unlock", "node": rng.choice(locked)}
        else:
            n = rng.choice((0, 1, 1, 2, page, rng.randrange(1, 12), rng.randrange(1, 60)))
            op = {"op": "evict", "num_tokens": n}
        real.apply(op)
        ops.append(op)
    return {"config": config, "ops": ops}


REAL_CLOCK = False  # --real-clock: SGLang stamps with time.monotonic() itself (see sglang_harness)


def first_difference(scenario: dict[str, Any]) -> tuple[int, dict, dict] | None:
    """(op index, kvlab's record, SGLang's record) of the first record that differs, or None."""
    ours = kvlab_replay("radix", scenario["config"], scenario["ops"])
    theirs = sglang_harness.replay(scenario["config"], scenario["ops"], real_clock=REAL_CLOCK)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            return i, a, b
    return None


def run(seeds: range, num_ops: int, out: Path | None = None, verbose: bool = False) -> int:
    """Fuzz ``seeds``; return the number of ops compared. Raises AssertionError on the first difference."""
    return fuzz(
        seeds,
        num_ops,
        generate=generate,
        first_difference=first_difference,
        engine=f"SGLang {sglang_harness.VERSION}",
        out=out,
        verbose=verbose,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fetch", action="store_true", help="pip download and unpack SGLang first (if missing)"
    )
    parser.add_argument("--seeds", default="0:100", help="seed range A:B (default 0:100)")
    parser.add_argument("--ops", type=int, default=300, help="ops per scenario (default 300)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("sglang_difference.json"),
        help="where to write a shrunk differing scenario",
    )
    parser.add_argument(
        "--real-clock",
        action="store_true",
        help="let SGLang read time.monotonic() (orders may tie on a coarse clock)",
    )
    args = parser.parse_args(argv)
    global REAL_CLOCK
    REAL_CLOCK = args.real_clock
    if args.fetch:
        sglang_harness.fetch()
    seeds = seed_range(args.seeds)
    try:
        total = run(seeds, args.ops, args.out, verbose=True)
    except AssertionError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"ok: {total} ops over {len(seeds)} scenarios agree with SGLang {sglang_harness.VERSION}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
