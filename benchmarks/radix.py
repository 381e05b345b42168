"""Radix tree throughput on a 100k-op chat-like trace: ``python benchmarks/radix.py [--ops N]``.

The trace: users share a few long system prompts and grow their own
conversations turn by turn. Each turn is what SGLang's scheduler does with a
request: ``match`` the prompt, ``lock`` the node it ended at, ``insert`` the
prompt plus the reply when the request finishes, ``unlock`` the old node; when
the tree holds more than its capacity, ``evict`` the excess.

It runs the trace twice and prints ops/s side by side:

* ``kvlab``: ``RadixTree`` as shipped, one heap of evictable leaves kept across
  calls (stale entries skipped), O(log n) per evicted leaf;
* ``rescan``: the same tree with an eviction that collects every unlocked leaf
  by walking the whole tree and heapifies them on every call, as SGLang up to
  0.4 did (``_collect_leaves``; newer SGLang keeps a set of evictable leaves but
  still heapifies all of them per call).

Both must evict the same runs in the same order; the script checks it.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvlab.radix import RadixNode, RadixTree  # noqa: E402


class RescanRadixTree(RadixTree):
    """Eviction by a full walk + heapify per call: the reference order, the slow way."""

    def evict(self, num_tokens: int) -> list[tuple[int, ...]]:
        self._begin_op()
        heap = [(n.last_access, n.node_id, n) for n in self.nodes()
                if not n.is_root and not n.children and n.lock_ref == 0]
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


def make_trace(num_ops: int, seed: int = 0) -> list[tuple]:
    """A list of ('turn', user, prompt, reply) and ('evict',) steps worth about ``num_ops`` tree calls."""
    rng = random.Random(seed)
    systems = [[rng.randrange(32000) for _ in range(rng.randrange(64, 256))] for _ in range(20)]
    histories: list[list[int]] = []
    steps: list[tuple] = []
    calls = 0
    while calls < num_ops:
        if not histories or rng.random() < 0.15:
            histories.append(list(rng.choice(systems)))
        user = rng.randrange(len(histories))
        history = histories[user]
        question = [rng.randrange(32000) for _ in range(rng.randrange(4, 40))]
        reply = [rng.randrange(32000) for _ in range(rng.randrange(8, 64))]
        prompt = history + question
        histories[user] = prompt + reply
        if len(histories[user]) > 2000:  # the conversation ends; the user starts over
            histories[user] = list(rng.choice(systems))
        steps.append(("turn", prompt, prompt + reply))
        steps.append(("evict",))
        calls += 5  # match, lock, insert, unlock, evict
    return steps


def run(tree: RadixTree, trace: list[tuple], capacity: int, in_flight: int = 16) -> tuple[int, float, list]:
    """Replay the trace; up to ``in_flight`` requests hold a lock at once. Returns (ops, seconds, evictions)."""
    running: list[tuple[RadixNode, tuple[int, ...]]] = []
    evictions = []
    ops = 0
    start = time.perf_counter()
    for step in trace:
        if step[0] == "turn":
            node = tree.match(step[1]).node
            tree.lock(node)
            running.append((node, step[2]))
            ops += 2
            if len(running) > in_flight:  # the oldest running request finishes
                done, full = running.pop(0)
                tree.insert(full)
                tree.unlock(done)
                ops += 2
        else:
            excess = tree.total_tokens - capacity
            evictions.append(tree.evict(max(0, excess)))
            ops += 1
    return ops, time.perf_counter() - start, evictions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="tree calls in the trace (default 100000)")
    parser.add_argument("--capacity", type=int, default=50_000, help="tokens the tree may hold (default 50000)")
    args = parser.parse_args(argv)
    trace = make_trace(args.ops)
    results = {}
    for name, cls in (("kvlab", RadixTree), ("rescan", RescanRadixTree)):
        tree = cls(page_size=1)
        ops, seconds, evictions = run(tree, trace, args.capacity)
        results[name] = (ops, seconds, evictions, tree)
    (ops, fast, ev_fast, tree), (_, slow, ev_slow, _) = results["kvlab"], results["rescan"]
    if ev_fast != ev_slow:
        print("MISMATCH: the two evictions removed different runs", file=sys.stderr)
        return 1
    runs = sum(len(e) for e in ev_fast)
    print(f"radix tree, {ops} ops ({runs} leaves evicted; {tree.num_nodes} nodes, "
          f"{tree.total_tokens} tokens at the end)")
    print(f"  {'kvlab (heap across calls)':<28}{ops / fast:>12,.0f} ops/s   {fast:6.2f} s")
    print(f"  {'rescan (walk + heapify)':<28}{ops / slow:>12,.0f} ops/s   {slow:6.2f} s")
    print(f"  speed-up {slow / fast:.1f}x; identical eviction order: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
