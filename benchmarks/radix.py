"""Radix tree throughput on a 100k-op chat-like trace: ``python benchmarks/radix.py [--ops N]``.

The trace: users share a few system prompts and grow their own conversations
turn by turn. Each request is what SGLang's scheduler does with one: ``match``
the prompt and ``lock`` the node it ended at; when it finishes (16 run at
once), ``insert`` the prompt plus the reply and ``unlock`` the old node; when
the tree holds more than its capacity, ``evict`` the excess.

First, side by side with SGLang 0.5.23's real ``RadixCache`` when its sources
are unpacked (``python tools/conformance/sglang_harness.py --fetch``; skipped
otherwise): the same calls on both (``kvlab_calls``, ``sglang_calls``), checked to
return the same matched lengths, prefix lengths, evicted tokens and final sizes;
CPU time of interleaved rounds, medians with the IQR, and the ratio.

It prints ops/s for the whole trace, then, on its first 20k ops, side by side:

* ``kvlab``: ``RadixTree`` as shipped, one heap of evictable leaves kept across
  calls (stale entries skipped), O(log n) per evicted leaf;
* ``rescan``: the same tree with an eviction that collects every unlocked leaf
  by walking the whole tree and heapifies them on every call, as SGLang up to
  0.4 did (``_collect_leaves``; newer SGLang keeps a set of evictable leaves but
  still heapifies all of them per call).

Both must evict the same runs in the same order; the script checks it.

Then the replay CLI on the trace written as a scenario: ``python -m kvlab
replay radix --changes`` on all of it (one line per op with what it changed:
output and time grow with the ops) beside the default full records on
``--replay-ops`` of it (each record holds the whole tree: ops x nodes). CPU
seconds (user + system) and peak memory are the child process's
(``benchmarks/prefix_cache.py``'s ``time_replay``).
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kvlab.core.timing import measure_side_by_side  # noqa: E402
from kvlab.models.radix import RadixNode, RadixTree  # noqa: E402

CONFORMANCE = Path(__file__).resolve().parent.parent / "tools" / "conformance"


class RescanRadixTree(RadixTree):
    """Eviction by a full walk + heapify per call: the reference order, the slow way."""

    def evict(self, num_tokens: int) -> list[tuple[int, ...]]:
        self._begin_op()
        heap = [
            (n.last_access, n.node_id, n)
            for n in self.nodes()
            if not n.is_root and not n.children and n.lock_ref == 0
        ]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            self.allocator.free(leaf.value)
            freed += len(leaf.value)
            self._delete_leaf(leaf)
            self._evicted_runs.append(leaf.key)
            parent = leaf.parent
            if not parent.children and parent.lock_ref == 0 and not parent.is_root:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return list(self._evicted_runs)


def make_trace(num_ops: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt, prompt + reply) per request: about ``num_ops`` tree calls (4 per request, plus evictions)."""
    rng = random.Random(seed)
    systems = [[rng.randrange(32000) for _ in range(rng.randrange(16, 96))] for _ in range(30)]
    histories: list[list[int]] = []
    requests = []
    while len(requests) * 4 < num_ops:
        if not histories or rng.random() < 0.3:
            histories.append(list(rng.choice(systems)))
        user = rng.randrange(len(histories))
        question = [rng.randrange(32000) for _ in range(rng.randrange(2, 24))]
        reply = [rng.randrange(32000) for _ in range(rng.randrange(2, 32))]
        prompt = histories[user] + question
        histories[user] = prompt + reply
        if len(histories[user]) > 512:  # the conversation ends; the user starts over
            histories[user] = list(rng.choice(systems))
        requests.append((prompt, prompt + reply))
    return requests


def run(tree: RadixTree, requests: list, capacity: int, num_ops: int, in_flight: int = 16) -> tuple:
    """Replay until ``num_ops`` tree calls; up to ``in_flight`` requests hold locks at once.

    Returns (calls, CPU seconds, evicted runs per evict call).
    """
    running: list[tuple[RadixNode, list[int]]] = []
    evictions = []
    ops = 0
    start = time.process_time()
    for prompt, full in requests:
        if ops >= num_ops:
            break
        node = tree.match(prompt).node
        tree.lock(node)
        running.append((node, full))
        ops += 2
        if len(running) > in_flight:  # the oldest running request finishes and is cached
            done, finished = running.pop(0)
            tree.insert(finished)
            tree.unlock(done)
            ops += 2
        excess = tree.total_tokens - capacity
        if excess > 0:  # a server evicts when it needs room for new KV
            evictions.append(tree.evict(excess))
            ops += 1
    return ops, time.process_time() - start, evictions


