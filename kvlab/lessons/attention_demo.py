"""Notebook 14's experiments on real tensors, so its cells are a few calls whose output is the point.

Each helper builds the tensors an experiment needs with kvlab's own parts (``BlockPool`` hands out
the block tables, ``write_kv_cache`` stores keys and values through the slot mapping), runs it, and
returns what the notebook prints. Every time comes from ``kvlab.core.timing`` (median, IQR, CPU
time); every sentence a helper prints about a time is decided from those numbers in the same run
(``clearly_faster_than``, ``ratio_spread``), never typed in.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlab.core.timing import Timing, measure_side_by_side
from kvlab.engine import Engine, paged_attention, run_chat, slot_mapping, write_kv_cache
from kvlab.engine.chat import ChatTurnResult, context_needed
from kvlab.errors import (
    LIMITS,
    InvalidArgumentError,
    check_bool,
    check_choice,
    check_int,
    check_items,
    check_size,
    check_text,
)
from kvlab.models.paged import BlockPool
from kvlab.models.prefix_cache import PrefixCache

MiB = 2**20
DEVICES = ("cpu", "cuda")


def sync_for(device: str) -> Callable[[], None] | None:
    """What the timings call around each timed call: GPU work is asynchronous, so wait for it."""
    device = check_choice("device", device, DEVICES)
    return torch.cuda.synchronize if device == "cuda" else None


def _lengths(lengths: object) -> list[int]:
    items = [check_size("a sequence length", n, "tokens", minimum=1) for n in check_items("lengths", lengths)]
    if not items:
        raise InvalidArgumentError("give at least one sequence length")
    return items


@dataclass(frozen=True)
class PagedBatch:
    """A decode batch in a paged pool, and the same keys and values contiguous (one tensor per sequence)."""

    query: torch.Tensor  # [num_seqs, num_heads, head_dim]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, longest table], int32
    seq_lens: torch.Tensor  # [num_seqs], int32
    keys: tuple[torch.Tensor, ...]  # per sequence [seq_len, num_kv_heads, head_dim]
    values: tuple[torch.Tensor, ...]

    def attend(self, impl: str = "torch") -> torch.Tensor:
        """``paged_attention`` over this batch."""
        return paged_attention(
            self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens, impl=impl
        )

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V in the pool: what one decode step reads."""
        return self.key_cache.nbytes + self.value_cache.nbytes


