"""Paged decode attention against torch's SDPA on the same keys and values laid out contiguously.

For each shape the script builds one paged KV pool (16-token blocks handed out
in a shuffled order, as a long-running server's free list would), laid out as
``layer_pool`` lays it out on the device (head-major on the CPU: in each block a KV
head's 16 rows side by side, as vLLM 0.33's CPU backend stores its pool), and the same
keys and values as one contiguous ``[num_seqs, num_kv_heads, seq_len, head_dim]``
tensor; on the CPU also the same pool token-major (a token's heads side by side), which
``planned, token-major`` times the kernel on and FlexAttention reads. It
checks that every implementation agrees with SDPA, then times them side
by side (``kvlab.core.timing.measure_side_by_side``: interleaved rounds, each in a
seeded shuffled order, so no call always runs in the caches one neighbour left;
median and interquartile range, wall and this process's CPU time) and prints per
implementation: the median, its ratio to the faster SDPA form in wall and in
CPU time, and the GB/s of K and V read (each cached byte counted once), next
to this machine's own bandwidth: a copy of a 256 MiB tensor timed in the same
run (bytes read + written per second).

SDPA is timed two ways and the faster is the baseline: the usual
``enable_gqa=True`` call, and the grouped form that folds each KV head's query
heads into a short query sequence (exact for decode, often faster on a CPU).
For the ragged shape (lengths 1 to 4k) the contiguous forms are one SDPA call
per sequence and one padded call with a key-padding mask.

CPU shapes run at one intra-op thread and at the machine's default thread
count (``--threads 1,2`` to choose; ``--shape`` picks shapes by name), all in this process, or
with ``--isolate`` each (shape, thread count) in a fresh process of its own (a student's fresh
run; it takes a third longer). ``paged torch`` is the
public ``impl="torch"`` (on these sizes the kernel torch.compile generates; the header says so
and how long its first call took, compiling included), its tables checked and cut into chunks
on every call; ``paged torch, planned`` is one layer's ``DecodePlan.attend`` on a plan made once
(``plan_decode``), which a model's layers share in a step, and the line under each table adds a
32-layer step's share of making the plan; ``paged torch walk`` is the per-sequence
walk that smaller calls run; ``paged torch tiles`` is the batched alternative (chunks of many
sequences per flash-kernel call). ``paged flex`` is FlexAttention
(compiled where torch can, the first call of a shape compiles). A prefill
section times ``paged_prefill`` of 2k new tokens against SDPA causal on
contiguous KV. On a GPU, the Triton kernel is timed with CUDA events and its
bandwidth is compared with the card's peak (H200: 4.8 TB/s; ``--peak-gbps``).

The goal line of each shape (and the table at the end) does not come from the table:
it times a planned layer and the faster SDPA form side by side alone, each call reading the
next of several layers' copies of the KV (at least 256 MiB in all, up to 8 layers), as a
decode step reads each layer's KV once and cold. In the table a small shape's KV (34 MB at
8 x 512, about this machine's last-level cache) is found in cache or not depending on which
implementation ran just before it; in the goal pair neither form inherits another's. The verdict
reads the pair round by round (``Timing.ratio_by_round``: each planned call over the SDPA call
of its round, so load on the machine at that moment falls on both): met when three rounds of
four or more are at most 1.2x.

The compiled decode keeps freed memory for reuse (``kvlab.engine.memory``): with huge pages
and glibc left to itself, its few megabytes of per-call scratch were page-faulted in again on
every call in some processes (about 520 faults a call at 8 x 4k), which is why such runs, and
fresh processes more often, found it up to 1.6x SDPA where others found 1.0x.

A last section runs the tiny engine's chat with a long system prompt and
prints the time to first token per turn, cold and once the prefix is cached.

Every tensor of 2 MiB or more, the paged pools and the contiguous copies alike, asks the kernel
for transparent huge pages (torch's ``THP_MEM_ALLOC_ENABLE=1``, set before torch is imported, as
torch reads it once, at its first large allocation; ``--small-pages`` sets it to 0 and keeps the
4 KiB default), as a server allocating its KV pool once would. With 4 KiB pages each 16-token
block of 8 KV heads x 128 floats spans 16 pages, and a kernel reading a chunk's blocks head by
head touches 64 pages in every sweep, each page's address looked up as well as its bytes read.
The header says which pages the run asked for and the kernel's policy; each shape's line says
what share of its pool and of its contiguous K/V the kernel backed with huge pages (the ragged
shape's per-sequence copies, most under 2 MiB, are not counted: they stay on 4 KiB pages).

    python benchmarks/paged_attention.py [--reps 7] [--threads 1,2] [--quick] [--no-flex] [--skip-ttft]
        [--skip-prefill] [--shape '8 x 4k'] [--small-pages] [--isolate]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

# set before torch is imported: torch reads THP_MEM_ALLOC_ENABLE once, at its first large allocation
os.environ["THP_MEM_ALLOC_ENABLE"] = (
    "0" if "--small-pages" in sys.argv[1:] else os.environ.get("THP_MEM_ALLOC_ENABLE", "1")
)

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvlab.core.timing import Timing, measure_side_by_side
from kvlab.engine import (
    Engine,
    layer_pool,
    paged_attention,
    paged_prefill,
    plan_decode,
    pool_layout,
    run_chat,
)
from kvlab.engine.attention import (
    COMPILED,
    _batched_decode,
    _chunk_blocks,
    _torch_walk,
    check_decode_args,
    flex_available,
    flex_mode,
    triton_available,
)
from kvlab.engine.chat import context_needed
from kvlab.lessons.attention_demo import CPU_GOAL, goal_verdict

PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}
DEFAULT_THREADS = torch.get_num_threads()


@dataclass(frozen=True)
class Shape:
    name: str
    num_seqs: int
    seq_len: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    lens: tuple[int, ...] = field(default=())  # ragged lengths; empty: every sequence is seq_len long

    def seq_lens(self) -> list[int]:
        return list(self.lens) if self.lens else [self.seq_len] * self.num_seqs

    def kv_bytes(self) -> int:
        per_token = 2 * self.num_kv_heads * self.head_dim * self.dtype.itemsize
        return per_token * sum(self.seq_lens())


def ragged_lens(num_seqs: int, longest: int) -> tuple[int, ...]:
    """Lengths spread from 1 to ``longest`` (deterministic, shuffled so neighbours differ)."""
    step = (longest - 1) / (num_seqs - 1)
    lens = [round(1 + i * step) for i in range(num_seqs)]
    order = torch.randperm(num_seqs, generator=torch.Generator().manual_seed(1)).tolist()
    return tuple(lens[i] for i in order)


CPU_SHAPES = [
    Shape("8 x 512, 32q/8kv x 128, bs 16", 8, 512, 32, 8, 128, 16, torch.float32),
    Shape("32 x 2k, 32q/8kv x 128, bs 16", 32, 2048, 32, 8, 128, 16, torch.float32),
    Shape("8 x 4k, 32q/8kv x 128, bs 16", 8, 4096, 32, 8, 128, 16, torch.float32),
    Shape("32 x 2k, 32q/32kv x 128, bs 16", 32, 2048, 32, 32, 128, 16, torch.float32),
    Shape(
        "32 x ragged 1..4k, 32q/8kv x 128, bs 16",
        32,
        4096,
        32,
        8,
        128,
        16,
        torch.float32,
        ragged_lens(32, 4096),
    ),
]
QUICK_CPU_SHAPES = [
    CPU_SHAPES[0],
    Shape(
        "16 x ragged 1..1k, 32q/8kv x 128, bs 16",
        16,
        1024,
        32,
        8,
        128,
        16,
        torch.float32,
        ragged_lens(16, 1024),
    ),
]
GPU_SHAPES = [
    Shape("32 x 4k, 32q/8kv x 128, bs 16, bf16", 32, 4096, 32, 8, 128, 16, torch.bfloat16),
    Shape("32 x 4k, 32q/8kv x 128, bs 16, fp16", 32, 4096, 32, 8, 128, 16, torch.float16),
    Shape("128 x 4k, 32q/8kv x 128, bs 16, bf16", 128, 4096, 32, 8, 128, 16, torch.bfloat16),
    Shape("8 x 32k, 32q/8kv x 128, bs 16, bf16", 8, 32768, 32, 8, 128, 16, torch.bfloat16),
]


@dataclass
class Case:
    """One shape's paged pool, in ``layer_pool``'s layout for the device, and the same K/V contiguous (padded to the longest sequence).

    On the CPU the pool is head-major (as ``layer_pool`` lays it out there, and vLLM 0.33's
    CPU backend stores its own), and ``token_keys``/``token_values`` are the same pool
    token-major: FlexAttention reads that one, and one row times the kernel on it.
    """

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    tables: torch.Tensor
    seq_lens: torch.Tensor
    keys: torch.Tensor  # [num_seqs, num_kv_heads, longest, head_dim]
    values: torch.Tensor
    token_keys: torch.Tensor
    token_values: torch.Tensor


def build(shape: Shape, device: str, seed: int = 0) -> Case:
    """A paged pool with shuffled blocks and the same K/V contiguous."""
    gen = torch.Generator(device=device).manual_seed(seed)
    lens = shape.seq_lens()
    longest = max(lens)
    blocks_per_seq = -(-longest // shape.block_size)
    num_blocks = shape.num_seqs * blocks_per_seq
    kv_shape = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device).to(shape.dtype)

    key_cache = rand(*kv_shape)
    value_cache = rand(*kv_shape)
    tables = torch.randperm(num_blocks, generator=gen, device=device).view(shape.num_seqs, blocks_per_seq)
    tables = tables.to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    query = rand(shape.num_seqs, shape.num_heads, shape.head_dim)
    idx = tables.long()
    dense = (shape.num_seqs, blocks_per_seq * shape.block_size, shape.num_kv_heads, shape.head_dim)
    keys = key_cache[idx].reshape(dense)[:, :longest].transpose(1, 2).contiguous()
    values = value_cache[idx].reshape(dense)[:, :longest].transpose(1, 2).contiguous()
    pool = layer_pool(*kv_shape, dtype=shape.dtype, device=device)  # head-major on the CPU
    if pool_layout(pool[0]) == pool_layout(key_cache):
        pool = (key_cache, value_cache)
    else:
        pool[0].copy_(key_cache)
        pool[1].copy_(value_cache)
    return Case(query, *pool, tables, seq_lens, keys, values, key_cache, value_cache)


def sdpa_calls(shape: Shape, case: Case) -> dict[str, Callable[[], torch.Tensor]]:
    """The contiguous baselines; each returns [num_seqs, num_heads, head_dim]."""
    group = shape.num_heads // shape.num_kv_heads
    q_gqa = case.query.view(shape.num_seqs, shape.num_heads, 1, shape.head_dim)
    q_grouped = case.query.view(shape.num_seqs, shape.num_kv_heads, group, shape.head_dim)
    out_shape = case.query.shape
    if not shape.lens:
        return {
            "sdpa enable_gqa": lambda: F.scaled_dot_product_attention(
                q_gqa, case.keys, case.values, enable_gqa=group > 1
            ).view(out_shape),
            "sdpa grouped": lambda: F.scaled_dot_product_attention(q_grouped, case.keys, case.values).view(
                out_shape
            ),
        }
    lens = shape.seq_lens()
    # contiguous per sequence (each its own tensor, as a dense cache would hold it)
    keys = [case.keys[s : s + 1, :, :n].contiguous() for s, n in enumerate(lens)]
    values = [case.values[s : s + 1, :, :n].contiguous() for s, n in enumerate(lens)]
    padding = torch.arange(max(lens), device=case.query.device)[None, :] < case.seq_lens[:, None]
    mask = padding.view(shape.num_seqs, 1, 1, -1)

    def per_sequence() -> torch.Tensor:
        return torch.cat(
            [
                F.scaled_dot_product_attention(q_grouped[s : s + 1], keys[s], values[s]).view(
                    1, *out_shape[1:]
                )
                for s in range(shape.num_seqs)
            ]
        )

    return {
        "sdpa per sequence": per_sequence,
        "sdpa padded+mask": lambda: F.scaled_dot_product_attention(
            q_grouped, case.keys, case.values, attn_mask=mask
        ).view(out_shape),
    }


def paged_calls(case: Case, device: str, with_flex: bool) -> dict[str, Callable[[], torch.Tensor]]:
    args = (case.query, case.key_cache, case.value_cache, case.tables, case.seq_lens)
    plan = plan_decode(case.tables, case.seq_lens, case.key_cache)  # checked once for every layer of a step
    calls: dict[str, Callable[[], torch.Tensor]] = {
        "paged torch": lambda: paged_attention(*args, impl="torch"),
        "paged torch, planned": lambda: plan.attend(*args[:3], impl="torch"),
    }
    token_major = case.token_keys is not case.key_cache
    if token_major:  # the same blocks in a token-major pool: what the layout is worth
        calls["planned, token-major"] = lambda: plan.attend(
            case.query, case.token_keys, case.token_values, impl="torch"
        )
    if device == "cpu":  # impl="torch"'s per-sequence walk (what small calls run) and the batched tiles
        shape, scale = check_decode_args(*args, None)
        calls["paged torch walk"] = lambda: _torch_walk(*args, scale, shape)
        calls["paged torch tiles"] = lambda: _batched_decode(*args, scale, shape)
    if device == "cuda" and triton_available():
        calls["paged triton"] = lambda: paged_attention(*args, impl="triton")
    if with_flex and flex_available():  # FlexAttention reads a token-major pool
        flex_args = (case.query, case.token_keys, case.token_values, case.tables, case.seq_lens)
        calls["paged flex"] = lambda: paged_attention(*flex_args, impl="flex")
    return calls


def time_gpu(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds per call from CUDA events, ``reps`` x 10 launches after a warm-up."""
    out = {}
    for name, fn in calls.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 10 / 1e3)
        samples.sort()
        out[name] = samples[len(samples) // 2]
    return out


def check_agreement(outputs: dict[str, torch.Tensor], reference: torch.Tensor, dtype: torch.dtype) -> None:
    tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    for name, out in outputs.items():
        err = (out.float() - reference.float()).abs().max().item()
        if err > tol:
            raise SystemExit(f"{name} disagrees with SDPA by {err:.2e} (> {tol}); not timing a wrong answer")


COPY_BYTES = 2 * (256 << 20)  # a copy of 256 MiB reads 256 MiB and writes as much


def copy_bandwidth(reps: int) -> Timing:
    """A copy of a 256 MiB float32 tensor: this machine's memory bandwidth, measured in the same run."""
    src = torch.randn(64 << 20)
    dst = torch.empty_like(src)
    return measure_side_by_side({"copy": lambda: dst.copy_(src)}, warmup=1, repeats=reps)["copy"]


def measure_once(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    """One call's result and its wall seconds (a first call: compiling included)."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6


def bench_cpu_shape(shape: Shape, reps: int, with_flex: bool, copy: Timing) -> tuple[float, float, float]:
    """Time one CPU shape; return a planned layer's ratio to the faster SDPA form, with its spread (``report_step``)."""
    case = build(shape, "cpu")
    sdpa = sdpa_calls(shape, case)
    paged = paged_calls(case, "cpu", with_flex)
    ref = sdpa[next(iter(sdpa))]()
    first_calls = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.compile's notes on the first flex call
        outputs = {}
        for name, fn in {**sdpa, **paged}.items():
            outputs[name], first_calls[name] = measure_once(fn)
        check_agreement(outputs, ref, shape.dtype)
    times = measure_side_by_side({**sdpa, **paged}, warmup=1, repeats=reps)
    base_name = min(sdpa, key=lambda n: times[n].median_ms)
    base = times[base_name]
    cpu_base = min(times[n].cpu_median_ms for n in sdpa)
    kv = shape.kv_bytes()
    copy_gbps = gbps(COPY_BYTES, copy.cpu_median_ms)  # CPU time: steadier than wall on a shared machine
    flex_note = f", flex {flex_mode(shape.dtype, shape.block_size)}" if "paged flex" in paged else ""
    torch_mode = (
        "compiled"
        if (shape.dtype, shape.block_size, shape.num_kv_heads) in {k[:3] for k in COMPILED.kinds}
        else f"walk ({COMPILED.failure or 'below the size at which it compiles'})"
    )
    flex_note += f"; paged torch = {torch_mode}, its first call {first_calls['paged torch']:.2f} s"
    print(
        f"\n{shape.name}  (cpu, {torch.get_num_threads()} thread(s), KV {kv / 1e6:.0f} MB, baseline = {base_name}"
        f"{flex_note}; the pool {pool_layout(case.key_cache)}; on huge pages: the pool "
        f"{huge_page_share([case.key_cache, case.value_cache])}, "
        f"the contiguous K/V {huge_page_share([case.keys, case.values])})"
    )
    print(
        f"  {'implementation':<22}{'median ms':>10}{'IQR ms':>13}{'vs SDPA':>9}{'cpu ms':>9}"
        f"{'cpu vs SDPA':>12}{'GB/s':>7}{'cpu GB/s':>9}{'of copy':>9}"
    )
    for name, t in times.items():
        print(
            f"  {name:<22}{t.median_ms:>8.2f}{f'{t.q1_ms:.2f}-{t.q3_ms:.2f}':>15}{t.median_ms / base.median_ms:>8.2f}x"
            f"{t.cpu_median_ms:>9.2f}{t.cpu_median_ms / cpu_base:>11.2f}x{gbps(kv, t.median_ms):>7.1f}"
            f"{gbps(kv, t.cpu_median_ms):>9.1f}{gbps(kv, t.cpu_median_ms) / copy_gbps:>8.0%}"
        )
    planned, base = goal_timings(shape, case, base_name, reps)
    return report_step(case, planned, base)


COLD_BYTES = 256 << 20  # KV read between two reads of one layer's: several times a CPU's last-level cache
GOAL_SECONDS = 1.0  # about how long the goal pair is timed for, repeats permitting
MAX_LAYERS = 8
MAX_GOAL_REPEATS = 101


def layer_copies(case: Case, count: int) -> list[Case]:
    """``count`` layers of one step: the same tables and query, each layer its own copy of the pool and the contiguous K/V."""
    copies = [case]
    for _ in range(count - 1):
        kc, vc = layer_pool(*case.key_cache.shape, dtype=case.key_cache.dtype, device=case.key_cache.device)
        kc.copy_(case.key_cache)
        vc.copy_(case.value_cache)
        copies.append(
            replace(case, key_cache=kc, value_cache=vc, keys=case.keys.clone(), values=case.values.clone())
        )
    return copies


def goal_timings(shape: Shape, case: Case, base_name: str, reps: int) -> tuple[Timing, Timing]:
    """A planned layer and the faster SDPA form, side by side alone, each call reading the next layer's KV.

    The goal compares these two as a decode step runs them: layer after layer, each
    reading its own KV, so by the time a layer's KV is read again the others' (``COLD_BYTES``
    at least, up to ``MAX_LAYERS`` copies) have passed through the cache. In the table above,
    a small shape's KV (34 MB at 8 x 512, about this machine's L3) is found in cache or not
    depending on which of the seven implementations ran just before, the walk's and the
    tiles' gather copies included; here neither form inherits another's. Repeats: as many as
    fit in about ``GOAL_SECONDS``, at least ``reps``.
    """
    layers = layer_copies(case, max(1, min(MAX_LAYERS, -(-COLD_BYTES // shape.kv_bytes()))))
    plan = plan_decode(case.tables, case.seq_lens, case.key_cache)
    planned = [lambda c=c: plan.attend(c.query, c.key_cache, c.value_cache, impl="torch") for c in layers]
    sdpa = [sdpa_calls(shape, c)[base_name] for c in layers]
    turn = {"planned": 0, "sdpa": 0}

    def next_layer(name: str, calls: list[Callable[[], torch.Tensor]]) -> torch.Tensor:
        turn[name] = (turn[name] + 1) % len(calls)
        return calls[turn[name]]()

    pair = {"planned": lambda: next_layer("planned", planned), "sdpa": lambda: next_layer("sdpa", sdpa)}
    _, first = measure_once(pair["sdpa"])
    repeats = max(reps, min(MAX_GOAL_REPEATS, round(GOAL_SECONDS / max(2 * first, 1e-3))))
    times = measure_side_by_side(pair, warmup=len(layers), repeats=repeats)
    kv = shape.kv_bytes()
    print(
        f"  the goal pair, alone: planned vs {base_name}, {repeats} rounds, each call the next of {len(layers)} "
        f"layers' KV ({len(layers) * kv / 1e6:.0f} MB): planned {times['planned']} "
        f"({gbps(kv, times['planned'].median_ms):.1f} GB/s); {base_name} {times['sdpa']} "
        f"({gbps(kv, times['sdpa'].median_ms):.1f} GB/s)"
    )
    return times["planned"], times["sdpa"]


STEP_LAYERS = 32  # a Llama-7B-sized model: every layer of a step attends through the same tables


def report_step(case: Case, planned: Timing, base: Timing) -> tuple[float, float, float]:
    """A decode step's attention per layer when ``STEP_LAYERS`` layers share one plan, as vLLM and FlashInfer share theirs.

    Returns the per-layer ratio to SDPA round by round (``Timing.ratio_by_round``, as notebook
    14's goal line reads it): each planned sample plus the plan's median share, over the SDPA
    call of the same round; its median, first and third quartile.
    """
    shape, _ = check_decode_args(
        case.query, case.key_cache, case.value_cache, case.tables, case.seq_lens, None
    )
    chunk_blocks = _chunk_blocks(shape, case.key_cache.element_size())

    def make_plan() -> None:  # the checks, and the chunk tables the step's first attend cuts for every layer
        plan_decode(case.tables, case.seq_lens, case.key_cache)._chunk_tables(chunk_blocks)

    plan = measure_side_by_side({"plan": make_plan}, warmup=1, repeats=7)["plan"]
    share = plan.median_ms / STEP_LAYERS
    per_layer = Timing(tuple(w + share for w in planned.wall_ms), tuple(c + share for c in planned.cpu_ms))
    low, ratio, high = per_layer.ratio_by_round(base)
    across = per_layer.ratio_spread(base)
    print(
        f"  plan_decode + chunk tables (once a step) {plan.median_ms:.3f} ms (IQR {plan.q1_ms:.3f}-{plan.q3_ms:.3f}); "
        f"a {STEP_LAYERS}-layer step, per layer: attend + plan/{STEP_LAYERS} = {per_layer.median_ms:.2f} ms = "
        f"{per_layer.ratio_to(base):.2f}x SDPA (wall medians; {across[0]:.2f}x to {across[1]:.2f}x across the "
        f"IQRs); round by round {ratio:.2f}x, the middle half {low:.2f}x to {high:.2f}x"
    )
    return ratio, low, high


def report_goal(rows: list[tuple[int, str, tuple[float, float, float]]]) -> None:
    """Every CPU shape and thread count against ``CPU_GOAL``, in one table at the end of the run."""
    print(
        f"\ngoal: a planned layer (per layer of a {STEP_LAYERS}-layer step) at most {CPU_GOAL}x the faster SDPA form, "
        "wall time, from each shape's goal pair (each call the next layer's KV), read round by round (a planned "
        "call over the SDPA call of the same round); met when the rounds' third quartile is at most the goal, "
        "not met when their first is above it, undecided otherwise (as notebook 14's goal line)"
    )
    print(f"  {'shape':<44}{'threads':>8}{'median':>8}{'middle half':>20}  verdict")
    counts: dict[str, int] = {"met": 0, "undecided": 0, "not met": 0}
    for threads, name, (ratio, low, high) in rows:
        verdict = goal_verdict(low, high)
        counts[verdict] += 1
        side = (
            f" (median {'at or under' if ratio <= CPU_GOAL else 'over'} {CPU_GOAL}x)"
            if verdict == "undecided"
            else ""
        )
        print(f"  {name:<44}{threads:>8}{ratio:>7.2f}x{f'{low:.3f}-{high:.3f}x':>20}  {verdict}{side}")
    print(f"  of {len(rows)}: " + ", ".join(f"{n} {v}" for v, n in counts.items()))


def bench_gpu_shape(shape: Shape, reps: int, peak_gbps: float | None) -> None:
    case = build(shape, "cuda")
    sdpa = sdpa_calls(shape, case)
    paged = paged_calls(case, "cuda", with_flex=False)
    ref = sdpa["sdpa grouped"]()
    check_agreement({name: fn() for name, fn in paged.items()}, ref, shape.dtype)
    times = time_gpu({**sdpa, **paged}, reps)
    base_name = min(sdpa, key=lambda n: times[n])
    gb = shape.kv_bytes() / 1e9
    print(
        f"\n{shape.name}  (cuda, {str(shape.dtype).replace('torch.', '')}, KV {gb * 1e3:.0f} MB, baseline = {base_name})"
    )
    print(f"  {'implementation':<18}{'ms/call':>10}{'vs SDPA':>9}{'GB/s':>9}{'% peak':>8}")
    for name, sec in times.items():
        line = f"  {name:<18}{sec * 1e3:>10.3f}{sec / times[base_name]:>8.2f}x{gb / sec:>9.1f}"
        line += f"{100 * gb / sec / peak_gbps:>7.0f}%" if peak_gbps else ""
        print(line)


def bench_prefill(tokens: int, reps: int) -> None:
    """paged_prefill of ``tokens`` new tokens (writes K/V through the slot mapping, then causal attention)
    against SDPA causal on the same K/V contiguous."""
    heads, kv_heads, dim, bs = 32, 8, 128, 16
    gen = torch.Generator().manual_seed(2)
    num_blocks = -(-tokens // bs)
    query = torch.randn(tokens, heads, dim, generator=gen)
    key = torch.randn(tokens, kv_heads, dim, generator=gen)
    value = torch.randn(tokens, kv_heads, dim, generator=gen)
    kc = torch.zeros(num_blocks, bs, kv_heads, dim)
    vc = torch.zeros_like(kc)
    tables = torch.randperm(num_blocks, generator=gen).view(1, -1).to(torch.int32)
    lens = torch.tensor([tokens])
    q4, k4, v4 = (x.transpose(0, 1)[None].contiguous() for x in (query, key, value))
    k_rep, v_rep = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k4, v4))
    calls = {
        "sdpa causal gqa": lambda: F.scaled_dot_product_attention(
            q4, k4, v4, is_causal=True, enable_gqa=True
        ),
        "sdpa causal MHA": lambda: F.scaled_dot_product_attention(q4, k_rep, v_rep, is_causal=True),
        "paged_prefill": lambda: paged_prefill(query, key, value, kc, vc, tables, lens, lens, impl="torch"),
    }
    ref = calls["sdpa causal gqa"]()[0].transpose(0, 1)
    check_agreement({"paged_prefill": calls["paged_prefill"]()}, ref, torch.float32)
    times = measure_side_by_side(calls, warmup=1, repeats=reps)
    base = min(times[n].median_ms for n in calls if n.startswith("sdpa"))
    cpu_base = min(times[n].cpu_median_ms for n in calls if n.startswith("sdpa"))
    print(
        f"\nPrefill, {tokens} new tokens, {heads}q/{kv_heads}kv x {dim}, bs {bs} ({torch.get_num_threads()} thread(s))"
    )
    for name, t in times.items():
        print(
            f"  {name:<18}{t}   vs SDPA {t.median_ms / base:.2f}x wall, {t.cpu_median_ms / cpu_base:.2f}x cpu"
        )


def bench_ttft(system_tokens: int, turns: int) -> None:
    print(
        f"\nTime to first token, tiny engine, {system_tokens}-token system prompt, {turns} turns "
        f"(threads={torch.get_num_threads()})"
    )
    for cache in ("slot", "blocks", "off"):
        engine = Engine(cache=cache, block_size=16, max_model_len=context_needed(turns, 8, system_tokens))
        rows = run_chat(engine, turns=turns, max_tokens=8, system_tokens=system_tokens)
        ttft = [r.ttft_ms for r in rows]
        later = sorted(ttft[1:])
        ratio = ttft[0] / later[len(later) // 2]
        cells = "  ".join(f"{r.ttft_ms:8.1f} ms (cache_n {r.cache_n:4d})" for r in rows)
        print(f"  {cache:<7}{cells}   turn 1 / median later = {ratio:.1f}x")


def thread_counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def pages_line() -> str:
    """Which pages this run asked for, and what the kernel does with such a request."""
    policy = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    kernel = policy.read_text().strip() if policy.exists() else "unknown here"
    if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1":
        asked = "huge pages asked for every tensor of 2 MiB or more (THP_MEM_ALLOC_ENABLE=1)"
    else:
        asked = "4 KiB pages (--small-pages, or THP_MEM_ALLOC_ENABLE other than 1)"
    return f"pages: {asked}; the kernel's transparent huge page policy: {kernel}"


def huge_page_share(tensors: list[torch.Tensor]) -> str:
    """The share of these tensors' bytes the kernel backs with huge pages ('?' where /proc/self/smaps does not say).

    Read from each memory mapping's AnonHugePages, spread evenly over the mapping. A tensor that
    asked for huge pages is a mapping of its own (the request splits it off); on 4 KiB pages
    neighbouring allocations can share one mapping, so the share is theirs together.
    """
    try:
        smaps = Path("/proc/self/smaps").read_text()
    except OSError:
        return "?"
    if "AnonHugePages:" not in smaps:  # a kernel that does not report it
        return "?"
    mappings, current = [], None
    for line in smaps.splitlines():
        if not line.strip():
            continue
        head = line.split(maxsplit=1)[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            current = [start, end, 0]
            mappings.append(current)
        elif head == "AnonHugePages:" and current is not None:
            current[2] = int(line.split()[1]) * 1024
    huge = total = 0
    for t in tensors:
        lo = t.untyped_storage().data_ptr()
        hi = lo + t.untyped_storage().nbytes()
        total += hi - lo
        for start, end, huge_bytes in mappings:
            overlap = min(hi, end) - max(lo, start)
            if overlap > 0:
                huge += huge_bytes * overlap / (end - start)
    return f"{huge / total:.0%}" if total else "?"


CHILD_ROW = "goal row: "  # how a child process hands its shape's goal row back


def run_isolated(shape: Shape, threads: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """Time one shape at one thread count in a fresh process (this script, ``--only-shape``), echoing its report.

    A fresh process meets memory as a student's fresh run does: no earlier shape has fragmented
    it, so the pool and the contiguous copy get huge pages alike. The child inherits this run's
    page setting (``THP_MEM_ALLOC_ENABLE``, already in the environment) and compiles from the
    inductor cache the parent's first child filled.
    """
    command = [sys.executable, __file__, "--only-shape", shape.name, "--threads", str(threads)]
    command += ["--reps", str(args.reps), "--skip-ttft", "--skip-prefill"]
    command += ["--no-flex"] if args.no_flex else []
    command += ["--quick"] if args.quick else []
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    row = None
    for line in done.stdout.splitlines():
        if line.startswith(CHILD_ROW):
            row = tuple(json.loads(line[len(CHILD_ROW) :]))
        elif not line.startswith(("torch ", "pages: ")):
            print(line)
    if done.returncode != 0 or row is None:
        raise SystemExit(
            f"the child timing {shape.name!r} at {threads} thread(s) failed:\n{done.stderr[-2000:]}"
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument(
        "--threads",
        type=thread_counts,
        default=sorted({1, DEFAULT_THREADS}),
        help=f"comma-separated torch intra-op thread counts for the CPU shapes (default 1,{DEFAULT_THREADS})",
    )
    parser.add_argument("--quick", action="store_true", help="small shapes only (a smoke run)")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its first call compiles)")
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--gpu-only", action="store_true", help="skip the CPU sections")
    parser.add_argument(
        "--peak-gbps", type=float, default=None, help="the GPU's peak memory bandwidth in GB/s"
    )
    parser.add_argument("--system-tokens", type=int, default=2000)
    parser.add_argument(
        "--shape", default="", help="time only the CPU shapes whose name contains this text (e.g. '8 x 4k')"
    )
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="time each CPU shape and thread count in a fresh process of its own (by default all run in this one)",
    )
    parser.add_argument("--only-shape", default="", help=argparse.SUPPRESS)  # a child: this exact shape name
    parser.add_argument(
        "--small-pages",
        action="store_true",
        help="keep tensors on 4 KiB pages (by default every tensor of 2 MiB or more asks for huge pages)",
    )
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, default {DEFAULT_THREADS} CPU thread(s), cuda={torch.cuda.is_available()}"
    )
    print(pages_line())
    if not args.gpu_only:
        goal_rows = []
        for threads in args.threads:
            torch.set_num_threads(threads)
            copy = copy_bandwidth(args.reps)
            if not args.only_shape:
                print(
                    f"\n== {threads} thread(s): copy of 256 MiB {copy}: {gbps(COPY_BYTES, copy.median_ms):.1f} "
                    f"GB/s, {gbps(COPY_BYTES, copy.cpu_median_ms):.1f} GB/s of CPU time (read + write)"
                )
            for shape in QUICK_CPU_SHAPES if args.quick else CPU_SHAPES:
                if args.shape not in shape.name or args.only_shape not in ("", shape.name):
                    continue
                if args.isolate and not args.only_shape:
                    row = run_isolated(shape, threads, args)
                else:
                    row = bench_cpu_shape(shape, args.reps, not args.no_flex, copy)
                    if args.only_shape:
                        print(f"{CHILD_ROW}{json.dumps(row)}")
                goal_rows.append((threads, shape.name, row))
            if not args.skip_prefill and not args.only_shape:
                bench_prefill(512 if args.quick else 2048, args.reps)
        if args.only_shape:  # a child: its row went to the parent, which reports the goal
            return
        torch.set_num_threads(DEFAULT_THREADS)
        if goal_rows:
            report_goal(goal_rows)
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in name), None)
        print(f"\nGPU: {name}, peak {peak or '?'} GB/s")
        for shape in GPU_SHAPES[:1] if args.quick else GPU_SHAPES:
            bench_gpu_shape(shape, args.reps, peak)
    if not args.skip_ttft:
        bench_ttft(300 if args.quick else args.system_tokens, 3 if args.quick else 4)


if __name__ == "__main__":
    main()
