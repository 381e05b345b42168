"""Notebook 14's experiments on real tensors, so its cells are a few calls whose output is the point.

Each helper builds the tensors an experiment needs with kvlab's own parts (``BlockPool`` hands out
the block tables, ``write_kv_cache`` stores keys and values through the slot mapping), runs it, and
returns what the notebook prints. Every time comes from ``kvlab.core.timing`` (median, IQR, CPU
time); every sentence a helper prints about a time is decided from those numbers in the same run
(``clearly_faster_than``, ``ratio_spread``), never typed in.

Kept as one module (over 500 lines): it is one notebook's nine experiments, and they share the
batch builder (``paged_batch``), the verdicts read from the spreads (``_verdict``) and the choice
of clock (``clock_for``), which would otherwise be imported back and forth between modules.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from kvlab.core.chat_format import Message, render
from kvlab.core.timing import Timing, measure_side_by_side
from kvlab.engine import (
    Engine,
    ModelConfig,
    layer_pool,
    paged_attention,
    pool_layout,
    slot_mapping,
    write_kv_cache,
)
from kvlab.engine.chat import ChatTurnResult, context_needed, system_prompt, user_message
from kvlab.engine.engine import GenerationResult
from kvlab.errors import (
    LIMITS,
    InvalidArgumentError,
    brief,
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
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _device(device: object) -> str:
    """``device`` if it is one of ``DEVICES`` and present here: "cuda" only where torch sees a GPU."""
    device = check_choice("device", device, DEVICES)
    if device == "cuda" and not torch.cuda.is_available():
        raise InvalidArgumentError(
            "device='cuda' but torch sees no CUDA GPU on this machine: use device='cpu' "
            "(or a machine with a GPU and a CUDA build of torch)"
        )
    return device


def _dtype(dtype: object) -> torch.dtype:
    """One of ``DTYPES``, compared by identity (a torch dtype is a singleton; a lookalike is refused)."""
    for known in DTYPES:
        if dtype is known:
            return known
    raise InvalidArgumentError(
        f"dtype must be one of torch.float32, float16, bfloat16, float64, got {brief(dtype)}"
    )


def _check_bytes(what: str, nbytes: int, fix: str) -> None:
    """Refuse, before anything is allocated, real tensors past ``LIMITS.memory_mib`` together."""
    if nbytes > LIMITS.memory_mib * MiB:
        raise InvalidArgumentError(
            f"{what} would take {nbytes / MiB:,.0f} MiB of tensors, more than {LIMITS.memory_mib:,} MiB "
            f"(kvlab's limit LIMITS.memory_mib): {fix}, or for a deliberately larger run use "
            "kvlab.errors.raised_limits(memory_mib=...)"
        )


def _batch_bytes(
    lengths: Sequence[int], block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes ``paged_batch`` allocates for these sequences: the pool's K and V, each sequence's own
    K and V (the contiguous copy the oracle reads) and one sequence's float32 draws on the way."""
    per_token = 2 * num_kv_heads * head_dim  # K and V
    slots = sum(-(-n // block_size) for n in lengths) * block_size
    item = torch.empty((), dtype=dtype).element_size()
    return per_token * ((slots + sum(lengths)) * item + max(lengths) * 4)


def sync_for(device: str) -> Callable[[], None] | None:
    """What the timings call around each timed call: GPU work is asynchronous, so wait for it."""
    device = check_choice("device", device, DEVICES)
    return torch.cuda.synchronize if device == "cuda" else None


def _lengths(lengths: object) -> list[int]:
    """Sequence lengths of one decode batch: 1 to ``LIMITS.slots`` sequences (parallel requests)."""
    items = [
        check_size("a sequence length", n, "tokens", minimum=1)
        for n in check_items("lengths", lengths, "slots", what="a list of sequence lengths")
    ]
    if not items:
        raise InvalidArgumentError("give at least one sequence length")
    return items


def _impls(impls: object, choices: tuple[str, ...]) -> list[str]:
    """Implementations to run, each once: at most one of each of ``choices``."""
    out = [
        check_choice("an impl", i, choices) for i in check_items("impls", impls, what="a list of impl names")
    ]
    if len(set(out)) != len(out):
        raise InvalidArgumentError(f"impls must name each implementation once, got {out[: len(choices) + 1]}")
    return out


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

    def token_major(self) -> PagedBatch:
        """The same batch in a token-major pool (a copy where this one is head-major): what ``impl="flex"`` reads."""
        if pool_layout(self.key_cache) == "token-major":
            return self
        return replace(self, key_cache=self.key_cache.contiguous(), value_cache=self.value_cache.contiguous())

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
    layout: str = "auto",
) -> PagedBatch:
    """Random K/V per sequence, written into a pool through the block tables kvlab's ``BlockPool`` hands out.

    ``shuffled`` hands blocks out from a shuffled free list, so no table is in order; with
    ``shuffled=False`` the same keys and values (same seed) sit in blocks in order, sequence after
    sequence: the pool is then the contiguous layout, still read through the tables. ``layout``
    is the pool's memory layout (``kvlab.engine.layer_pool``: "auto" is head-major on the CPU).
    """
    lengths = _lengths(lengths)
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    device = _device(device)
    check_bool("shuffled", shuffled)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1, maximum=256)
    num_heads = check_int("num_heads", num_heads, minimum=num_kv_heads, maximum=1024)
    head_dim = check_int("head_dim", head_dim, minimum=1, maximum=1024)
    if num_heads % num_kv_heads:
        raise InvalidArgumentError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    seed = check_int("seed", seed, minimum=0, maximum=2**31 - 1)
    dtype = _dtype(dtype)
    _check_bytes(
        "this batch's K and V (in the pool and per sequence)",
        _batch_bytes(lengths, block_size, num_kv_heads, head_dim, dtype),
        "use fewer or shorter sequences, fewer KV heads or a smaller head_dim",
    )
    cpu = torch.Generator().manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lengths)
    order = torch.randperm(num_blocks, generator=cpu).tolist() if shuffled else list(range(num_blocks))
    pool = BlockPool(num_blocks, block_size, free_order=order)
    key_cache, value_cache = layer_pool(
        num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device, layout=layout
    )
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
    if not isinstance(query, torch.Tensor) or query.dim() != 3:
        raise InvalidArgumentError(
            f"query must be a [num_seqs, num_heads, head_dim] tensor, got {type(query).__name__}"
        )
    keys, values = check_items("keys", keys), check_items("values", values)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in keys + values):
        raise InvalidArgumentError(
            "keys and values must be [seq_len, num_kv_heads, head_dim] tensors, one per sequence"
        )
    if not len(keys) == len(values) == query.shape[0]:
        raise InvalidArgumentError(
            f"give one key and one value tensor per sequence: {query.shape[0]} queries, "
            f"{len(keys)} keys, {len(values)} values"
        )
    _check_dense_shapes(query, keys, values)
    rows = [
        F.scaled_dot_product_attention(
            q[:, None].double(), k.transpose(0, 1).double(), v.transpose(0, 1).double(), enable_gqa=True
        )[:, 0]
        for q, k, v in zip(query, keys, values, strict=True)
    ]
    return torch.stack(rows)


