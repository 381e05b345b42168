"""Prefix-cache throughput on a random trace, and why the free queue must be a linked list.

Runs one seeded trace of alloc / append / free operations (chat requests behind
a few shared system prompts, in a pool small enough that cached blocks are
evicted) through ``kvlab.models.prefix_cache.PrefixCache`` twice: once with its
doubly linked free queue, once with a free queue kept in a Python list, where
taking a hit block out of the middle, or putting freed blocks at the front,
moves or scans the whole list. Both must give the same results; the script
checks that, then prints ops/s, hit blocks/s and the ratio. Times are CPU
seconds of this process, so other work on a shared machine does not skew them.

Then the replay CLI on the same kind of trace written as a scenario:
``python -m kvlab replay prefix-cache --changes`` on all the ops (one line per
op: output and time grow with the ops), beside the default full records on
``--replay-ops`` of them (each record repeats the whole free queue: ops x
blocks). CPU seconds (user + system) and peak memory of the child process.

    python benchmarks/prefix_cache.py [--ops 100000] [--blocks 16384] [--seed 0] [--replay-ops 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kvlab.errors import OutOfBlocksError
from kvlab.models.free_queue import Block, FreeBlockQueue
from kvlab.models.prefix_cache import PrefixCache


class ListFreeQueue(FreeBlockQueue):
    """The naive free queue: a list, so ``remove`` scans and ``prepend_n`` shifts every element."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        self._items: list[Block] = list(blocks)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Block]:
        return iter(list(self._items))

    def __contains__(self, block: Block) -> bool:
        return block in self._items

    def popleft_n(self, n: int) -> list[Block]:
        out = self._items[:n]
        del self._items[:n]
        return out

    def remove(self, block: Block) -> None:
        self._items.remove(block)

    def append_n(self, blocks: Sequence[Block]) -> None:
        self._items.extend(blocks)

    def prepend_n(self, blocks: Sequence[Block]) -> None:
        self._items[:0] = blocks


class NaivePrefixCache(PrefixCache):
    free_queue_class = ListFreeQueue


@dataclass
class Tally:
    ops: int = 0
    hit_blocks: int = 0
    hit_tokens: int = 0
    evicted: int = 0
    refused: int = 0
    seconds: float = 0.0
    digest: str = ""


def run_trace(cache: PrefixCache, num_ops: int, seed: int) -> Tally:
    """Drive ``cache`` with a seeded trace; the trace depends only on the seed and on the cache's answers."""
    rng = random.Random(seed)
    bs = cache.block_size
    noise = [rng.randrange(32000) for _ in range(1 << 16)]  # token ids to slice from: cheap to draw

    def fresh(n: int) -> list[int]:
        at = rng.randrange(len(noise) - n)
        return noise[at : at + n]

    systems = [fresh(rng.randrange(4, 33) * bs) for _ in range(24)]
    live: list[str] = []
    tally = Tally()
    trail = hashlib.sha256()
    next_id = 0
    start = time.process_time()
    for _ in range(num_ops):
        roll = rng.random()
        if live and (roll < 0.25 or len(live) > 64):
            rid = live.pop(rng.randrange(len(live)))
            cache.free(rid)
            trail.update(rid.encode())
        elif live and roll < 0.65:
            rid = rng.choice(live)
            try:
                result = cache.append(rid, fresh(rng.randrange(1, 2 * bs)))
            except OutOfBlocksError:
                tally.refused += 1
                continue
            tally.evicted += len(result.evicted)
            trail.update(bytes(str(result.new_block_ids), "ascii"))
        else:
            system = systems[min(int(rng.expovariate(0.3)), len(systems) - 1)]  # a few prompts are popular
            prompt = system + fresh(rng.randrange(1, 8 * bs))
            rid = f"r{next_id}"
            next_id += 1
            try:
                result = cache.allocate(rid, prompt)
            except OutOfBlocksError:
                tally.refused += 1
                continue
            live.append(rid)
            tally.hit_blocks += len(result.hit_block_ids)
            tally.hit_tokens += result.num_cached_tokens
            tally.evicted += len(result.evicted)
            trail.update(bytes(str(result.block_table), "ascii"))
        tally.ops += 1
    tally.seconds = time.process_time() - start
    trail.update(bytes(str(cache.free_queue()), "ascii"))
    tally.digest = trail.hexdigest()[:16]
    return tally