def kvlab_calls(requests: list, capacity: int, num_ops: int, in_flight: int = 16) -> list[int]:
    """The scheduler's calls on a fresh ``RadixTree``; the trail of what they returned.

    The trail is every match's matched length, every insert's prefix length and
    every evict's freed tokens, then the final evictable and protected sizes.
    """
    tree = RadixTree(page_size=1)
    trail: list[int] = []
    running: list[tuple[RadixNode, list[int]]] = []
    ops = 0
    for prompt, full in requests:
        if ops >= num_ops:
            break
        result = tree.match(prompt)
        trail.append(result.matched_len)
        tree.lock(result.node)
        running.append((result.node, full))
        ops += 2
        if len(running) > in_flight:
            done, finished = running.pop(0)
            trail.append(tree.insert(finished))
            tree.unlock(done)
            ops += 2
        excess = tree.total_tokens - capacity
        if excess > 0:
            trail.append(sum(len(run) for run in tree.evict(excess)))
            ops += 1
    return [*trail, tree.evictable_size, tree.protected_size]


def load_sglang() -> Any:
    """SGLang 0.5.23's real radix-cache modules when their sources are unpacked, else None.

    ``python tools/conformance/sglang_harness.py --fetch`` downloads them; the
    harness loads ``radix_cache.py`` and its helpers unchanged, the rest stubbed.
    """
    sys.path.insert(0, str(CONFORMANCE))
    import sglang_harness

    return sglang_harness.load() if sglang_harness.available() else None


def sglang_calls(sg: Any, requests: list, capacity: int, num_ops: int, in_flight: int = 16) -> list[int]:
    """The same calls on SGLang's real ``RadixCache``, as its scheduler makes them; the same trail.

    Values are views into one preallocated tensor of slot numbers (the server
    passes the request's row of KV indices). Its clock is the conformance
    harness's counter (one tick per ``time.monotonic()`` reading, kvlab's logical
    clock), without which equal readings would make its eviction order
    unreproducible.
    """
    import sglang_harness
    import torch

    sg.radix.time = sglang_harness.CountingClock()
    base, radix = sg.base, sg.radix
    cache = radix.RadixCache(
        sg.params.CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=_NullAllocator(), page_size=1
        )
    )
    slots = torch.arange(max(len(full) for _, full in requests), dtype=torch.int64)
    trail: list[int] = []
    running: list[tuple[Any, list[int]]] = []
    ops = 0
    for prompt, full in requests:
        if ops >= num_ops:
            break
        result = cache.match_prefix(base.MatchPrefixParams(key=radix.RadixKey(prompt)))
        trail.append(result.device_prefix_len)
        node = result.last_device_node
        cache.inc_lock_ref(node)
        running.append((node, full))
        ops += 2
        if len(running) > in_flight:
            done, finished = running.pop(0)
            inserted = cache.insert(
                base.InsertParams(key=radix.RadixKey(finished), value=slots[: len(finished)])
            )
            trail.append(inserted.prefix_len)
            cache.dec_lock_ref(done)
            ops += 2
        excess = cache.evictable_size() + cache.protected_size() - capacity
        if excess > 0:
            trail.append(cache.evict(base.EvictParams(num_tokens=excess)).num_tokens_evicted)
            ops += 1
    return [*trail, cache.evictable_size(), cache.protected_size()]


class _NullAllocator:
    """SGLang's ``token_to_kv_pool_allocator`` for the benchmark: eviction hands slots back to nothing."""

    device = "cpu"

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        return None

    def free(self, indices: Any) -> None:
        return None


def compare_with_sglang(requests: list, capacity: int, num_ops: int, repeats: int) -> None:
    """kvlab's tree beside SGLang's real ``RadixCache`` on the same calls: CPU medians and the ratio."""
    sg = load_sglang()
    if sg is None:
        print("SGLang's sources are not unpacked (python tools/conformance/sglang_harness.py --fetch): "
              "kvlab alone above")  # fmt: skip
        return
    trails: dict[str, list[int]] = {}

    def timed(name: str, calls: Any) -> Any:
        def go() -> None:
            trails[name] = calls()

        return go

    fns = {
        "kvlab RadixTree": timed("kvlab", lambda: kvlab_calls(requests, capacity, num_ops)),
        "SGLang 0.5.23 RadixCache": timed("sglang", lambda: sglang_calls(sg, requests, capacity, num_ops)),
    }
    from prefix_cache import frozen_input  # benchmarks/prefix_cache.py: the trace out of the collector's view

    with frozen_input():
        timings = measure_side_by_side(fns, warmup=1, repeats=repeats)
    if trails["kvlab"] != trails["sglang"]:
        raise SystemExit("kvlab and SGLang returned different results: a bug, not a benchmark result")
    n = len(trails["kvlab"])
    print(f"side by side with SGLang's real code, {num_ops:,} calls (same {n:,} results: checked), "
          f"CPU time, median of {repeats}:")  # fmt: skip
    for name, t in timings.items():
        q1, q3 = _cpu_quartiles(t)
        print(f"  {name:<30}{t.cpu_median_ms / 1e3:8.2f} CPU s  (IQR {q1 / 1e3:.2f}-{q3 / 1e3:.2f})")
    kv, sgl = timings.values()
    print(f"  kvlab / SGLang: {sgl.cpu_median_ms / kv.cpu_median_ms:.2f}x the speed")