def _check_dense_shapes(query: torch.Tensor, keys: list, values: list) -> None:
    """Every sequence's K and V alike, ``[seq_len >= 1, num_kv_heads, head_dim]``, grouping the query's heads, on its device."""
    heads, dim = query.shape[1], query.shape[2]
    if not query.is_floating_point():
        raise InvalidArgumentError(f"query must hold floating-point numbers, got {query.dtype}")
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        if k.shape != v.shape or k.shape[0] < 1 or k.shape[2] != dim or k.shape[1] < 1 or heads % k.shape[1]:
            raise InvalidArgumentError(
                f"sequence {i}: keys {tuple(k.shape)} and values {tuple(v.shape)} must both be "
                f"[seq_len >= 1, num_kv_heads, {dim}] with num_kv_heads dividing the query's {heads} heads"
            )
        if (
            k.device != query.device
            or v.device != query.device
            or not k.is_floating_point()
            or not v.is_floating_point()
        ):
            raise InvalidArgumentError(
                f"sequence {i}: keys and values must be floating-point tensors on the query's device ({query.device})"
            )


def error_table(lengths: Sequence[int], impls: Sequence[str], device: str = "cpu") -> list[str]:
    """Max abs error of every implementation against float64 dense attention, per block size and dtype."""
    impls = _impls(impls, ("reference", "torch", "triton", "flex"))
    lengths = _lengths(lengths)
    device = _device(device)
    lines = [
        f"max abs error against float64 dense attention, {len(lengths)} sequence{'s' * (len(lengths) != 1)} of {lengths} tokens",
        f"{'block size':>10}  {'dtype':>8}  " + "  ".join(f"{impl:>10}" for impl in impls),
    ]
    for block_size in (1, 16, 64):
        for dtype in (torch.float32, torch.float16):
            batch = paged_batch(lengths, block_size, device=device, dtype=dtype, seed=block_size)
            expected = dense_attention(batch.query, batch.keys, batch.values)
            errors = [
                ((batch.token_major() if impl == "flex" else batch).attend(impl).double() - expected)
                .abs()
                .max()
                .item()
                for impl in impls
            ]
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