def paged_batch(
    lengths: Sequence[int],
    block_size: int,
    *,
    device: str = "cpu",
    num_heads: int = 8,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    shuffled: bool = True,
) -> PagedBatch:
    """Random K/V per sequence, written into a pool through the block tables kvlab's ``BlockPool`` hands out.

    ``shuffled`` hands blocks out from a shuffled free list, so no table is in order; with
    ``shuffled=False`` the same keys and values (same seed) sit in blocks in order, sequence after
    sequence: the pool is then the contiguous layout, still read through the tables.
    """
    lengths = _lengths(lengths)
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    device = check_choice("device", device, DEVICES)
    check_bool("shuffled", shuffled)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1, maximum=256)
    num_heads = check_int("num_heads", num_heads, minimum=num_kv_heads, maximum=1024)
    head_dim = check_int("head_dim", head_dim, minimum=1, maximum=1024)
    if num_heads % num_kv_heads:
        raise InvalidArgumentError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    seed = check_int("seed", seed, minimum=0, maximum=2**31 - 1)
    blocks = sum(-(-n // block_size) for n in lengths)
    if 2 * blocks * block_size * num_kv_heads * head_dim * 8 > LIMITS.memory_mib * MiB:
        raise InvalidArgumentError(
            f"this batch's K and V would take more than {LIMITS.memory_mib:,} MiB (LIMITS.memory_mib)"
        )
    cpu = torch.Generator().manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lengths)
    order = torch.randperm(num_blocks, generator=cpu).tolist() if shuffled else list(range(num_blocks))
    pool = BlockPool(num_blocks, block_size, free_order=order)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.zeros(shape, dtype=dtype, device=device)
    value_cache = torch.zeros(shape, dtype=dtype, device=device)
    keys, values, tables = [], [], []
    for i, n in enumerate(lengths):
        pool.allocate(f"s{i}", n)
        tables.append(list(pool.block_table(f"s{i}")))
        table = torch.tensor(tables[-1], device=device)
        k, v = (torch.randn(n, num_kv_heads, head_dim, generator=gen, device=device).to(dtype) for _ in "kv")
        write_kv_cache(
            k, v, key_cache, value_cache, slot_mapping(table, torch.arange(n, device=device), block_size)
        )
        keys.append(k)
        values.append(v)
    block_tables = torch.zeros(len(lengths), max(map(len, tables)), dtype=torch.int32)
    for i, row in enumerate(tables):
        block_tables[i, : len(row)] = torch.tensor(row)
    query = torch.randn(len(lengths), num_heads, head_dim, generator=gen, device=device).to(dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return PagedBatch(
        query, key_cache, value_cache, block_tables.to(device), seq_lens, tuple(keys), tuple(values)
    )


def dense_attention(
    query: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Each sequence's query over its own contiguous K/V, in float64, by torch's SDPA: an oracle sharing no code with kvlab."""
    rows = [
        F.scaled_dot_product_attention(
            q[:, None].double(), k.transpose(0, 1).double(), v.transpose(0, 1).double(), enable_gqa=True
        )[:, 0]
        for q, k, v in zip(query, keys, values, strict=True)
    ]
    return torch.stack(rows)


def error_table(lengths: Sequence[int], impls: Sequence[str], device: str = "cpu") -> list[str]:
    """Max abs error of every implementation against float64 dense attention, per block size and dtype."""
    impls = [
        check_choice("an impl", i, ("reference", "torch", "triton", "flex"))
        for i in check_items("impls", impls)
    ]
    lines = [
        f"max abs error against float64 dense attention, {len(lengths)} sequences of {list(lengths)} tokens",
        f"{'block size':>10}  {'dtype':>8}  " + "  ".join(f"{impl:>10}" for impl in impls),
    ]
    for block_size in (1, 16, 64):
        for dtype in (torch.float32, torch.float16):
            batch = paged_batch(lengths, block_size, device=device, dtype=dtype, seed=block_size)
            expected = dense_attention(batch.query, batch.keys, batch.values)
            errors = [(batch.attend(impl).double() - expected).abs().max().item() for impl in impls]
            lines.append(
                f"{block_size:>10}  {str(dtype)[6:]:>8}  " + "  ".join(f"{e:>10.1e}" for e in errors)
            )
    return lines


def on_clock(timing: Timing, clock: str) -> Timing:
    """``timing`` in wall time, or its CPU-time samples as a Timing of their own (``clock="CPU"``).

    On a shared CPU another process can hold the core in the middle of a call; the process's CPU
    time leaves that out, so its quartiles are what the call itself cost. On a GPU the CPU only
    waits, so the wall clock is the one to read.
    """
    clock = check_choice("clock", clock, ("CPU", "wall"))
    return Timing(timing.cpu_ms, timing.cpu_ms) if clock == "CPU" else timing


def clock_for(device: str) -> str:
    """The clock a verdict reads: this process's CPU time on a CPU (one thread), wall time on a GPU."""
    return "CPU" if check_choice("device", device, DEVICES) == "cpu" else "wall"


def _verdict(fast: Timing, slow: Timing, fast_name: str, slow_name: str) -> str:
    """One sentence about two timings, decided from their spreads."""
    low, high = slow.ratio_spread(fast)
    if fast.clearly_faster_than(slow):
        return f"{fast_name} clearly faster than {slow_name}: {slow.ratio_to(fast):.2f}x (at least {low:.2f}x across the IQRs)"
    return (
        f"{fast_name} against {slow_name}: {slow.ratio_to(fast):.2f}x, but their IQRs overlap "
        f"({low:.2f}x to {high:.2f}x): no clear difference in this run"
    )


@dataclass(frozen=True)
class BlockSizeSweep:
    """Part four: per block size, the waste, the table length, the slots a decode call reads and its time."""

    sizes: tuple[int, ...]
    tokens: int  # tokens the requests hold
    held: dict[int, int]  # slots in the requests' blocks
    table: dict[int, int]  # longest block table
    times: dict[int, Timing]

    clock: str = "CPU"  # the clock the table's times and the verdict read

    def lines(self, per_token: int) -> list[str]:
        head = f"decode, {self.clock} ms"
        out = [
            f"{'block':>6} {'empty slots':>12} {'wasted KV':>10} {'longest':>8} {'slots read':>11}  {head:>17}  wall ms",
            f"{'size':>6} {'(8 requests)':>12} {'(MiB)':>10} {'table':>8} {'per call':>11}  {'median (IQR)':>17}  median",
        ]
        read = {bs: on_clock(t, self.clock) for bs, t in self.times.items()}
        for bs in self.sizes:
            t, empty = read[bs], self.held[bs] - self.tokens
            cell = f"{t.median_ms:.2f} ({t.q1_ms:.2f}-{t.q3_ms:.2f})"
            out.append(
                f"{bs:>6,} {empty:>12,} {empty * per_token / MiB:>10.2f} {self.table[bs]:>8,} {self.held[bs]:>11,}  "
                f"{cell:>17}  {self.times[bs].median_ms:.2f}"
            )
        slowest = max(self.sizes, key=lambda b: read[b].median_ms)
        fastest = min(self.sizes, key=lambda b: read[b].median_ms)
        out.append(
            f"{self.clock} time: slowest median {slowest:,}-token blocks, fastest {fastest:,}-token blocks; "
            + _verdict(read[fastest], read[slowest], f"{fastest:,}", f"{slowest:,}")
        )
        big = max(self.sizes)
        out.append(
            f"{big:,}-token blocks: {self.held[big]:,} slots held for {self.tokens:,} tokens, "
            f"{self.held[big] / self.tokens:.2f}x the bytes of the tokens themselves: what a kernel reads "
            f"when it reads whole blocks"
        )
        return out


def block_size_sweep(
    lengths: Sequence[int], sizes: Sequence[int], *, device: str = "cpu", repeats: int = 21
) -> BlockSizeSweep:
    """One decode call of ``paged_attention`` (torch) over the same requests in each block size, timed interleaved."""
    lengths = _lengths(lengths)
    sizes = tuple(check_size("a block size", b, "block_size", minimum=1) for b in check_items("sizes", sizes))
    calls, held, table = {}, {}, {}
    for bs in sizes:
        batch = paged_batch(lengths, bs, device=device, seed=bs)
        calls[bs] = lambda b=batch: b.attend("torch")
        held[bs] = sum(BlockPool(1, bs).blocks_needed(n) for n in lengths) * bs
        table[bs] = int(batch.block_tables.shape[1])
    times = measure_side_by_side(calls, warmup=1, repeats=repeats, sync=sync_for(device))
    return BlockSizeSweep(sizes, sum(lengths), held, table, times, clock_for(device))


@dataclass(frozen=True)
class DecodeAgainstSdpa:
    """Part five: paged decode (shuffled and in-order blocks) against SDPA on contiguous K/V, and a memory copy."""

    label: str
    kv_bytes: int
    copy_bytes: int
    times: dict[str, Timing]  # as measured (wall and CPU samples)
    impls: tuple[str, ...]
    clock: str = "CPU"  # the clock the lines read

    def lines(self, peak: float | None = None) -> list[str]:
        out = [
            f"{self.label}, {self.kv_bytes / 1e6:,.0f} MB of K and V per step; {self.clock} time, "
            "the wall median at the end of each line"
        ]
        read = {name: on_clock(t, self.clock) for name, t in self.times.items()}
        for name, t in read.items():
            moved = 2 * self.copy_bytes if name == "memory copy" else self.kv_bytes  # a copy reads and writes
            rate = moved / (t.median_ms / 1e3)
            share = f"  {100 * rate / peak:5.1f}% of the peak" if peak else ""
            out.append(
                f"  {name:<30} {t.median_ms:8.3f} ms (IQR {t.q1_ms:.3f}-{t.q3_ms:.3f})  {rate / 1e9:7.1f} GB/s"
                f"{share}  (wall {self.times[name].median_ms:.3f})"
            )
        sdpa = read["contiguous, torch SDPA"]
        for impl in self.impls:
            shuffled, ordered = read[f"paged, {impl}"], read[f"paged, {impl}, blocks in order"]
            out += [
                f"paged {impl} / SDPA, in time: {_ratio(shuffled, sdpa)}",
                f"  of it, shuffled blocks / the same blocks in order: {_ratio(shuffled, ordered)}",
                f"  and blocks in order / SDPA on the same bytes: {_ratio(ordered, sdpa)}",
            ]
        return out


def _ratio(a: Timing, b: Timing) -> str:
    low, high = a.ratio_spread(b)
    return f"{a.ratio_to(b):.2f}x ({low:.2f}x to {high:.2f}x across the IQRs)"


def decode_against_sdpa(
    impls: Sequence[str],
    *,
    device: str = "cpu",
    num_seqs: int = 8,
    seq_len: int = 1024,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    repeats: int = 9,
) -> DecodeAgainstSdpa:
    """Time each paged implementation on shuffled and on in-order blocks, SDPA on the same K/V contiguous,
    and a copy of a 64 MiB tensor (this machine's memory speed), all in interleaved rounds."""
    impls = tuple(
        check_choice("an impl", i, ("torch", "triton", "flex")) for i in check_items("impls", impls)
    )
    seq_len = check_size("seq_len", seq_len, "tokens", minimum=1)
    num_seqs = check_int("num_seqs", num_seqs, minimum=1, maximum=4096)
    shape = dict(
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, device=device
    )
    batch = paged_batch([seq_len] * num_seqs, 16, **shape)
    in_order = paged_batch([seq_len] * num_seqs, 16, shuffled=False, **shape)
    contiguous_k = (
        torch.stack(batch.keys).transpose(1, 2).contiguous()
    )  # [S, HKV, L, D]: the same K/V, one array
    contiguous_v = torch.stack(batch.values).transpose(1, 2).contiguous()
    grouped_q = batch.query.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    calls: dict[str, Callable[[], object]] = {}
    for impl in impls:
        calls[f"paged, {impl}"] = lambda impl=impl: batch.attend(impl)
        calls[f"paged, {impl}, blocks in order"] = lambda impl=impl: in_order.attend(impl)
    calls["contiguous, torch SDPA"] = lambda: F.scaled_dot_product_attention(
        grouped_q, contiguous_k, contiguous_v
    )
    big = torch.ones(64 * MiB // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(big)
    calls["memory copy"] = lambda: target.copy_(big)
    times = measure_side_by_side(calls, warmup=1, repeats=repeats, sync=sync_for(device))
    name = torch.cuda.get_device_name() if device == "cuda" else "this CPU"
    label = (
        f"{name}: {num_seqs} sequences × {seq_len:,} tokens, {num_heads} query / {num_kv_heads} KV heads × "
        f"{head_dim}, {str(dtype)[6:]}"
    )
    return DecodeAgainstSdpa(label, batch.kv_bytes, big.nbytes, times, impls, clock_for(device))


def ttft_by_mode(
    system_tokens: int, *, device: str = "cpu", repeats: int = 5
) -> dict[str, list[ChatTurnResult]]:
    """Part eight: three turns behind a long system prompt in slot, block and no-cache mode, ``repeats`` runs each after a warm-up."""
    system_tokens = check_size("system_tokens", system_tokens, "tokens", minimum=1)
    runs = {}
    for mode in ("slot", "blocks", "off"):
        engine = Engine(
            cache=mode, block_size=16, max_model_len=context_needed(3, 1, system_tokens), device=device
        )
        runs[mode] = run_chat(
            engine, turns=3, max_tokens=1, system_tokens=system_tokens, repeats=repeats, warmup=1
        )
    return runs


def ttft_lines(runs: dict[str, list[ChatTurnResult]]) -> list[str]:
    """Each mode's turns (median and IQR), then every later turn against turn 1, decided from the spreads."""
    out = []
    for mode, turns in runs.items():
        cells = "   ".join(
            f"turn {t.turn}: {t.ttft.median_ms:6.1f} ms ({t.ttft.q1_ms:.1f}-{t.ttft.q3_ms:.1f})"
            for t in turns
        )
        out.append(f"{mode:<7}{cells}   cache_n {[t.cache_n for t in turns]}")
    out += [f"(median time to first token of {runs['slot'][0].ttft.repeats} runs, IQR in brackets)", ""]
    for mode, turns in runs.items():
        cold = turns[0].ttft
        for t in turns[1:]:
            cpu = cold.cpu_median_ms / t.ttft.cpu_median_ms if t.ttft.cpu_median_ms else float("inf")
            out.append(
                f"{mode:<7}" + _verdict(t.ttft, cold, f"turn {t.turn}", "turn 1") + f"; CPU {cpu:.1f}x"
            )
    return out


def least_speedup(runs: dict[str, list[ChatTurnResult]], modes: Sequence[str] = ("slot", "blocks")) -> float:
    """The smallest factor by which a later turn beat turn 1 across the IQRs, over ``modes``: the run's worst case."""
    return min(
        turns[0].ttft.ratio_spread(t.ttft)[0]
        for mode, turns in runs.items()
        if mode in modes
        for t in turns[1:]
    )


def predicted_cached(num_tokens: int, sent_before: bool, block_size: int = 16) -> int:
    """kvlab's model of vLLM's prefix cache: the tokens a prompt of this length reuses, first time or again."""
    num_tokens = check_size("num_tokens", num_tokens, "tokens", minimum=1)
    check_bool("sent_before", sent_before)
    block_size = check_size("block_size", block_size, "tokens", minimum=1)
    cache = PrefixCache(num_blocks=2 * (num_tokens // block_size + 1), block_size=block_size)
    if sent_before:
        cache.allocate("earlier", list(range(num_tokens)))
        cache.free("earlier")
    return cache.allocate("now", list(range(num_tokens))).num_cached_tokens


def pool_bytes(pool: object) -> int:
    """Bytes of a ``KVPool``'s key and value tensors, all layers."""
    if not hasattr(pool, "keys") or not hasattr(pool, "values"):
        raise InvalidArgumentError(f"pool must be a kvlab.engine KVPool, got {type(pool).__name__}")
    return pool.keys.nbytes + pool.values.nbytes


def usage(server: object, model: str, prompt: str) -> tuple[int, int | None]:
    """One completion, not streamed: (prompt tokens, cached tokens) as the server reports them (None: not reported)."""
    body = {"model": model, "prompt": check_text("prompt", prompt), "max_tokens": 1, "temperature": 0}
    counts = server.post("/v1/completions", body)["usage"]
    return counts["prompt_tokens"], (counts.get("prompt_tokens_details") or {}).get("cached_tokens")


def http_ttft(server: object, model: str, prompt: str, *, repeats: int = 9) -> dict[str, Timing]:
    """The client's time to first token of ``prompt`` resent (cached) and with a new first word (uncached), interleaved."""
    from kvlab.serve.client import first_token_ms, measure_first_tokens

    prompt = check_text("prompt", prompt, allow_empty=False)
    fresh = itertools.count()

    def send(make: Callable[[], str]) -> Callable[[], float]:
        return lambda: first_token_ms(server.url, make(), max_tokens=1, model=model, api_key=server.api_key)

    return measure_first_tokens(
        {"cached": send(lambda: prompt), "uncached": send(lambda: f"Request {next(fresh)}:" + prompt)},
        repeats=repeats,
    )


def http_ttft_lines(times: dict[str, Timing], part_eight_least: float) -> list[str]:
    """Each kind's median and IQR, the verdict from the spreads, and the least factor beside part eight's."""
    out = [
        f"{name:<9} time to first token {t.median_ms:6.1f} ms (IQR {t.q1_ms:.1f}-{t.q3_ms:.1f}, n={t.repeats})"
        for name, t in times.items()
    ]
    hit, miss = times["cached"], times["uncached"]
    out.append(_verdict(hit, miss, "cached", "uncached"))
    low = miss.ratio_spread(hit)[0]
    out.append(
        f"least factor across the IQRs: {low:.2f}x over HTTP, {part_eight_least:.2f}x in part eight: "
        + ("smaller over HTTP" if low < part_eight_least else "not smaller over HTTP")
    )
    return out


def sweep_lines(sweep: dict[int, Timing], fit: int) -> list[str]:
    """Throughput per number of clients, each doubling decided from the spreads, and where the pool limits it."""
    out = []
    for clients, t in sweep.items():
        low, high = sweep[1].ratio_spread(t)
        out.append(
            f"{clients} client{'s' if clients > 1 else ' '}: {1e3 / t.median_ms:6.0f} tokens/s "
            f"({t.median_ms:.2f} ms per token, IQR {t.q1_ms:.2f}-{t.q3_ms:.2f})  "
            f"{sweep[1].ratio_to(t):.2f}x one client's ({low:.2f}-{high:.2f}x across the IQRs)"
        )
    out.append("")
    counts = sorted(sweep)
    for fewer, more in zip(counts, counts[1:], strict=False):
        low, high = sweep[fewer].ratio_spread(sweep[more])
        verdict = "clearly more" if sweep[more].clearly_faster_than(sweep[fewer]) else "not clearly more"
        out.append(
            f"{more} clients against {fewer}: {verdict} throughput, {sweep[fewer].ratio_to(sweep[more]):.2f}x "
            f"({low:.2f}-{high:.2f}x across the IQRs)"
        )
    if 1 in sweep and 2 in sweep and fit in sweep and 2 * fit in sweep:
        first_least = sweep[1].ratio_spread(sweep[2])[0]
        past_most = sweep[fit].ratio_spread(sweep[2 * fit])[1]
        out.append(
            f"past the pool's {fit} requests, doubling the clients gained at most {past_most:.2f}x across the IQRs; "
            f"the first doubling at least {first_least:.2f}x: "
            + (
                "the pool, not the clients, is the limit"
                if past_most < first_least
                else "no clear limit in this run"
            )
        )
    return out