def _cpu_quartiles(t: Any) -> tuple[float, float]:
    import statistics

    if t.repeats == 1:
        return t.cpu_ms[0], t.cpu_ms[0]
    q1, _, q3 = statistics.quantiles(t.cpu_ms, n=4, method="inclusive")
    return q1, q3


def make_scenario(num_ops: int, capacity: int = 100_000, in_flight: int = 16, seed: int = 0) -> dict:
    """The trace as a replay scenario (``match`` with ``as``, ``lock``, ``insert``, ``unlock``, ``evict``)."""
    tree = RadixTree(page_size=1)  # a shadow tree: evict only when the real replay would hold too much
    ops: list[dict] = []
    running: list[tuple[str, list[int]]] = []
    handles: dict[str, RadixNode] = {}
    for i, (prompt, full) in enumerate(make_trace(num_ops, seed)):
        if len(ops) >= num_ops:
            break
        name = f"r{i}"
        node = tree.match(prompt).node
        tree.lock(node)
        handles[name] = node
        ops += [{"op": "match", "tokens": prompt, "as": name}, {"op": "lock", "node": name}]
        running.append((name, full))
        if len(running) > in_flight:
            done, finished = running.pop(0)
            tree.insert(finished)
            tree.unlock(handles.pop(done))
            ops += [{"op": "insert", "tokens": finished}, {"op": "unlock", "node": done}]
        excess = tree.total_tokens - capacity
        if excess > 0:
            tree.evict(excess)
            ops.append({"op": "evict", "num_tokens": excess})
    return {"config": {"page_size": 1}, "ops": ops}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="tree calls in the trace (default 100000)")
    parser.add_argument(
        "--capacity", type=int, default=100_000, help="tokens the tree may hold (default 100000)"
    )
    parser.add_argument(
        "--baseline-ops",
        type=int,
        default=20_000,
        help="calls for the side-by-side comparison with the rescan (default 20000)",
    )
    parser.add_argument(
        "--replay-ops", type=int, default=2000, help="ops for the CLI's default (full) mode (default 2000)"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed rounds side by side with SGLang (default 5)"
    )
    parser.add_argument(
        "--only-sglang", action="store_true", help="only the comparison with SGLang's real code"
    )
    args = parser.parse_args(argv)
    requests = make_trace(args.ops)
    compare_with_sglang(requests, args.capacity, args.ops, args.repeats)
    if args.only_sglang:
        return 0

    tree = RadixTree(page_size=1)
    ops, seconds, evictions = run(tree, requests, args.capacity, args.ops)
    runs = sum(len(e) for e in evictions)
    print(
        f"radix tree, {ops} ops on a chat trace ({len(evictions)} evict calls, {runs} leaves evicted; "
        f"{tree.num_nodes} nodes and {tree.total_tokens} tokens at the end)"
    )
    print(f"  {'kvlab':<30}{ops / seconds:>10,.0f} ops/s  {seconds:6.2f} s")

    side = {}
    for name, cls in (("kvlab (heap across calls)", RadixTree), ("rescan (walk + heapify)", RescanRadixTree)):
        n, secs, ev = run(cls(page_size=1), requests, args.capacity, args.baseline_ops)
        side[name] = (n, secs, ev)
    (n, fast, ev_fast), (_, slow, ev_slow) = side.values()
    if ev_fast != ev_slow or ev_fast != evictions[: len(ev_fast)]:
        print("MISMATCH: the two evictions removed different runs", file=sys.stderr)
        return 1
    print(f"first {n} ops, side by side (same evictions, same order: checked):")
    for name, (_, secs, _) in side.items():
        print(f"  {name:<30}{n / secs:>10,.0f} ops/s  {secs:6.2f} s")
    print(f"  ratio {slow / fast:.1f}x")

    from prefix_cache import report_replay  # benchmarks/prefix_cache.py: the CLI timed in a child process

    big = make_scenario(args.ops, args.capacity)
    small = {"config": big["config"], "ops": big["ops"][: args.replay_ops]}
    print(f"python -m kvlab replay radix, the trace as a scenario ({len(big['ops']):,} ops):")
    report_replay("radix", big, small)
    return 0


if __name__ == "__main__":
    sys.exit(main())