MAX_SWEEP_SIZES = 32
"""Block sizes one sweep compares (every power of two up to ``LIMITS.block_size`` is 17 of them)."""


def block_size_sweep(
    lengths: Sequence[int], sizes: Sequence[int], *, device: str = "cpu", repeats: int = 21
) -> BlockSizeSweep:
    """One decode call of ``paged_attention`` (torch) over the same requests in each block size, timed interleaved."""
    lengths = _lengths(lengths)
    sizes = tuple(check_size("a block size", b, "block_size", minimum=1) for b in check_items("sizes", sizes))
    device = _device(device)
    repeats = check_int("repeats", repeats, minimum=1, maximum=1000)
    if not sizes or len(set(sizes)) != len(sizes) or len(sizes) > MAX_SWEEP_SIZES:
        raise InvalidArgumentError(
            f"sizes must be 1 to {MAX_SWEEP_SIZES} different block sizes, got {brief(list(sizes))}"
        )
    _check_bytes(  # every size's batch is kept for the interleaved rounds
        f"{len(sizes)} batches (one per block size)",
        sum(_batch_bytes(lengths, bs, 2, 32, torch.float32) for bs in sizes),
        "use fewer or shorter sequences, or fewer block sizes",
    )
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
                _scattering_line(shuffled, ordered, sdpa),
            ]
            if peak is None:
                out.append(goal_line(shuffled, sdpa, f"paged {impl}"))
        if "memory copy" in read:
            out.append(self._copy_line(read, peak))
        return out

    def _copy_line(self, read: dict[str, Timing], peak: float | None) -> str:
        """Each kernel's bandwidth as a share of the memory copy's: below 100%, its own work limits it."""
        copy_rate = 2 * self.copy_bytes / read["memory copy"].median_ms
        kernels = {f"paged {impl}": read[f"paged, {impl}"] for impl in self.impls}
        kernels["SDPA"] = read["contiguous, torch SDPA"]
        shares = {name: self.kv_bytes / t.median_ms / copy_rate for name, t in kernels.items()}
        listed = ", ".join(f"{name} {100 * share:.0f}%" for name, share in shares.items())
        slower = [name for name, share in shares.items() if share < 1]
        if len(slower) == len(shares):
            verdict = "no kernel reaches the copy's speed, so a kernel's own work, not only reading memory, limits it"
        elif slower:
            verdict = f"{' and '.join(slower)} stay below the copy's speed, so their own work limits them"
        else:
            verdict = "every kernel reads as fast as the copy, so reading memory limits them"
        line = f"against the memory copy's bandwidth: {listed}; {verdict}"
        if peak:
            line += "; the Triton kernel is judged against the card's peak (the % of the peak above)"
        return line


CPU_GOAL = 1.2
"""kvlab's goal for its CPU decode kernel: paged (shuffled blocks) at most this many times SDPA's time."""


def goal_line(paged: Timing, sdpa: Timing, name: str, goal: float = CPU_GOAL) -> str:
    """Whether ``paged / sdpa`` met the goal in this run, decided from the ratio round by round.

    The two were timed in the same rounds (``measure_side_by_side``), so each round's ratio
    has the machine's load of that moment on both sides (``Timing.ratio_by_round``).
    """
    if not isinstance(paged, Timing) or not isinstance(sdpa, Timing):
        raise InvalidArgumentError("goal_line needs two Timings: the paged kernel's and SDPA's")
    name = check_text("name", name, allow_empty=False)
    goal = _check_goal(goal)
    low, _, high = paged.ratio_by_round(sdpa)
    verdict = goal_verdict(low, high, goal)
    if verdict == "met":
        why = f"in three rounds of four or more the ratio was at most {high:.2f}x, under {goal}x"
    elif verdict == "not met":
        why = f"in three rounds of four or more the ratio was above {low:.2f}x, over {goal}x"
    else:
        why = f"the middle half of the rounds' ratios, {low:.2f}x to {high:.2f}x, straddles {goal}x"
    return f"kvlab's goal for {name}, at most {goal}x SDPA: {verdict} in this run ({why})"


