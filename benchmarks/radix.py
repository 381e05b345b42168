"""Radix tree throughput on a 100k-op chat-like trace: ``python benchmarks/radix.py [--ops N]``.

The trace: users share a few system prompts and grow their own conversations
turn by turn. Each request is what SGLang's scheduler does with one: ``match``
the prompt and ``lock`` the node it ended at; when it finishes (16 run at
once), ``insert`` the prompt plus the reply and ``unlock`` the old node; when
the tree holds more than its capacity, ``evict`` the excess.

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kvlab.models.radix import RadixNode, RadixTree  # noqa: E402


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

    Returns (calls, seconds, evicted runs per evict call).
    """
    running: list[tuple[RadixNode, list[int]]] = []
    evictions = []
    ops = 0
    start = time.perf_counter()
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
    return ops, time.perf_counter() - start, evictions


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
    args = parser.parse_args(argv)
    requests = make_trace(args.ops)

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
