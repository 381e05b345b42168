"""Paged decode attention against torch's SDPA on the same keys and values laid out contiguously.

For each shape the script builds one paged KV pool (16-token blocks handed out
in a shuffled order, as a long-running server's free list would) and the same
keys and values as one contiguous ``[num_seqs, num_kv_heads, seq_len, head_dim]``
tensor, checks that every implementation agrees with SDPA, then times them in
the same run, round-robin, and prints per implementation: time per call, the
ratio to SDPA, and the GB/s of K and V read (each cached byte counted once).

SDPA is timed two ways and the faster is the baseline: the usual
``enable_gqa=True`` call, and the grouped form that folds each KV head's query
heads into a short query sequence (exact for decode, often faster on a CPU).

CPU timings use one intra-op thread by default (``--threads``) and report the
best of ``--reps`` rounds in wall time and in this process's CPU time: on a
shared machine the CPU time is the steadier number. On a GPU, the Triton
kernel is timed with CUDA events and its bandwidth is compared with the card's
peak (H200: 4.8 TB/s; ``--peak-gbps`` for another card).

A second section runs the tiny engine's chat with a long system prompt and
prints the time to first token per turn, cold and once the prefix is cached.

    python benchmarks/paged_attention.py [--reps 5] [--threads 1] [--quick] [--skip-ttft]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlab.engine import Engine, paged_attention, run_chat
from kvlab.engine.attention import triton_available
from kvlab.engine.chat import context_needed

PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}


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

    def kv_bytes(self) -> int:
        return 2 * self.num_seqs * self.seq_len * self.num_kv_heads * self.head_dim * self.dtype.itemsize


CPU_SHAPES = [
    Shape("32 x 2k, 32q/8kv x 128, bs 16", 32, 2048, 32, 8, 128, 16, torch.float32),
    Shape("8 x 4k, 32q/8kv x 128, bs 16", 8, 4096, 32, 8, 128, 16, torch.float32),
    Shape("32 x 2k, 32q/32kv x 128, bs 16", 32, 2048, 32, 32, 128, 16, torch.float32),
]
QUICK_CPU_SHAPES = [Shape("8 x 512, 32q/8kv x 128, bs 16", 8, 512, 32, 8, 128, 16, torch.float32)]
GPU_SHAPES = [
    Shape("32 x 4k, 32q/8kv x 128, bs 16, bf16", 32, 4096, 32, 8, 128, 16, torch.bfloat16),
    Shape("32 x 4k, 32q/8kv x 128, bs 16, fp16", 32, 4096, 32, 8, 128, 16, torch.float16),
    Shape("128 x 4k, 32q/8kv x 128, bs 16, bf16", 128, 4096, 32, 8, 128, 16, torch.bfloat16),
    Shape("8 x 32k, 32q/8kv x 128, bs 16, bf16", 8, 32768, 32, 8, 128, 16, torch.bfloat16),
]


def build(shape: Shape, device: str, seed: int = 0):
    """A paged pool with shuffled blocks and the same K/V contiguous; returns everything both sides need."""
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = shape.seq_len // shape.block_size
    num_blocks = shape.num_seqs * blocks_per_seq
    kv_shape = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device).to(shape.dtype)

    key_cache = rand(*kv_shape)
    value_cache = rand(*kv_shape)
    tables = torch.randperm(num_blocks, generator=gen, device=device).view(shape.num_seqs, blocks_per_seq)
    tables = tables.to(torch.int32)
    seq_lens = torch.full((shape.num_seqs,), shape.seq_len, dtype=torch.int32, device=device)
    query = rand(shape.num_seqs, shape.num_heads, shape.head_dim)
    idx = tables.long()
    dense = (shape.num_seqs, shape.seq_len, shape.num_kv_heads, shape.head_dim)
    keys = key_cache[idx].reshape(dense).transpose(1, 2).contiguous()
    values = value_cache[idx].reshape(dense).transpose(1, 2).contiguous()
    return query, key_cache, value_cache, tables, seq_lens, keys, values


def sdpa_calls(shape: Shape, query, keys, values) -> dict[str, Callable[[], torch.Tensor]]:
    group = shape.num_heads // shape.num_kv_heads
    q_gqa = query.view(shape.num_seqs, shape.num_heads, 1, shape.head_dim)
    q_grouped = query.view(shape.num_seqs, shape.num_kv_heads, group, shape.head_dim)
    return {
        "sdpa enable_gqa": lambda: F.scaled_dot_product_attention(q_gqa, keys, values, enable_gqa=group > 1),
        "sdpa grouped": lambda: F.scaled_dot_product_attention(q_grouped, keys, values),
    }


def time_cpu(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, tuple[float, float]]:
    """Best (wall, cpu) seconds per call over ``reps`` round-robin rounds, after one warm-up each."""
    for fn in calls.values():
        fn()
    best = {name: (float("inf"), float("inf")) for name in calls}
    for _ in range(reps):
        for name, fn in calls.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def time_gpu(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, tuple[float, float]]:
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
        out[name] = (samples[len(samples) // 2], float("nan"))
    return out


def check_agreement(outputs: dict[str, torch.Tensor], reference: torch.Tensor, dtype: torch.dtype) -> None:
    tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    for name, out in outputs.items():
        err = (out.float() - reference.float()).abs().max().item()
        if err > tol:
            raise SystemExit(f"{name} disagrees with SDPA by {err:.2e} (> {tol}); not timing a wrong answer")


def bench_shape(shape: Shape, device: str, reps: int, peak_gbps: float | None) -> None:
    query, key_cache, value_cache, tables, seq_lens, keys, values = build(shape, device)
    sdpa = sdpa_calls(shape, query, keys, values)
    impls = ["torch"] + (["triton"] if device == "cuda" and triton_available() else [])
    paged = {
        f"paged {impl}": (
            lambda impl=impl: paged_attention(query, key_cache, value_cache, tables, seq_lens, impl=impl)
        )
        for impl in impls
    }
    ref = sdpa["sdpa grouped"]().reshape(query.shape)
    check_agreement({name: fn() for name, fn in paged.items()}, ref, shape.dtype)
    timer = time_gpu if device == "cuda" else time_cpu
    times = timer({**sdpa, **paged}, reps)
    steadier = 0 if device == "cuda" else 1  # on a shared CPU, this process's CPU time
    base_name = min(sdpa, key=lambda n: times[n][steadier])
    base_wall, base_cpu = times[base_name]
    gb = shape.kv_bytes() / 1e9
    print(
        f"\n{shape.name}  ({device}, {str(shape.dtype).replace('torch.', '')}, KV {gb * 1e3:.0f} MB, "
        f"baseline = {base_name})"
    )
    head = f"  {'implementation':<18}{'ms/call':>10}{'vs SDPA':>9}{'GB/s':>9}"
    head += f"{'% peak':>8}" if peak_gbps else f"{'cpu ms':>10}{'cpu vs SDPA':>13}"
    print(head)
    for name, (wall, cpu) in times.items():
        line = f"  {name:<18}{wall * 1e3:>10.2f}{wall / base_wall:>8.2f}x{gb / wall:>9.1f}"
        if peak_gbps:
            line += f"{100 * gb / wall / peak_gbps:>7.0f}%"
        else:
            line += f"{cpu * 1e3:>10.2f}{cpu / base_cpu:>12.2f}x"
        print(line)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads on the CPU (default 1)"
    )
    parser.add_argument("--quick", action="store_true", help="small shapes only (a smoke run)")
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument("--gpu-only", action="store_true", help="skip the CPU shapes")
    parser.add_argument(
        "--peak-gbps", type=float, default=None, help="the GPU's peak memory bandwidth in GB/s"
    )
    parser.add_argument("--system-tokens", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), cuda={torch.cuda.is_available()}"
    )
    if not args.gpu_only:
        for shape in QUICK_CPU_SHAPES if args.quick else CPU_SHAPES:
            bench_shape(shape, "cpu", args.reps, None)
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in name), None)
        print(f"\nGPU: {name}, peak {peak or '?'} GB/s")
        for shape in GPU_SHAPES[:1] if args.quick else GPU_SHAPES:
            bench_shape(shape, "cuda", args.reps, peak)
    if not args.skip_ttft:
        bench_ttft(300 if args.quick else args.system_tokens, 3 if args.quick else 4)


if __name__ == "__main__":
    main()