def goal_verdict(low: float, high: float, goal: float = CPU_GOAL) -> str:
    """A ratio's quartiles over the rounds against a goal: "met" (the third at most the goal), "not met" (the first above), else "undecided"."""
    goal = _check_goal(goal)
    low, high = _plain_ratio("low", low), _plain_ratio("high", high)
    if low > high:
        raise InvalidArgumentError(
            f"low ({low:g}) must be at most high ({high:g}): pass the first quartile, then the third"
        )
    if high <= goal:
        return "met"
    if low > goal:
        return "not met"
    return "undecided"


def _plain_ratio(name: str, value: object) -> float:
    """A ratio as a plain float (0 to infinity: a time over a zero time), read without the value's own code."""
    if isinstance(value, float):
        number = float.__float__(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = float(int.__int__(value)) if abs(int.__int__(value)) < 2**1000 else math.inf
    else:
        raise InvalidArgumentError(f"{name} must be a ratio (a number of at least 0), got {brief(value)}")
    if not number >= 0:  # NaN too
        raise InvalidArgumentError(f"{name} must be a ratio of at least 0, got {number!r}")
    return number


def _check_goal(goal: object) -> float:
    """The goal as a plain float from 1 to 100: a subclass's comparisons and formatting are never called."""
    number = None
    if isinstance(goal, float):
        number = float.__float__(goal)
    elif isinstance(goal, int) and not isinstance(goal, bool):
        number = float(int.__int__(goal)) if abs(int.__int__(goal)) <= 100 else math.inf
    if number is None or not 1 <= number <= 100:  # NaN too
        raise InvalidArgumentError(f"goal must be a ratio from 1 to 100, got {brief(goal)}")
    return number


def _scattering_line(shuffled: Timing, ordered: Timing, sdpa: Timing) -> str:
    """Where the gap between paged and SDPA lies in this run: scattering the blocks, or the kernel itself.

    Scattering is bounded by the top of shuffled / in-order's spread; the kernel's own share is
    in-order / SDPA (the same bytes in the same order). One is named the larger only when the two
    ratios' spreads separate, the rule the notebook uses for every timing claim.
    """
    low, high = shuffled.ratio_spread(ordered)
    scatter, kernel = shuffled.ratio_to(ordered), ordered.ratio_to(sdpa)
    if high <= 1:
        head = "  scattering the blocks over the pool cost nothing measurable in this run (the ratio's spread stays at or below 1.00x)"
    else:
        floor = f" (possibly nothing: the spread reaches {low:.2f}x)" if low <= 1 else ""
        head = f"  scattering the blocks over the pool cost at most {100 * (high - 1):.0f}% of the in-order time{floor}"
    head += f"; the kernel itself, on blocks in order, is {kernel:.2f}x SDPA"
    if kernel <= 1 and scatter <= 1:
        return f"{head}, so paging lost nothing to SDPA in this run"
    k_low, k_high = ordered.ratio_spread(sdpa)
    if k_low > high:  # the spreads separate: only then does this run say which is larger
        return f"{head}, so most of the gap to SDPA is the kernel's own work, not the block lookups"
    if low > k_high:
        return f"{head}, so most of the gap to SDPA is the scattering, not the kernel's own work"
    return f"{head}; their spreads overlap, so this run cannot tell which of the two costs more"


def _ratio(a: Timing, b: Timing) -> str:
    low, high = a.ratio_spread(b)
    by_low, _, by_high = a.ratio_by_round(b)
    return (
        f"{a.ratio_to(b):.2f}x ({low:.2f}x to {high:.2f}x across the IQRs; "
        f"the middle half of the rounds {by_low:.2f}x to {by_high:.2f}x)"
    )


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
    impls = tuple(_impls(impls, ("torch", "triton", "flex")))
    seq_len = check_size("seq_len", seq_len, "tokens", minimum=1)
    num_seqs = check_size("num_seqs", num_seqs, "slots", minimum=1)
    device, dtype = _device(device), _dtype(dtype)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1, maximum=256)
    head_dim = check_int("head_dim", head_dim, minimum=1, maximum=1024)
    repeats = check_int("repeats", repeats, minimum=1, maximum=1000)
    one = _batch_bytes([seq_len] * num_seqs, 16, num_kv_heads, head_dim, dtype)
    contiguous = (
        2 * num_seqs * seq_len * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    )
    _check_bytes(  # the batches (shuffled, in order; token-major copies for flex), contiguous K and V, the copy
        "the two batches, their contiguous K and V and the memory copy",
        2 * one * (1 + ("flex" in impls)) + contiguous + 2 * 64 * MiB,
        "use fewer sequences, a shorter seq_len, fewer KV heads or a smaller head_dim",
    )
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
    for impl in impls:  # flex reads a token-major pool: its own copy, made before the timing
        shuffled, ordered = (
            (b.token_major() for b in (batch, in_order)) if impl == "flex" else (batch, in_order)
        )
        calls[f"paged, {impl}"] = lambda impl=impl, b=shuffled: b.attend(impl)
        calls[f"paged, {impl}, blocks in order"] = lambda impl=impl, b=ordered: b.attend(impl)
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