def make_scenario(num_ops: int, num_blocks: int, block_size: int, seed: int = 0) -> dict:
    """The same kind of trace as a replay scenario: a shadow cache decides which ops are valid."""
    rng = random.Random(seed)
    cache = PrefixCache(num_blocks, block_size, null_block=True, hash_scheme="vllm")
    noise = [rng.randrange(32000) for _ in range(1 << 16)]

    def fresh(n: int) -> list[int]:
        at = rng.randrange(len(noise) - n)
        return noise[at : at + n]

    systems = [fresh(rng.randrange(4, 33) * block_size) for _ in range(24)]
    live: list[str] = []
    ops: list[dict] = []
    for i in range(num_ops):
        roll = rng.random()
        if live and (roll < 0.25 or len(live) > 64):
            rid = live.pop(rng.randrange(len(live)))
            cache.free(rid)
            ops.append({"op": "free", "req": rid})
        elif live and roll < 0.6:
            rid = rng.choice(live)
            tokens = fresh(rng.randrange(1, 2 * block_size))
            ops.append({"op": "append", "req": rid, "tokens": tokens})
            with contextlib.suppress(OutOfBlocksError):
                cache.append(rid, tokens)
        elif roll < 0.65:
            ops.append({"op": "probe", "tokens": rng.choice(systems) + fresh(3)})
        else:
            system = systems[min(int(rng.expovariate(0.3)), len(systems) - 1)]
            rid, prompt = f"r{i}", system + fresh(rng.randrange(1, 8 * block_size))
            ops.append({"op": "alloc", "req": rid, "tokens": prompt})
            try:
                cache.allocate(rid, prompt)
            except OutOfBlocksError:
                continue
            live.append(rid)
    config = {"block_size": block_size, "num_blocks": num_blocks, "null_block": True, "hash": "vllm"}
    return {"config": config, "ops": ops}


_CHILD = (
    "import resource, sys\nfrom kvlab.__main__ import main\ncode = main(sys.argv[1:])\n"
    "u = resource.getrusage(resource.RUSAGE_SELF)\n"
    "print(u.ru_utime + u.ru_stime, u.ru_maxrss, file=sys.stderr)\nsys.exit(code)\n"
)


def time_replay(model: str, scenario: dict, *options: str) -> tuple[float, float, int]:
    """Replay ``scenario`` with the CLI in a child process: (its CPU seconds, its peak RSS in MiB, output bytes)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        json.dump(scenario, fh)
        fh.flush()
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, "replay", model, fh.name, *options],
            capture_output=True,
            check=True,
        )
    cpu, rss_kib = done.stderr.split()[-2:]
    return float(cpu), int(rss_kib) / 1024, len(done.stdout)


def report_replay(model: str, big: dict, small: dict) -> None:
    """The CLI's --changes mode on ``big`` beside its default full records on ``small``."""
    for label, scenario, options in (("--changes", big, ("--changes",)), ("default (full)", small, ())):
        n = len(scenario["ops"])
        cpu, rss, size = time_replay(model, scenario, *options)
        print(
            f"  replay {label:<15} {n / cpu:>10,.0f} ops/s   ({n:,} ops in {cpu:.2f} CPU s, "
            f"{size / 2**20:,.1f} MiB of output, peak RSS {rss:,.0f} MiB)"
        )


def report(name: str, t: Tally) -> None:
    print(
        f"{name:<22} {t.ops / t.seconds:>10,.0f} ops/s {t.hit_blocks / t.seconds:>12,.0f} hit blocks/s"
        f"   ({t.ops:,} ops in {t.seconds:.2f} CPU s; {t.hit_blocks:,} hit blocks = {t.hit_tokens:,} tokens;"
        f" {t.evicted:,} evictions; {t.refused:,} refused)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="operations in the trace (default 100000)")
    parser.add_argument("--blocks", type=int, default=16_384, help="blocks in the pool (default 16384)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--replay-ops", type=int, default=2000, help="ops for the CLI's default (full) mode (default 2000)"
    )
    args = parser.parse_args()

    fast = run_trace(PrefixCache(args.blocks, args.block_size, null_block=True), args.ops, args.seed)
    naive = run_trace(NaivePrefixCache(args.blocks, args.block_size, null_block=True), args.ops, args.seed)
    if (fast.digest, fast.hit_blocks, fast.evicted) != (naive.digest, naive.hit_blocks, naive.evicted):
        raise SystemExit("the two free queues disagree: a bug, not a benchmark result")
    print(f"prefix cache, {args.blocks:,} blocks of {args.block_size} tokens, seed {args.seed}")
    report("linked-list free queue", fast)
    report("list free queue", naive)
    print(
        f"linked list / list: {naive.seconds / fast.seconds:.1f}x faster (same results, trace {fast.digest})"
    )
    big = make_scenario(args.ops, args.blocks, args.block_size, args.seed)
    small = {"config": big["config"], "ops": big["ops"][: args.replay_ops]}
    print(f"python -m kvlab replay prefix-cache, the trace as a scenario ({args.blocks:,} blocks):")
    report_replay("prefix-cache", big, small)


if __name__ == "__main__":
    main()
