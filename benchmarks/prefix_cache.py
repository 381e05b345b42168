"""Prefix-cache throughput against vLLM's own code, and why the free queue must be a linked list.

First, side by side with vLLM 0.33.0's real ``KVCacheManager`` when its sources
are unpacked (``python tools/conformance/vllm_harness.py --fetch``; kvlab alone
otherwise): the same 100,000-op scenario (alloc, append, free, probe) through
``PrefixCache`` and through the calls vLLM's scheduler makes (``vllm_ops``),
checked to give the same hits, new blocks, refusals and final free queue; then
kvlab's ``hashing.block_hashes`` (vLLM scheme) beside vLLM's ``hash_block_tokens``
chain on the trace's prompts, checked to give the same digests, and beside that
chain plus the check vLLM runs on every prompt's ids before it is scheduled
(``BaseRenderer.validate_token_ids``, called by ``InputProcessor``), as kvlab's
``block_hashes`` checks its ids before it hashes them. CPU time
(``time.process_time``) of interleaved rounds (``kvlab.core.timing``), medians
with the IQR, and the ratios: of the medians, and round by round (each round's
two calls ran back to back, so a slow moment of the machine falls on both). Both
sides' results are checked on one untimed run each and dropped before the clock
starts, so no side's garbage collections walk
results the other kept; the parsed trace is frozen out of the collector's view
while timing (``frozen_input``), for both alike; each timed round's results are
dropped after its clock stops.

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
                                      [--repeats 5] [--hash-prompts 5000] [--only-vllm]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvlab.core import hashing  # noqa: E402
from kvlab.core.timing import Timing, measure_side_by_side  # noqa: E402
from kvlab.errors import MAX_TOKEN_ID, OutOfBlocksError  # noqa: E402
from kvlab.models.free_queue import Block, FreeBlockQueue  # noqa: E402
from kvlab.models.prefix_cache import PrefixCache  # noqa: E402


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

    _popleft_n = popleft_n  # the cache's own (unchecked) calls: the same list operations
    _append_n = append_n
    _prepend_n = prepend_n


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


CONFORMANCE = Path(__file__).resolve().parent.parent / "tools" / "conformance"


def load_vllm() -> Any:
    """vLLM 0.33.0's real KV-cache modules when their sources are unpacked, else None.

    ``python tools/conformance/vllm_harness.py --fetch`` downloads them; the
    harness loads ``kv_cache_manager.py``, ``block_pool.py``, ``kv_cache_utils.py``,
    ``request.py`` and the rest of the cache code unchanged, everything else stubbed.
    """
    sys.path.insert(0, str(CONFORMANCE))
    import vllm_harness

    return vllm_harness.load() if vllm_harness.available() else None


@contextlib.contextmanager
def frozen_input() -> Iterator[None]:
    """Time with the objects that exist already (the parsed trace) moved out of the garbage collector's view.

    A 100,000-op trace holds millions of token ids in lists; without this, every
    full collection, triggered by whatever either side allocates, walks all of
    them, which times the trace rather than the cache. ``gc.freeze`` is the same
    for both sides; what each one allocates is still collected as usual.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def kvlab_ops(config: dict, ops: list[dict]) -> tuple[list[Any], list[int]]:
    """The scenario's ops on a fresh ``PrefixCache``: what each call returned (None: refused), and the free queue."""
    cache = PrefixCache(config["num_blocks"], config["block_size"], null_block=True, hash_scheme="vllm")
    out: list[Any] = []
    add = out.append
    for op in ops:
        name = op["op"]
        try:
            if name == "alloc":
                add(cache.allocate(op["req"], op["tokens"], op.get("cache_salt")))
            elif name == "append":
                add(cache.append(op["req"], op["tokens"]))
            elif name == "free":
                add(cache.free(op["req"]))
            else:
                add(cache.probe(op["tokens"], op.get("cache_salt")))
        except OutOfBlocksError:
            add(None)
    return out, cache.free_queue()