MODES = ("slot", "blocks", "off")


TTFT_CONTEXT = 16_384
TTFT_PREFILLS = 30
"""``ttft_by_mode``'s bound on its work: at most as much prefill as 30 prefills of a 16,384-token context
(the defaults at about that length), counting a prefill's cost as the square of its length. Past it a run on
a CPU takes a long time, and the notebook's runs (500 tokens on a CPU, 2,000 on a GPU) are far below."""


def ttft_by_mode(
    system_tokens: int, *, device: str = "cpu", repeats: int = 5, warmup: int = 1, turns: int = 3
) -> dict[str, list[ChatTurnResult]]:
    """Part eight: the same chat behind a long system prompt in slot, block and no-cache mode, timed interleaved.

    Each mode gets ``warmup + repeats`` engines built alike (same weights, each starting empty).
    In round ``r`` repetition ``e`` plays turn ``r - e`` in every mode, the modes taking turns to go
    first, so a burst of load or a one-time cost of the process falls on every mode alike; the
    ``warmup`` repetitions are untimed, so every mode's first long prefill is served once before
    any is timed. ``run_chat`` does the same for one mode at a time.
    """
    system_tokens = check_size("system_tokens", system_tokens, "tokens", minimum=1)
    device = _device(device)
    repeats = check_int("repeats", repeats, minimum=1, maximum=100)
    warmup = check_int("warmup", warmup, minimum=0, maximum=100)
    turns = check_int("turns", turns, minimum=1, maximum=20)
    length = context_needed(turns, 1, system_tokens)
    reps = warmup + repeats
    # slot and off hold one context, blocks mode four (Engine's default)
    blocks = -(-length // 16) * (1 + 4 + 1)
    _check_bytes(
        f"{3 * reps} engines for a {length:,}-token context",
        reps * blocks * 16 * ModelConfig().kv_bytes_per_token(),
        "use fewer system_tokens, repeats or warmup",
    )
    prefills = reps * (turns + 2) * (length / TTFT_CONTEXT) ** 2  # off: every turn; slot, blocks: turn 1
    if prefills > TTFT_PREFILLS:
        raise InvalidArgumentError(
            f"{3 * reps} engines playing {turns} turns of a {length:,}-token context would prefill as much as "
            f"{prefills:,.1f} prefills of {TTFT_CONTEXT:,} tokens, more than kvlab's bound of {TTFT_PREFILLS} "
            "(a prefill's time grows with the square of its length): use fewer system_tokens, repeats or turns"
        )
    engines = {
        mode: [Engine(cache=mode, block_size=16, max_model_len=length, device=device) for _ in range(warmup + repeats)]
        for mode in MODES
    }  # fmt: skip
    first = engines[MODES[0]][0]  # its tokenizer renders every prompt (all engines share the same one)
    system = system_prompt(system_tokens)
    history: dict[str, list[Message]] = {mode: [] for mode in MODES}
    prompts: dict[str, list[list[int]]] = {mode: [] for mode in MODES}
    samples: dict[str, list[list[tuple[GenerationResult, float]]]] = {
        m: [[] for _ in range(turns)] for m in MODES
    }
    for r in range(turns + reps - 1):
        order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
        for e in range(reps):
            k = r - e
            if not 0 <= k < turns:
                continue
            for mode in order:
                if k == len(prompts[mode]):  # repetition 0 is first to play turn k
                    msgs = [Message("system", system), *history[mode], Message("user", user_message(k))]
                    prompts[mode].append(list(render(msgs, first.tokenizer).tokens))
                cpu0 = time.process_time()
                result = engines[mode][e].generate(prompts[mode][k], max_tokens=1)
                sample = (result, (time.process_time() - cpu0) * 1e3)
                if e == 0:
                    reply = first.decode_text(result.output_tokens)
                    history[mode] += [Message("user", user_message(k)), Message("assistant", reply)]
                if e >= warmup:
                    samples[mode][k].append(sample)
    return {mode: [_turn_result(k, turn, first) for k, turn in enumerate(samples[mode])] for mode in MODES}


def _turn_result(k: int, turn: list[tuple[GenerationResult, float]], engine: Engine) -> ChatTurnResult:
    """One turn's repeated samples as a ChatTurnResult (every repetition must have served it alike)."""
    result = turn[0][0]
    if any((r.cache_n, r.output_tokens) != (result.cache_n, result.output_tokens) for r, _ in turn):
        raise AssertionError("engines built alike served the same turn differently")  # pragma: no cover
    ttft = Timing(tuple(r.ttft_ms for r, _ in turn), tuple(cpu for _, cpu in turn))
    return ChatTurnResult(
        k + 1, result.prompt_tokens, result.cache_n, result.prompt_n, ttft.median_ms,
        engine.decode_text(result.output_tokens), ttft,
    )  # fmt: skip


def _runs(runs: object) -> dict[str, list[ChatTurnResult]]:
    """What ``ttft_by_mode`` returns: the three modes, each the same number of timed turns."""
    # read through dict's own methods: a dict subclass's iteration or lookup may raise or lie
    if (
        not isinstance(runs, dict)
        or dict.__len__(runs) != len(MODES)
        or not all(dict.__contains__(runs, mode) for mode in MODES)
    ):
        raise InvalidArgumentError(
            f"runs must be what ttft_by_mode returns (a dict of {MODES}), got {type(runs).__name__}"
        )
    out = {}
    for mode in MODES:
        turns = check_items(f"runs[{mode!r}]", dict.__getitem__(runs, mode), "turns")
        if not turns or not all(isinstance(t, ChatTurnResult) and isinstance(t.ttft, Timing) for t in turns):
            raise InvalidArgumentError(f"runs[{mode!r}] must be a non-empty list of timed ChatTurnResults")
        out[mode] = turns
    if len({len(t) for t in out.values()}) != 1:
        raise InvalidArgumentError("every mode must have played the same number of turns")
    return out


def ttft_lines(runs: dict[str, list[ChatTurnResult]]) -> list[str]:
    """Each mode's turns (median and IQR); whether the cold turn 1s agree; every cached turn against the off mode's same turn."""
    runs = _runs(runs)
    out = []
    for mode, turns in runs.items():
        cells = "   ".join(
            f"turn {t.turn}: {t.ttft.median_ms:6.1f} ms ({t.ttft.q1_ms:.1f}-{t.ttft.q3_ms:.1f})"
            for t in turns
        )
        out.append(
            f"{mode:<7}{cells}   cache_n {[t.cache_n for t in turns]}, prompt_n {[t.prompt_n for t in turns]}"
        )
    out += [f"(median time to first token of {runs['slot'][0].ttft.repeats} runs, IQR in brackets)", ""]
    out.append(cold_turns_line(runs))
    off = runs["off"]
    if len(off) > 1:  # off prefills a longer prompt each turn: did that show in time?
        first, last = off[0], off[-1]
        out.append(
            f"off    turn {last.turn} prefills {last.prompt_n:,} tokens, turn 1 {first.prompt_n:,}: "
            + _verdict(first.ttft, last.ttft, "turn 1", f"turn {last.turn}")
        )
    for mode in ("slot", "blocks"):
        for t, same in zip(runs[mode][1:], off[1:], strict=True):
            cpu = same.ttft.cpu_median_ms / t.ttft.cpu_median_ms if t.ttft.cpu_median_ms else float("inf")
            out.append(
                f"{mode:<7}"
                + _verdict(t.ttft, same.ttft, f"turn {t.turn}", f"off's turn {t.turn}")
                + f"; CPU {cpu:.1f}x"
            )
    return out


COLD_TOLERANCE = 1.10
"""Turn 1s whose IQRs are apart still count as agreeing when their medians are this close (10%)."""


def cold_turns_line(runs: dict[str, list[ChatTurnResult]]) -> str:
    """Whether the three modes' turn 1s (the same prompt, all prefilled) agree: IQRs overlapping, or medians within 10%."""
    runs = _runs(runs)
    cold = {mode: turns[0].ttft for mode, turns in runs.items()}
    apart = [(a, b) for a, b in itertools.permutations(cold, 2) if cold[a].clearly_faster_than(cold[b])]
    fastest = min(cold, key=lambda m: cold[m].median_ms)
    slowest = max(cold, key=lambda m: cold[m].median_ms)
    spread = cold[slowest].ratio_to(cold[fastest])
    sizes = sorted({turns[0].prompt_n for turns in runs.values()})
    head = (
        f"turn 1 prefills all {sizes[0]:,} prompt tokens in every mode: " if len(sizes) == 1 else "turn 1: "
    )
    widths = ", ".join(f"{mode} {_percent(t)}" for mode, t in cold.items())
    if not apart:
        return head + (
            f"the three medians agree within their IQRs (no mode clearly faster); the IQRs are {widths} of "
            "the medians, so a difference smaller than that would pass unseen"
        )
    if spread <= COLD_TOLERANCE:
        return head + (
            f"the medians are within {100 * (spread - 1):.0f}% of each other ({fastest} fastest, {slowest} "
            f"slowest; their IQRs, {widths} of the medians, are narrower than that), small next to the factors below"
        )
    a, b = apart[0]
    return head + (
        f"{a} was clearly faster than {b} ({cold[b].ratio_to(cold[a]):.2f}x) on the same work: "
        "noise or a one-time cost fell on one mode; the comparisons below use the off mode's same turn"
    )


def _percent(t: Timing) -> str:
    """A timing's IQR as a share of its median: whole percents, one decimal below 1% (never a false 0%)."""
    share = 100 * (t.q3_ms - t.q1_ms) / t.median_ms if t.median_ms else 0.0
    return f"{share:.1f}%" if share < 1 else f"{share:.0f}%"


def least_speedup(runs: dict[str, list[ChatTurnResult]], modes: Sequence[str] = ("slot", "blocks")) -> float:
    """The smallest factor, across the IQRs, by which a cached turn beat the off mode's same turn: the run's worst case."""
    runs = _runs(runs)
    modes = [check_choice("a mode", m, ("slot", "blocks")) for m in check_items("modes", modes)]
    if not modes or (len(runs["off"]) < 2):
        raise InvalidArgumentError("least_speedup needs at least one cached mode and at least two turns")
    off = runs["off"]
    return min(
        same.ttft.ratio_spread(t.ttft)[0]
        for mode, turns in runs.items()
        if mode in modes
        for t, same in zip(turns[1:], off[1:], strict=True)
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


@dataclass(frozen=True)
class Batching:
    """Part nine, counted: how many requests each decode step advanced with ``clients`` clients (the scheduler's counters)."""

    clients: int
    requests: int
    decode_steps: int
    decoded_sequences: int
    most_at_once: int  # the largest decode batch of the run

    @property
    def per_step(self) -> float:
        """Requests per decode step: the mean decode batch (``kvlab:decoded_sequences_total / decode_steps_total``)."""
        return self.decoded_sequences / self.decode_steps if self.decode_steps else 0.0


def requests_per_step(
    prompts: Sequence[str],
    clients: Sequence[int] = (1, 2, 4, 8),
    *,
    requests_per_client: int = 2,
    max_tokens: int = 32,
    num_blocks: int = 32,
    block_size: int = 16,
    max_model_len: int = 512,
) -> dict[int, Batching]:
    """Play ``clients`` closed-loop clients on ``kvlab serve``'s scheduler in this process, stepped by hand.

    Each client sends a prompt and, when it finishes, the next one, as ``concurrency_sweep``'s
    clients do over HTTP, but with no clock in the loop: the counts are the same on every run and
    every machine. The pool (``num_blocks`` of ``block_size``) is the one part nine's server has.
    """
    from kvlab.engine.scheduler import Scheduler

    texts = [check_text("a prompt", p, allow_empty=False) for p in check_items("prompts", prompts)]
    counts = [check_size("a client count", c, "count", minimum=1) for c in check_items("clients", clients)]
    per_client = check_size("requests_per_client", requests_per_client, "count", minimum=1)
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    if not counts or len(texts) < max(counts) * per_client:
        raise InvalidArgumentError(
            f"give at least one client count and clients x requests_per_client prompts, got {len(texts)} prompts"
        )
    engine = Engine(cache="blocks", block_size=block_size, num_blocks=num_blocks, max_model_len=max_model_len)
    out = {}
    for c in counts:
        engine.prefix_cache = PrefixCache(engine.pool.num_blocks, engine.block_size)  # each run starts cold
        scheduler = Scheduler(engine)
        todo = [engine.tokenizer.encode(t) for t in texts[: c * per_client]]

        def send(_: object = None, scheduler: Scheduler = scheduler, todo: list = todo) -> None:
            if todo:
                scheduler.submit(todo.pop(0), max_tokens=max_tokens, on_finish=send)

        for _ in range(c):
            send()
        most = 0
        while scheduler.has_work():
            before = scheduler.counters.decoded_sequences
            scheduler.step()
            most = max(most, scheduler.counters.decoded_sequences - before)
        k = scheduler.counters
        out[c] = Batching(c, c * per_client, k.decode_steps, k.decoded_sequences, most)
    return out


def batching_lines(counts: dict[int, Batching], fit: int) -> list[str]:
    """One line per client count, then whether the decode batch stops at kvlab's predicted limit."""
    out = [
        f"{c} client{'s' if c > 1 else ' '}: {b.requests:2d} requests, {b.decode_steps:3d} decode steps, "
        f"{b.per_step:.2f} requests per step on average, at most {b.most_at_once} in one step"
        for c, b in counts.items()
    ]
    capped = [c for c in counts if c > fit]
    if capped:
        most = max(counts[c].most_at_once for c in capped)
        out.append(
            f"with more than {fit} clients the largest decode batch is {most}: "
            + (
                f"the {fit} kvlab's model predicted for the pool; the other requests waited for blocks"
                if most == fit
                else f"not the {fit} kvlab's model predicted"
            )
        )
    return out


def sweep_lines(sweep: dict[int, Timing], fit: int) -> list[str]:
    """Throughput per number of clients, each doubling decided from the spreads, then one conclusion line."""
    out = []
    for clients, t in sweep.items():
        against = ""
        if clients != 1 and 1 in sweep:
            low, high = sweep[1].ratio_spread(t)
            against = f"  {sweep[1].ratio_to(t):.2f}x one client's ({low:.2f}-{high:.2f}x across the IQRs)"
        out.append(
            f"{clients} client{'s' if clients > 1 else ' '}: {1e3 / t.median_ms:6.0f} tokens/s "
            f"({t.median_ms:.2f} ms per token, IQR {t.q1_ms:.2f}-{t.q3_ms:.2f}){against}"
        )
    out.append("")
    counts = sorted(sweep)
    gained: dict[int, bool] = {}
    for fewer, more in zip(counts, counts[1:], strict=False):
        low, high = sweep[fewer].ratio_spread(sweep[more])
        gained[more] = sweep[more].clearly_faster_than(sweep[fewer])
        out.append(
            f"{more} clients against {fewer}: {'clearly more' if gained[more] else 'not clearly more'} "
            f"throughput, {sweep[fewer].ratio_to(sweep[more]):.2f}x ({low:.2f}-{high:.2f}x across the IQRs)"
        )
    factors = {
        more: sweep[fewer].ratio_to(sweep[more]) for fewer, more in zip(counts, counts[1:], strict=False)
    }
    if 1 in sweep and len(sweep) > 1:
        out.append(_against_one_line(sweep))
    out.append("doubling by doubling, " + _sweep_conclusion(gained, fit, factors))
    return out


def _against_one_line(sweep: dict[int, Timing]) -> str:
    """Which client counts clearly beat one client: a different question from each doubling's."""
    above = [c for c in sorted(sweep) if c != 1 and sweep[c].clearly_faster_than(sweep[1])]
    rest = [c for c in sorted(sweep) if c != 1 and c not in above]
    said = []
    if above:
        said.append(f"{_clients(above)} clearly more throughput than one client")
    if rest:
        said.append(f"{_clients(rest)} not clearly more")
    return "against one client, in this run: " + "; ".join(said)


def _clients(counts: list[int]) -> str:
    names = [str(c) for c in counts]
    joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"{joined} client{'s' if len(names) > 1 or counts[0] > 1 else ''}"


def _sweep_conclusion(gained: dict[int, bool], fit: int, factors: dict[int, float] | None = None) -> str:
    """What this run's doublings support, up to the pool's limit and past it (with the factors when given)."""
    below = [gained[c] for c in gained if c <= fit]
    above = [c for c in gained if c > fit]
    if not below:
        line = "in this run"
    elif all(below):
        line = f"in this run every doubling up to {fit} clients clearly raised the throughput"
    elif any(below):
        line = f"in this run some doublings up to {fit} clients clearly raised the throughput, not all"
    else:
        line = f"in this run no doubling up to {fit} clients clearly raised the throughput"
    if above:
        line += ("; past" if below else " past") + f" the pool's {fit} requests "
        if any(gained[c] for c in above):
            line += "a doubling still clearly raised it"
            if factors:
                first = min(factors)
                line += (
                    f", by {max(factors[c] for c in above):.2f}x at most, against {factors[first]:.2f}x "
                    f"for the doubling to {first} clients"
                )
        else:
            line += "no doubling clearly raised it"
    return line
