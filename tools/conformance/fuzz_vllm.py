"""Fuzz kvlab's prefix-cache replay against vLLM's real KV-cache manager, record by record.

    python tools/conformance/fuzz_vllm.py --fetch                  # once: pip download + unpack vLLM
    python tools/conformance/fuzz_vllm.py --seeds 0:200 --ops 300  # 60k ops

Each seed makes one random scenario (pool size, block size, prompts that share
prefixes, salts, appends, frees, probes, allocations the pool must refuse) and
runs it through ``kvlab.cli.replay.replay("prefix-cache", ...)`` with
``null_block: true, hash: "vllm"`` and through ``vllm_harness`` (the real
``KVCacheManager``). Every field of every record must agree. On a difference
the scenario is shrunk to a short one that still differs, written as JSON
(``--out``), and both records are printed.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_harness  # noqa: E402
from fuzzing import fuzz, seed_range  # noqa: E402

from kvlab.cli.replay import replay as kvlab_replay  # noqa: E402

BLOCK_SIZES = (1, 2, 3, 4, 5, 8, 16)
SALTS = (None, None, None, None, "t1", "t2")


def generate(seed: int, num_ops: int) -> dict[str, Any]:
    """A random scenario; the real manager runs alongside so appends and frees name live requests."""
    rng = random.Random(seed)
    bs = rng.choice(BLOCK_SIZES)
    num_blocks = rng.randrange(2, 48)
    config = {"block_size": bs, "num_blocks": num_blocks, "null_block": True, "hash": "vllm"}
    real = vllm_harness.RealPrefixCacheReplay(config)
    vocab = rng.choice((2, 3, 5, 50))  # tiny vocabularies make equal blocks (and hash reuse) common
    docs = [
        [rng.randrange(vocab) for _ in range(rng.randrange(1, 8) * bs + rng.randrange(bs))]
        for _ in range(rng.randrange(1, 5))
    ]
    sent: list[tuple[list[int], str | None]] = []  # prompts sent so far, to send again
    live: list[str] = []
    freed: list[str] = []
    next_id = 0
    ops: list[dict[str, Any]] = []

    def prompt() -> tuple[list[int], str | None]:
        r = rng.random()
        if sent and r < 0.2:
            return rng.choice(sent)  # the same prompt again: a hit, and duplicate blocks
        doc = rng.choice(docs)
        if r < 0.45:
            cut = rng.randrange(0, len(doc) // bs + 1) * bs  # ends on a block boundary
            toks = doc[:cut]
        else:
            toks = doc[: rng.randrange(len(doc) + 1)]
        toks = toks + [
            rng.randrange(vocab) for _ in range(rng.choice((0, 0, 1, bs, rng.randrange(3 * bs + 2))))
        ]
        if rng.random() < 0.05:
            toks = toks + [rng.randrange(vocab) for _ in range(num_blocks * bs)]  # too big: refused
        return (toks or [rng.randrange(vocab)]), rng.choice(SALTS)

    for _ in range(num_ops):
        r = rng.random()
        if live and r < 0.22:
            req = live.pop(rng.randrange(len(live)))
            op: dict[str, Any] = {"op": "free", "req": req}
            freed.append(req)
        elif live and r < 0.5:
            req = rng.choice(live)
            n = len(real.requests[req].all_token_ids)
            k = rng.choice((1, 1, 1, bs - n % bs, bs, rng.randrange(1, 3 * bs + 2)))
            op = {"op": "append", "req": req, "tokens": [rng.randrange(vocab) for _ in range(k)]}
        elif r < 0.62:
            toks, salt = prompt()
            op = {"op": "probe", "tokens": toks}
            if salt is not None:
                op["cache_salt"] = salt
        else:
            toks, salt = prompt()
            if freed and rng.random() < 0.1:
                req = freed.pop(rng.randrange(len(freed)))  # an id used again after its free
            else:
                req = f"r{next_id}"
                next_id += 1
            op = {"op": "alloc", "req": req, "tokens": toks}
            if salt is not None:
                op["cache_salt"] = salt
            sent.append((toks, salt))
        record = real.apply(op)
        if op["op"] == "alloc" and record["ok"]:
            live.append(op["req"])
        ops.append(op)
    return {"config": config, "ops": ops}


def first_difference(scenario: dict[str, Any]) -> tuple[int, dict, dict] | None:
    """(op index, kvlab's record, vLLM's record) of the first record that differs, or None."""
    ours = kvlab_replay("prefix-cache", scenario["config"], scenario["ops"])
    theirs = vllm_harness.replay(scenario["config"], scenario["ops"])
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
        engine=f"vLLM {vllm_harness.VERSION}",
        out=out,
        verbose=verbose,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fetch", action="store_true", help="pip download and unpack vLLM first (if missing)"
    )
    parser.add_argument("--seeds", default="0:100", help="seed range A:B (default 0:100)")
    parser.add_argument("--ops", type=int, default=300, help="ops per scenario (default 300)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("vllm_difference.json"),
        help="where to write a shrunk differing scenario",
    )
    args = parser.parse_args(argv)
    if args.fetch:
        vllm_harness.fetch()
    seeds = seed_range(args.seeds)
    try:
        total = run(seeds, args.ops, args.out, verbose=True)
    except AssertionError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"ok: {total} ops over {len(seeds)} scenarios agree with vLLM {vllm_harness.VERSION}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