def vllm_ops(v: Any, config: dict, ops: list[dict]) -> tuple[list[Any], list[int]]:
    """The same ops on vLLM's real ``KVCacheManager``, with the calls its scheduler makes.

    ``tools/conformance/vllm_harness.py`` (``RealPrefixCacheReplay``) says which
    calls and why; this is that replay without its per-op records. A request is
    built with the engine's block hasher (its prompt hashed on creation, as in
    the engine), looked up, then allocated; an append hashes the new full
    blocks and allocates; a refused append is taken back off the request.
    """
    import torch
    from vllm_harness import MAX_MODEL_LEN, SamplingParams

    iface, request_mod = v.interface, v.request
    bs = config["block_size"]
    spec = iface.FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float16)
    kv_config = iface.KVCacheConfig(
        num_blocks=config["num_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=[iface.KVCacheGroupSpec(["l"], spec)],
    )
    kvm = v.manager.KVCacheManager(
        kv_config,
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=bs,
        hash_block_size=bs,
        enable_caching=True,
    )
    hasher = v.utils.get_request_block_hasher(bs, v.hashing.sha256)
    params = SamplingParams()
    Request, running, finished = (
        request_mod.Request,
        request_mod.RequestStatus.RUNNING,
        request_mod.RequestStatus.FINISHED_STOPPED,
    )
    live: dict[str, Any] = {}
    out: list[Any] = []
    add = out.append
    for op in ops:
        name = op["op"]
        if name == "alloc" or name == "probe":
            rid = op.get("req") or "probe"
            request = Request(request_id=rid, prompt_token_ids=list(op["tokens"]), sampling_params=params,
                              pooling_params=None, cache_salt=op.get("cache_salt"), block_hasher=hasher)  # fmt: skip
            hit, num_hit, _ = kvm.get_computed_blocks(request)
            if name == "probe":
                add((num_hit, hit))
                continue
            new = kvm.allocate_slots(request, request.num_tokens - num_hit, num_new_computed_tokens=num_hit,
                                     new_computed_blocks=hit, full_sequence_must_fit=True,
                                     has_scheduled_reqs=bool(live))  # fmt: skip
            if new is None:
                add(None)
                continue
            request.status = running
            request.num_computed_tokens = request.num_tokens
            live[rid] = request
            add((num_hit, hit, new))
        elif name == "append":
            request = live[op["req"]]
            tokens = op["tokens"]
            num_hashes = len(request.block_hashes)
            request.append_output_token_ids(tokens)
            new = kvm.allocate_slots(request, len(tokens))
            if new is None:
                del request._output_token_ids[-len(tokens) :]
                del request._all_token_ids[-len(tokens) :]
                del request.block_hashes[num_hashes:]
                add(None)
                continue
            request.num_computed_tokens += len(tokens)
            add(new)
        else:
            request = live.pop(op["req"])
            request.status = finished
            kvm.free(request)
            add(None)
    queue = [b.block_id for b in kvm.block_pool.free_block_queue.get_all_free_blocks()]
    return out, queue


def _kvlab_view(op: dict, result: Any) -> Any:
    """What the comparison checks of one kvlab result: hits and new blocks (None for refusals and frees)."""
    if result is None or op["op"] == "free":
        return None
    if op["op"] == "probe":
        return (result.num_cached_tokens, result.hit_block_ids)
    if op["op"] == "append":
        return ((), result.new_block_ids)
    return (result.num_cached_tokens, result.hit_block_ids, result.new_block_ids)


def _vllm_view(op: dict, result: Any) -> Any:
    if result is None:
        return None
    if op["op"] == "probe":
        num_hit, hit = result
        return (num_hit, tuple(b.block_id for b in hit.blocks[0]))
    if op["op"] == "append":
        return ((), tuple(b.block_id for b in result.blocks[0]))
    num_hit, hit, new = result
    return (num_hit, tuple(b.block_id for b in hit.blocks[0]), tuple(b.block_id for b in new.blocks[0]))


def _print_timings(timings: dict[str, Timing], what: str, ours: str, theirs: str) -> None:
    for name, t in timings.items():
        q1, q3 = _cpu_quartiles(t)
        print(f"  {name:<40}{t.cpu_median_ms:10.1f} CPU ms  (IQR {q1:.1f}-{q3:.1f}, n={t.repeats})")
    ratio = timings[theirs].cpu_median_ms / timings[ours].cpu_median_ms
    low, mid, high = timings[theirs].ratio_by_round(timings[ours], clock="cpu")
    print(
        f"  {what}: kvlab runs at {ratio:.2f}x the speed of vLLM's own code (ratio of the CPU medians); "
        f"round by round {mid:.2f}x, the middle half of the rounds {low:.2f}x to {high:.2f}x"
    )


def _cpu_quartiles(t: Timing) -> tuple[float, float]:
    import statistics

    if t.repeats == 1:
        return t.cpu_ms[0], t.cpu_ms[0]
    q1, _, q3 = statistics.quantiles(t.cpu_ms, n=4, method="inclusive")
    return q1, q3


def compare_with_vllm(scenario: dict, repeats: int, hash_prompts: int) -> None:
    """kvlab beside vLLM's real code on the same ops: the cache, then the block hash chain."""
    v = load_vllm()
    config, ops = scenario["config"], scenario["ops"]
    if v is None:
        print(
            "vLLM's sources are not unpacked (python tools/conformance/vllm_harness.py --fetch): kvlab alone"
        )
        t = measure_side_by_side({"kvlab PrefixCache": lambda: kvlab_ops(config, ops)}, repeats=repeats)
        print(f"  kvlab PrefixCache {t['kvlab PrefixCache'].cpu_median_ms:.1f} CPU ms for {len(ops):,} ops")
        return
    ours, theirs = "kvlab PrefixCache", "vLLM 0.33.0 KVCacheManager"
    (k_out, k_queue), (v_out, v_queue) = kvlab_ops(config, ops), vllm_ops(v, config, ops)
    mine = [_kvlab_view(op, r) for op, r in zip(ops, k_out, strict=True)]
    real = [_vllm_view(op, r) for op, r in zip(ops, v_out, strict=True)]
    if mine != real or k_queue != v_queue:
        raise SystemExit("kvlab and vLLM returned different results: a bug, not a benchmark result")
    del k_out, v_out, mine, real  # checked: no side's timing walks the other's kept results in a collection
    fns = {ours: lambda: kvlab_ops(config, ops), theirs: lambda: vllm_ops(v, config, ops)}
    with frozen_input():
        timings = measure_side_by_side(fns, warmup=1, repeats=repeats)
    print(f"side by side with vLLM's real code, {len(ops):,} ops (same hits, new blocks, refusals and final "
          "free queue: checked), CPU time:")  # fmt: skip
    _print_timings(timings, "prefix cache", ours, theirs)

    bs = config["block_size"]
    prompts = [op["tokens"] for op in ops if op["op"] == "alloc"][:hash_prompts]
    hash_block_tokens, sha256 = v.utils.hash_block_tokens, v.hashing.sha256

    def vllm_chain() -> list[list[bytes]]:
        chains = []
        for toks in prompts:
            parent, chain = None, []
            for start in range(0, len(toks) - bs + 1, bs):
                parent = hash_block_tokens(sha256, parent, toks[start : start + bs], None)
                chain.append(parent)
            chains.append(chain)
        return chains

    def kvlab_chain() -> list[list[bytes]]:
        return [hashing.block_hashes(toks, bs, scheme="vllm") for toks in prompts]

    def kvlab_chain_only() -> list[list[bytes]]:  # what PrefixCache runs on tokens it has checked once
        return [hashing._chain(hashing.VLLM_NONE_HASH, toks, bs, None, "vllm") for toks in prompts]

    validate = v.token_id_check(MAX_TOKEN_ID + 1)  # ids bounded as kvlab's check bounds them

    # what a request passes: InputProcessor's check of its ids, then the scheduler's hashing
    def vllm_checked_chain() -> list[list[bytes]]:
        for toks in prompts:
            validate(toks)
        return vllm_chain()

    ours, theirs = "kvlab hashing.block_hashes (vllm scheme)", "vLLM hash_block_tokens chain"
    chain_only = "kvlab's chain alone (ids checked before)"
    checked = "vLLM validate_token_ids + the chain"
    mine_chains = kvlab_chain()
    if (
        mine_chains != vllm_chain()
        or mine_chains != kvlab_chain_only()
        or mine_chains != vllm_checked_chain()
    ):
        raise SystemExit("kvlab and vLLM hashed differently: a bug, not a benchmark result")
    blocks = sum(len(c) for c in mine_chains)
    del mine_chains
    fns = {ours: kvlab_chain, chain_only: kvlab_chain_only, theirs: vllm_chain, checked: vllm_checked_chain}
    with frozen_input():
        timings = measure_side_by_side(fns, warmup=1, repeats=max(repeats, 5))
    print(f"block hashes of {len(prompts):,} prompts ({blocks:,} blocks, the same digests: checked):")
    _print_timings(timings, "block_hashes (its check and its chain) against vLLM's bare chain", ours, theirs)
    ratio = timings[theirs].cpu_median_ms / timings[chain_only].cpu_median_ms
    print(
        f"  kvlab's chain alone against vLLM's chain, on ids checked before (as PrefixCache hashes a request it "
        f"has checked once): kvlab runs at {ratio:.2f}x the speed; the rest of block_hashes is its input check "
        "(kvlab refuses bools, floats and ids out of range; vLLM's hash_block_tokens takes its ids as given)"
    )
    ratio = timings[checked].cpu_median_ms / timings[ours].cpu_median_ms
    print(
        f"  each side's check and chain (vLLM 0.33's InputProcessor checks every prompt's ids with "
        f"BaseRenderer.validate_token_ids, min and max against the vocabulary, before the scheduler hashes its "
        f"blocks): kvlab runs at {ratio:.2f}x the speed of vLLM's own code"
    )


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
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed rounds side by side with vLLM (default 5)"
    )
    parser.add_argument(
        "--hash-prompts", type=int, default=5000, help="prompts for the hash-chain comparison"
    )
    parser.add_argument("--only-vllm", action="store_true", help="only the comparison with vLLM's real code")
    args = parser.parse_args()

    big = make_scenario(args.ops, args.blocks, args.block_size, args.seed)
    compare_with_vllm(big, args.repeats, args.hash_prompts)
    if args.only_vllm:
        return
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
    small = {"config": big["config"], "ops": big["ops"][: args.replay_ops]}
    print(f"python -m kvlab replay prefix-cache, the trace as a scenario ({args.blocks:,} blocks):")
    report_replay("prefix-cache", big, small)


if __name__ == "__main__":
    main()
