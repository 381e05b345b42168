"""Attention that reads keys and values through block tables (lesson example 2).

The KV pool of one layer is two tensors, ``key_cache`` and ``value_cache``, of
shape ``[num_blocks, block_size, num_kv_heads, head_dim]``. A sequence's tokens
live in the blocks its row of ``block_tables`` names, in order: token ``p`` sits
in physical block ``block_tables[s, p // block_size]`` at offset
``p % block_size``, i.e. at *slot* ``block * block_size + offset`` of the pool
(vLLM's slot mapping).

That shape is indexed the same whatever the pool's strides; ``layer_pool`` makes
one of two memory layouts (``pool_layout`` names them). Token-major (the tensor
contiguous, a token's KV heads side by side) is vLLM 0.33's NHD (LBNHC), its
choice where an attention backend states no preference. Head-major (in each block, a KV head's ``block_size`` rows in
one run) is the only layout vLLM 0.33's CPU backend reads (its ``LBHNC``,
``vllm/v1/attention/backends/cpu_attn.py``), and kvlab's default on the CPU:
the compiled decode below serves one KV head at a time, and reading a block in
runs of ``block_size * head_dim`` numbers instead of ``head_dim`` made the same
kernel faster on ``benchmarks/paged_attention.py``'s shapes: on a 2-core AMD
EPYC, in three runs at one and two threads, token-major took 1.02-1.29x the
head-major time on 29 of 30 rows, 0.91x on the other (32 KV heads, one
thread). Every implementation gives the same numbers on either, apart from
``"flex"``, which needs token-major.

Two entry points:

* ``paged_attention`` -- decode: one new query token per sequence, whose key and
  value were already written to the cache, attends over all ``seq_lens[s]``
  cached tokens.
* ``paged_prefill`` -- prefill: writes the new tokens' keys and values through
  the slot mapping, then lets each new token attend causally over the cached
  prefix plus the new tokens before it.

Implementations (``impl=``):

* ``"reference"`` gathers each sequence into a dense tensor and runs plain
  attention in float64: slow, obviously right, the oracle the others are tested against.
* ``"torch"`` (decode) on the CPU, for a call that reads at least
  ``COMPILED_MIN_BYTES`` of K and V, runs a kernel that ``torch.compile``
  (inductor) generates in C++: every sequence is cut into chunks of 64 tokens
  (48 for wide rows), the scores are an elementwise product summed over head_dim, so each
  key row is loaded through the block table inside that vectorised sum and no
  gathered copy exists (values likewise in the weighted sum), each chunk gets
  its own max, sum and output, and a sequence's chunks are merged exactly by
  their maxima (flash-decoding's split). A few fused loop nests per step (the
  scores and their softmax, the weighted sum, the merge) each spread the chunks
  of all sequences over the threads. Why: the gather copies, small
  matmuls and Python loops of eager code cost about as much as the attention
  itself (the walk below ran at 2x SDPA on contiguous K/V). The first call of
  a kind (dtype, block size, heads, head_dim, pool layout) compiles for seconds, cached on
  disk by torch; smaller calls, float64, autograd, other devices, and a
  machine where compiling fails (one warning) run the walk: each sequence a
  tile of whole blocks at a time, gathered into a small reused buffer, with an
  online softmax (running max, running sum, rescaled accumulator); within a
  tile all heads are one batched matmul. An alternative, ``_batched_decode``,
  gathers chunks of many sequences into one cache-sized tile and runs torch's
  CPU flash kernel on each tile, merging a sequence's chunks by their
  log-sum-exps (timed beside the others by the benchmark). For prefill,
  ``"torch"`` gathers each sequence and runs torch's fused attention with the
  causal offset (prefill is compute-bound; the gather is small next to it).
* ``"triton"`` (decode only) a Triton kernel: one program per sequence and KV
  head (optionally split over the sequence), each K/V block read once for all
  the query heads that share it. See ``kvlab.engine.triton_paged``.
* ``"auto"`` picks triton for CUDA tensors when triton imports, torch otherwise
  (prefill: always torch).

* ``"flex"`` (decode only) torch's FlexAttention (torch >= 2.5) over the whole
  pool viewed as one long sequence, driven by a block mask built from the block
  tables the way attention-gym's paged attention does it: each sequence's
  kv_indices are its physical blocks (whole blocks as "full" blocks, the last,
  partial one as a masked block), and a mask_mod maps a physical slot back to
  its logical position. Compiled with ``torch.compile`` (a C++ kernel on the
  CPU, Triton on a GPU) where that works, cached per process; otherwise, and
  for float64, eager (exact but dense over the pool: small pools only).

Grouped-query attention: ``num_heads`` must be a multiple of ``num_kv_heads``;
query head ``h`` uses KV head ``h // (num_heads // num_kv_heads)``.

Table entries past a sequence's last block are never read, so they may hold
anything (vLLM pads with 0); entries that are read must name a block of the pool.

Kept as one module: the float64 reference, the torch kernels (compiled and walked) and the
dispatch between implementations share their argument checks and are tested against each other.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvlab.engine.memory import keep_freed_memory
from kvlab.errors import LIMITS, InvalidArgumentError, brief, cdiv, check_choice, check_int, check_size

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("kvlab.engine needs torch: pip install 'kvlab[engine]'") from exc

DECODE_IMPLS = ("auto", "reference", "torch", "triton", "flex")
PREFILL_IMPLS = ("auto", "reference", "torch")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
# one K tile of the torch walk: big enough to amortise Python's per-op cost, small enough for the
# CPU cache (measured on a 2-core EPYC with benchmarks/paged_attention.py: 1 MiB, 128..512 tokens)
TILE_BYTES = 1 << 20
MIN_TILE_TOKENS, MAX_TILE_TOKENS = 128, 512
# the batched CPU decode: chunks of one sequence of about CHUNK_BYTES of keys, tiles of several chunks of
# about BATCH_TILE_BYTES (keys; values as much again)
CHUNK_BYTES = 2 << 20
BATCH_TILE_BYTES = 4 << 20
# FlexAttention's query block: decode has one query row, any size >= 1 works (attention-gym uses 128)
FLEX_Q_BLOCK = 128
# the static shapes (batch, group, pool size) compiled flex may compile for a process, past which it runs eagerly
FLEX_RECOMPILE_LIMIT = 32
# the compiled CPU decode: chunks of whole blocks, each a short reduction; used for calls that read at
# least COMPILED_MIN_BYTES of K and V (smaller ones run the walk and never compile), for at most
# COMPILED_MAX_KINDS kinds (dtype, block size, heads, head_dim, pool layout) a process. A chunk is about
# COMPILED_CHUNK_TOKENS tokens, fewer (COMPILED_WIDE_CHUNK_TOKENS) where one token's keys (all KV heads)
# pass COMPILED_WIDE_ROW_BYTES. Measured on a 2-core Xeon (interleaved rounds, cache flushed between
# calls, 1 and 2 threads): 8 KV heads x 128 fp32 (4 KiB a token): 64 tokens 1.02-1.25x SDPA, 32 tokens
# 1.13-1.45x, 96 and 128 slower; 32 KV heads (16 KiB): 48 tokens 1.15-1.29x, 32 tokens 1.24-1.38x, 64
# tokens 1.58-1.72x. Longer chunks write fewer partial outputs for the merge; too long, and a
# chunk's values no longer stay in the core's cache while every head reads them. Those ranges are from
# the earlier [chunk, block, token, head] layout; with the per-head layout, at 32 x 2k tokens, one and two
# threads, 64 and 48 tokens were again the fastest of 2 to 5 blocks; with the per-pass layout
# (_chunked_decode_graph) on a 2-core AMD EPYC, one thread, 32 to 128 tokens (8 KV heads) were 1.11-1.19x
# SDPA and 32 to 64 (32 KV heads) 0.89-1.00x, apart by less than their spread, so 64 and 48 stay.
COMPILED_CHUNK_TOKENS = 64
COMPILED_WIDE_CHUNK_TOKENS = 48
COMPILED_WIDE_ROW_BYTES = 4 << 10
COMPILED_MIN_BYTES = 8 << 20
COMPILED_MAX_KINDS = 8
# the query heads one pass over a KV head's rows serves (at most; a divisor of the group): each row loaded
# once feeds this many fused multiply-adds. Measured at 8 x 4k tokens, 32 query heads of 128, one thread,
# against SDPA: 4 KV heads (groups of 8) 2, 4 and 8 per pass 1.24x, 1.17x and 1.57x (8 at a time
# slower, not looked into); 1 KV head (a group of 32) 1.53x, 1.37x, 1.46x; one reduction per head, each row
# loaded per head, 1.41x and 1.43x. Interleaved in one process, passes against one head a pass: groups of
# 3 0.96x against 1.10x, 6 1.18x against 1.58x, 8 1.22x against 1.36x, 12 1.23x against 1.61x.
PASS_MEMBERS = 4
# the table entries one call may read (the columns up to the longest sequence, every row): 16M, 128 MiB as
# int64, past any real batch (256 sequences of 64k tokens in 1-token blocks)
MAX_TABLE_ENTRIES = 1 << 24
# inductor's C++ options: threads chosen at run time (torch.set_num_threads), fused multiply-adds
COMPILE_OPTIONS = {
    "cpp.dynamic_threads": True,
    "cpp.enable_floating_point_contract_flag": "fast",
    "assert_indirect_indexing": False,  # every table entry the kernel reads was checked by _check_tables
}


@dataclass(frozen=True)
class PagedShape:
    """The sizes every implementation needs, read once from validated arguments."""

    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int
    max_blocks_per_seq: int

    @property
    def group(self) -> int:
        """Query heads per KV head (1 for multi-head attention)."""
        return self.num_heads // self.num_kv_heads


# ---------------------------------------------------------------------------- validation


def _check_tensor(name: str, value: object, ndim: int, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidArgumentError(f"{name} must be a torch.Tensor {what}, got {type(value).__name__}")
    if value.layout != torch.strided:
        raise InvalidArgumentError(f"{name} is a {value.layout} tensor: pass a dense one ({name}.to_dense())")
    if value.device.type == "meta":
        raise InvalidArgumentError(f"{name} is on the meta device, which holds no values: pass a real tensor")
    if value.dim() != ndim:
        raise InvalidArgumentError(
            f"{name} must have {ndim} dimensions {what}, got shape {tuple(value.shape)}"
        )
    return value


def _check_int_tensor(name: str, value: torch.Tensor) -> None:
    if value.dtype not in INT_DTYPES:
        raise InvalidArgumentError(
            f"{name} must hold integers (int32 is usual), got {value.dtype}; convert it with .to(torch.int32)"
        )


def _check_scale(scale: object, head_dim: int) -> float:
    """A positive finite scale as a plain float, read from its stored value (a subclass's own methods never run)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    kind = type(scale)
    value = math.nan
    if issubclass(kind, float):
        value = float.__float__(scale)
    elif issubclass(kind, int) and not issubclass(kind, bool):
        try:
            value = float(int.__int__(scale))
        except OverflowError:  # past any float
            value = math.inf
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgumentError(
            f"scale must be a positive finite number or None (1/sqrt(head_dim)), got {brief(scale)}"
        )
    return value


def _check_pool(name: str, value: object) -> torch.Tensor:
    """One KV pool tensor's layout: 4 dimensions, none empty, each backed by memory (no zero stride)."""
    pool = _check_tensor(name, value, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    if min(pool.shape) < 1:
        raise InvalidArgumentError(f"{name} has an empty dimension: shape {tuple(pool.shape)}")
    _refuse_expanded(name, pool)
    return pool


def check_cache(key_cache: object, value_cache: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a layer's KV pool pair and return it."""
    kc, vc = _check_pool("key_cache", key_cache), _check_pool("value_cache", value_cache)
    if kc.shape != vc.shape:
        raise InvalidArgumentError(
            f"key_cache {tuple(kc.shape)} and value_cache {tuple(vc.shape)} must have the same shape"
        )
    if kc.dtype != vc.dtype or kc.dtype not in FLOAT_DTYPES:
        raise InvalidArgumentError(
            f"key_cache and value_cache must share a float dtype (float16, bfloat16, float32, float64), "
            f"got {kc.dtype} and {vc.dtype}"
        )
    if kc.device != vc.device:
        raise InvalidArgumentError(
            f"key_cache is on {kc.device} but value_cache on {vc.device}: move them together"
        )
    for name, t in (("key_cache", kc), ("value_cache", vc)):
        if t.requires_grad:
            raise InvalidArgumentError(
                f"{name} requires grad; kvlab's paged attention is for inference: pass {name}.detach()"
            )
        if t.is_neg():  # its values are the negated memory: a compiled kernel would read the memory as it is
            raise InvalidArgumentError(
                f"{name} is a negated view (torch._neg_view): pass a plain tensor, {name}.resolve_neg()"
            )
    return kc, vc


POOL_LAYOUTS = ("token-major", "head-major")


def pool_layout(cache: torch.Tensor) -> str:
    """How a pool tensor's rows lie in memory: "token-major", "head-major", or "strided" (neither).

    Token-major: a token's KV heads side by side (the tensor is contiguous). Head-major: in
    every block, a KV head's ``block_size`` rows side by side, the heads one after another
    (``[num_blocks, num_kv_heads, block_size, head_dim]`` in memory). Where one KV head or one
    token a block makes the two the same, it is "token-major".
    """
    if not isinstance(cache, torch.Tensor):
        raise InvalidArgumentError(
            f"pool_layout reads a torch.Tensor (a key or value cache), got {brief(cache)}"
        )
    if cache.is_contiguous():
        return "token-major"
    if cache.dim() == 4 and cache.permute(0, 2, 1, 3).is_contiguous():
        return "head-major"
    return "strided"


def layer_pool(
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    layout: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's KV pool, zeroed: ``(key_cache, value_cache)``, each [num_blocks, block_size, num_kv_heads, head_dim].

    The shape, the indexing and every kernel's results are the same in either ``layout``;
    only where the rows lie in memory differs (``pool_layout``):

    * ``"token-major"``: a token's heads side by side, the tensor contiguous; vLLM 0.33's
      NHD, its choice where an attention backend states no preference;
    * ``"head-major"``: in each block a KV head's ``block_size`` rows are one run of
      memory; vLLM 0.33's CPU backend reads only this layout (its ``LBHNC``). A CPU kernel
      that serves one KV head at a time then reads each block in runs of
      ``block_size * head_dim`` numbers rather than ``head_dim``, which hardware prefetchers
      follow and a token-major pool's stride of ``num_kv_heads * head_dim`` defeats;
    * ``"auto"``: head-major on the CPU, token-major elsewhere.

    FlexAttention (``impl="flex"``) reads a KV head's tokens as one run over the whole pool,
    so it needs a token-major pool.
    """
    return pool_tensors(
        (), num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device, layout=layout
    )


MAX_POOL_DIM = 1 << 16
"""Most KV heads, and most numbers per head, a pool may have (the largest models use 8 to 128 and 64 to 256)."""


def pool_device(device: object) -> torch.device:
    """``device`` as a torch.device a pool can live on: the CPU, or a CUDA device this torch can see."""
    try:
        where = torch.device(device)  # type: ignore[arg-type]
    except (RuntimeError, TypeError, ValueError):
        where = None
    if where is None or where.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(
            f"device must be 'cpu' or a CUDA device such as 'cuda:0', got {brief(device)}"
        )
    if where.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgumentError("device is a CUDA device but this torch sees no GPU: use device='cpu'")
    if where.type == "cuda" and where.index is not None and where.index >= torch.cuda.device_count():
        raise InvalidArgumentError(
            f"device {where} names GPU {where.index}, but this torch sees {torch.cuda.device_count()}: "
            "use 'cuda' or an index below that"
        )
    return where


def pool_tensors(
    lead: tuple[int, ...],
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    dtype: torch.dtype,
    device: object,
    layout: object,
    max_mib: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed keys and values of shape ``lead + [num_blocks, block_size, num_kv_heads, head_dim]`` in ``layout``.

    ``lead`` is ``()`` for one layer or ``(num_layers,)`` for a model's. Every argument is
    checked here, before anything is allocated, and the two tensors together may take at most
    ``max_mib`` MiB (by default ``LIMITS.memory_mib``; the tiny engine's ``KVPool`` passes its own
    ``MAX_MIB``), counted from the sizes themselves.
    """
    if type(lead) is not tuple or len(lead) > 1:
        raise InvalidArgumentError(
            f"lead must be () for one layer or (num_layers,) for a model's pool, got {brief(lead)}"
        )
    lead = tuple(check_int("num_layers", n, minimum=1, maximum=1 << 16) for n in lead)
    nb = check_size("num_blocks", num_blocks, "num_blocks", minimum=1)
    bs = check_size("block_size", block_size, "block_size", minimum=1)
    kv = check_int("num_kv_heads", num_kv_heads, minimum=1, maximum=MAX_POOL_DIM)
    d = check_int("head_dim", head_dim, minimum=1, maximum=MAX_POOL_DIM)
    if not isinstance(dtype, torch.dtype) or dtype not in FLOAT_DTYPES:
        raise InvalidArgumentError(
            f"dtype must be torch.float16, torch.bfloat16, torch.float32 or torch.float64, got {brief(dtype)}"
        )
    if max_mib is None:
        cap, named = LIMITS.memory_mib, "kvlab's limit LIMITS.memory_mib"
        way = "kvlab.errors.raised_limits(memory_mib=...) for a deliberately larger pool"
    else:
        cap, named, way = check_int("max_mib", max_mib, minimum=1), "the bound max_mib", "a larger max_mib"
    layers = lead[0] if lead else 1
    size = 2 * layers * nb * bs * kv * d * dtype.itemsize  # exact: ints of any size
    if size > cap * 2**20:
        across = f"{layers:,} layers x " if lead else ""
        raise InvalidArgumentError(
            f"a pool of {across}{nb:,} blocks x {bs} tokens x {kv:,} KV heads x {d:,} would take "
            f"{size >> 20:,} MiB for keys and values, more than {cap:,} ({named}); use fewer blocks, or {way}"
        )
    where = pool_device(device)
    layout = check_choice("layout", layout, ("auto", *POOL_LAYOUTS))
    if layout == "auto":
        layout = "head-major" if where.type == "cpu" else "token-major"
    token_major = layout == "token-major"
    shape = (*lead, nb, *((bs, kv) if token_major else (kv, bs)), d)
    try:
        pair = tuple(torch.zeros(shape, dtype=dtype, device=where) for _ in "kv")
    except (RuntimeError, MemoryError, OverflowError, TypeError) as err:  # a limit raised past the machine
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        layers = f"{lead[0]:,} layers x " if lead else ""
        raise InvalidArgumentError(
            f"the pool's keys and values ({layers}{nb:,} blocks of {bs} "
            f"tokens) could not be allocated on {where}: {brief(first, 200)}; use fewer or smaller blocks"
        ) from None
    if token_major:
        return pair  # type: ignore[return-value]
    heads = len(lead) + 1
    return tuple(t.transpose(heads, heads + 1) for t in pair)  # type: ignore[return-value]


def _check_table_tensors(
    block_tables: object, seq_lens: object, num_seqs: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables' types, dimensions, dtypes, sizes and device (not their values)."""
    bt = _check_tensor("block_tables", block_tables, 2, "[num_seqs, max_blocks_per_seq]")
    sl = _check_tensor("seq_lens", seq_lens, 1, "[num_seqs]")
    _check_int_tensor("block_tables", bt)
    _check_int_tensor("seq_lens", sl)
    if bt.shape[0] != num_seqs or sl.shape[0] != num_seqs:
        raise InvalidArgumentError(
            f"block_tables has {bt.shape[0]} rows and seq_lens {sl.shape[0]} entries, "
            f"but there are {num_seqs} sequences: give one of each per sequence"
        )
    if num_seqs > MAX_TABLE_ENTRIES:  # each sequence reads at least one entry: refused before any is read
        raise InvalidArgumentError(
            f"{num_seqs:,} sequences is more than the {MAX_TABLE_ENTRIES:,} table entries one call reads: "
            "pass fewer sequences"
        )
    for name, t in (("block_tables", bt), ("seq_lens", sl)):
        if t.device != device:
            raise InvalidArgumentError(f"{name} is on {t.device} but the cache is on {device}: move it there")
    return bt, sl


def check_writable_cache(key_cache: object, value_cache: object) -> tuple[torch.Tensor, torch.Tensor]:
    """``check_cache``, and keys and values in memory of their own: a write to one must not land in the other.

    Reading one tensor as both is attention with K = V, so only the calls that write refuse it.
    """
    kc, vc = check_cache(key_cache, value_cache)
    if kc.data_ptr() == vc.data_ptr() and kc.stride() == vc.stride():
        raise InvalidArgumentError(
            "key_cache and value_cache are the same memory, so writing values would overwrite the keys: "
            "give keys and values a tensor each (layer_pool returns the pair)"
        )
    return kc, vc


def _refuse_expanded(name: str, cache: torch.Tensor) -> None:
    """A KV pool holds its own memory: a zero stride (an ``expand``ed view) claims sizes no memory backs.

    Nor may two slots share memory (an ``as_strided`` view whose strides overlap), or writing one
    would change another: taken from the smallest stride up, each dimension must step past all of
    the ones inside it, as every permuted or sliced view of a real tensor does.
    """
    dims = [(stride, size) for size, stride in zip(cache.shape, cache.stride(), strict=True) if size > 1]
    if any(stride == 0 for stride, _ in dims):
        raise InvalidArgumentError(
            f"{name} is an expanded view (a zero stride, shape {tuple(cache.shape)}): a KV pool holds a "
            f"value for every slot; pass {name}.contiguous() or a real pool"
        )
    dims.sort()
    if any(outer < inner * size for (inner, size), (outer, _) in zip(dims, dims[1:], strict=False)):
        raise InvalidArgumentError(
            f"{name}'s strides {cache.stride()} make slots of shape {tuple(cache.shape)} share memory: a KV pool "
            f"holds a value for every slot; pass {name}.contiguous() or a pool from layer_pool"
        )


def _check_tables(
    block_tables: object,
    seq_lens: object,
    num_seqs: int,
    block_size: int,
    num_blocks: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    bt, sl = _check_table_tensors(block_tables, seq_lens, num_seqs, device)
    if num_seqs == 0:
        return bt, sl
    high, _, _ = _check_host_tables(bt, sl, block_size, num_blocks)
    return bt[:, : cdiv(high, block_size)], sl  # the columns past the longest sequence are never read


def host_ints(tensor: torch.Tensor) -> np.ndarray:
    """An integer tensor's values as int64 numpy (a negated view, torch._neg_view, resolved first).

    A GPU tensor is copied to the host: its checks read values into Python anyway (a sync),
    and these are index tables, small next to the pool.
    """
    return tensor.resolve_neg().cpu().numpy().astype(np.int64, copy=False)


def _check_host_tables(
    bt: torch.Tensor, sl: torch.Tensor, block_size: int, num_blocks: int, own: bool = False
) -> tuple[int, np.ndarray, np.ndarray]:
    """``_check_tables``' value checks, in numpy (a decode step feels torch's per-op cost).

    Returns the longest length and the host arrays checked: the lengths and the table's
    columns up to the longest sequence (int64). They may share memory with the tensors
    unless ``own``: then each is copied before it is checked, so what was checked is what
    is kept, whatever writes the caller's tensors meanwhile.
    """
    lens = host_ints(sl).copy() if own else host_ints(sl)
    low = int(lens.min())
    if low < 1:
        raise InvalidArgumentError(f"seq_lens must be at least 1 (the new token is in the cache), got {low}")
    high = int(lens.max())
    _check_reach(int(lens.argmax()), high, bt.shape, block_size)
    table = host_ints(bt[:, : cdiv(high, block_size)])
    table = table.copy() if own else table
    if table.min() >= 0 and table.max() < num_blocks:  # the usual case: no entry to look at more closely
        return high, lens, table
    used = np.arange(table.shape[1])[None, :] < ((lens + block_size - 1) // block_size)[:, None]
    bad = used & ((table < 0) | (table >= num_blocks))
    if bad.any():
        seq, col = (int(x) for x in np.argwhere(bad)[0])
        _refuse_block_id(seq, col, int(table[seq, col]), num_blocks)
    return high, lens, table


def _check_reach(seq: int, tokens: int, table_shape: torch.Size, block_size: int) -> None:
    """Refuse a longest sequence past ``LIMITS.tokens`` or its table, or a table part too big to read.

    Checked on the lengths alone, before any array the size of the tables is made: an
    expanded table can claim any width without holding it.
    """
    num_seqs, columns = table_shape
    if tokens > LIMITS.tokens:
        raise InvalidArgumentError(
            f"sequence {seq} has {tokens:,} tokens; kvlab's paged attention takes at most {LIMITS.tokens:,} "
            "a sequence: shorten it"
        )
    if tokens > columns * block_size:
        raise InvalidArgumentError(
            f"sequence {seq} has {tokens} tokens but its block table holds {columns} blocks of {block_size} "
            f"= {columns * block_size} tokens: widen block_tables or shorten the sequence"
        )
    entries = num_seqs * cdiv(tokens, block_size)
    if entries > MAX_TABLE_ENTRIES:
        raise InvalidArgumentError(
            f"the block tables' columns up to the longest sequence hold {num_seqs:,} x {cdiv(tokens, block_size):,} "
            f"= {entries:,} entries, more than the {MAX_TABLE_ENTRIES:,} one call reads: pass fewer or shorter "
            "sequences, or larger blocks"
        )


def _refuse_block_id(seq: int, col: int, block: int, num_blocks: int) -> None:
    raise InvalidArgumentError(
        f"block_tables[{seq}, {col}] = {block} is outside the pool of {num_blocks} blocks "
        f"(valid ids 0..{num_blocks - 1})"
    )


def _check_query(query: object, kc: torch.Tensor) -> torch.Tensor:
    """The decode query against a checked cache: [num_seqs, num_heads, head_dim], its dtype and device."""
    q = _check_tensor("query", query, 3, "[num_seqs, num_heads, head_dim]")
    if q.dtype != kc.dtype:
        raise InvalidArgumentError(f"query is {q.dtype} but the cache is {kc.dtype}: use one dtype")
    if q.device != kc.device:
        raise InvalidArgumentError(f"query is on {q.device} but the cache on {kc.device}: move them together")
    num_kv_heads, head_dim = kc.shape[2:]
    num_heads, q_dim = q.shape[1:]
    if q_dim != head_dim:
        raise InvalidArgumentError(f"query head_dim {q_dim} does not match the cache's head_dim {head_dim}")
    if num_heads % num_kv_heads:
        raise InvalidArgumentError(
            f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads} (grouped-query attention)"
        )
    return q


def check_decode_args(
    query: object,
    key_cache: object,
    value_cache: object,
    block_tables: object,
    seq_lens: object,
    scale: object,
) -> tuple[PagedShape, float]:
    """Validate ``paged_attention``'s arguments; return the sizes and the scale."""
    shape, scale_, _ = _check_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)
    return shape, scale_


def _check_decode(query, key_cache, value_cache, block_tables, seq_lens, scale):
    """``check_decode_args`` and the step's ``DecodePlan`` made from the values it checked."""
    # the query's type and dimensions first, as it is named first (its dtype and device after the caches)
    _check_tensor("query", query, 3, "[num_seqs, num_heads, head_dim]")
    kc, vc = check_cache(key_cache, value_cache)
    q = _check_query(query, kc)
    plan = _make_plan(block_tables, seq_lens, kc, q.shape[0])
    return _paged_shape(q, kc, plan), _check_scale(scale, kc.shape[3]), plan


def _paged_shape(q: torch.Tensor, kc: torch.Tensor, plan: DecodePlan) -> PagedShape:
    num_blocks, block_size, num_kv_heads, head_dim = kc.shape
    return PagedShape(
        q.shape[0], q.shape[1], num_kv_heads, head_dim, num_blocks, block_size, plan._block_tables.shape[1]
    )


@dataclass(frozen=True, eq=False)
class DecodePlan:
    """One decode step's block tables and lengths, checked once and shared by every layer.

    All of a model's layers attend through the same tables in a step, so vLLM builds its
    attention metadata once per step (``FlashAttentionMetadataBuilder.build`` in vLLM 0.33)
    and FlashInfer splits ``plan()`` from ``run()``. ``plan_decode`` checks the tables
    against a layer's pool and keeps private copies, so a later change to the caller's
    tensors cannot reach what was checked; ``attend`` runs one layer, checking only its
    query and caches, and the compiled CPU kernel's chunk tables are made on the first
    ``attend`` and reused by the rest. Make a new plan when the tables or lengths change
    (every step: each sequence grows by one token). Only the plans ``plan_decode`` returns
    run: one built by hand, or copied with other fields (``dataclasses.replace``), is refused.
    ``impl`` and ``scale`` are keywords, as in ``paged_attention``.
    """

    num_seqs: int
    num_blocks: int
    block_size: int
    device: torch.device
    _block_tables: torch.Tensor = field(repr=False)  # [num_seqs, columns up to the longest sequence]
    _seq_lens: torch.Tensor = field(repr=False)
    total_tokens: int = 0  # the step's cached tokens, all sequences
    _chunks: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict, repr=False)
    _weightless: dict[int, torch.Tensor | None] = field(default_factory=dict, repr=False)

    def _chunk_tables(self, chunk_blocks: int) -> tuple[torch.Tensor, ...]:
        """The compiled kernel's chunk tables for chunks of ``chunk_blocks`` blocks (``_chunk_blocks``), made once."""
        plan = self._chunks.get(chunk_blocks)
        if plan is None:
            plan = self._chunks[chunk_blocks] = _chunk_plan(
                self._block_tables, self._seq_lens, self.block_size, chunk_blocks
            )
        return plan

    def _weightless_blocks(self, chunk_blocks: int) -> torch.Tensor | None:
        """``_weightless_blocks`` for this plan's tables, made once per chunk size."""
        if chunk_blocks not in self._weightless:
            self._weightless[chunk_blocks] = _weightless_blocks(
                self._seq_lens, self._block_tables, self.block_size, chunk_blocks
            )
        return self._weightless[chunk_blocks]

    def attend(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        *,
        scale: float | None = None,
        impl: str = "auto",
    ) -> torch.Tensor:
        """``paged_attention`` for one layer of this step: the same result, without checking the tables again."""
        if self not in _ISSUED_PLANS:
            raise InvalidArgumentError(
                "this DecodePlan was not made by plan_decode, so its tables were never checked: "
                "make plans with plan_decode(block_tables, seq_lens, key_cache)"
            )
        impl = _check_impl(impl, DECODE_IMPLS)
        kc, vc = check_cache(key_cache, value_cache)
        if kc.shape[:2] != (self.num_blocks, self.block_size) or kc.device != self.device:
            raise InvalidArgumentError(
                f"this plan was made for a pool of {self.num_blocks} blocks of {self.block_size} tokens on "
                f"{self.device}, but the caches are {tuple(kc.shape[:2])} on {kc.device}: make a plan for "
                "this pool (plan_decode)"
            )
        q = _check_query(query, kc)
        if q.shape[0] != self.num_seqs:
            raise InvalidArgumentError(
                f"query holds {q.shape[0]} sequences but this plan {self.num_seqs}: one query row per sequence"
            )
        return _decode(q, kc, vc, self, _paged_shape(q, kc, self), _check_scale(scale, kc.shape[3]), impl)


# the very plans plan_decode made, whose tables were checked (a plan built by hand, or a copy by
# dataclasses.replace whose fields may no longer match its tables, is not among them)
_ISSUED_PLANS: weakref.WeakSet[DecodePlan] = weakref.WeakSet()


def plan_decode(block_tables: torch.Tensor, seq_lens: torch.Tensor, key_cache: torch.Tensor) -> DecodePlan:
    """Check one decode step's ``block_tables`` and ``seq_lens`` against a layer's pool, once for every layer.

    ``key_cache`` is any layer's key pool ([num_blocks, block_size, num_kv_heads, head_dim]);
    only its sizes and device are read. ``plan.attend(query, key_cache, value_cache)`` then
    equals ``paged_attention(query, key_cache, value_cache, block_tables, seq_lens)`` for
    each layer's caches.
    """
    kc = _check_pool("key_cache", key_cache)
    bt = _check_tensor("block_tables", block_tables, 2, "[num_seqs, max_blocks_per_seq]")
    sl = _check_tensor("seq_lens", seq_lens, 1, "[num_seqs]")
    if bt.shape[0] != sl.shape[0]:
        raise InvalidArgumentError(
            f"block_tables has {bt.shape[0]} rows but seq_lens {sl.shape[0]} entries: give one of each per sequence"
        )
    return _make_plan(bt, sl, kc, sl.shape[0])


def _make_plan(block_tables: object, seq_lens: object, kc: torch.Tensor, num_seqs: int) -> DecodePlan:
    """Check the tables' tensors and values; keep private copies of what the kernels will read."""
    num_blocks, block_size = kc.shape[:2]
    bt, sl = _check_table_tensors(block_tables, seq_lens, num_seqs, kc.device)
    total = 0
    if num_seqs == 0:
        bt, sl = bt[:, :0].resolve_neg().clone(), sl.resolve_neg().clone()
    else:  # the kernels read the very arrays that were checked (a GPU's are copied back to it)
        _, lens, table = _check_host_tables(bt, sl, block_size, num_blocks, own=True)
        bt, sl = torch.from_numpy(table).to(kc.device), torch.from_numpy(lens).to(kc.device)
        total = int(lens.sum())
    plan = DecodePlan(num_seqs, num_blocks, block_size, kc.device, bt, sl, total)
    _ISSUED_PLANS.add(plan)
    return plan


def _check_impl(impl: object, allowed: tuple[str, ...]) -> str:
    if type(impl) is not str:  # exactly str: a subclass's own __eq__ could answer differently each time
        raise InvalidArgumentError(f"impl must be one of {', '.join(allowed)}, got {brief(impl)}")
    if impl == "flex" and "flex" not in allowed:
        raise InvalidArgumentError("impl='flex' is for decode only; use one of " + ", ".join(allowed))
    if impl not in allowed:
        raise InvalidArgumentError(f"unknown impl {impl!r}: use one of {', '.join(allowed)}")
    return impl


def _triton_interpreted() -> bool:
    """Whether kvlab's Triton kernel runs in Triton's interpreter (on a CPU), as ``TRITON_INTERPRET=1`` set before import makes it."""
    if not triton_available():
        return False
    import triton.language.standard as triton_standard
    from triton.runtime.interpreter import InterpretedFunction

    from kvlab.engine.triton_paged import paged_decode_kernel

    # Triton's own helpers are decorated when triton is imported: set later, the variable reaches only kvlab's kernel
    return all(isinstance(f, InterpretedFunction) for f in (paged_decode_kernel, triton_standard.cdiv))


def triton_available() -> bool:
    """Whether ``import triton`` works here (it does not on every CPU-only install)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------- decode


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Decode attention: each sequence's one query token over its ``seq_lens[s]`` cached tokens.

    ``query`` [num_seqs, num_heads, head_dim]; the caches [num_blocks, block_size,
    num_kv_heads, head_dim]; ``block_tables`` int [num_seqs, max_blocks_per_seq];
    ``seq_lens`` int [num_seqs]. Returns [num_seqs, num_heads, head_dim] in the
    query's dtype. ``scale`` defaults to 1/sqrt(head_dim). A model whose layers share
    one step's tables checks them once with ``plan_decode`` and calls ``plan.attend``.
    """
    impl = _check_impl(impl, DECODE_IMPLS)
    shape, scale_, plan = _check_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)
    return _decode(query, key_cache, value_cache, plan, shape, scale_, impl)


def refuse_triton_off_gpu(impl: str, device: torch.device) -> None:
    """impl='triton' on a CPU tensor is refused, unless Triton's interpreter runs it there."""
    if impl == "triton" and device.type != "cuda" and not _triton_interpreted():
        raise InvalidArgumentError(
            "impl='triton' runs on a GPU: pass CUDA tensors, or use impl='torch' on the CPU "
            "(Triton's interpreter, TRITON_INTERPRET=1 set before triton is imported, runs it on a CPU slowly)"
        )


def _decode(query, key_cache, value_cache, plan: DecodePlan, shape: PagedShape, scale_: float, impl: str):
    """The decode after its checks: the tables are the plan's private copies."""
    if impl == "auto":
        impl = "triton" if query.is_cuda and triton_available() else "torch"
    refuse_triton_off_gpu(impl, query.device)
    if impl == "triton" and query.dtype == torch.float64:
        raise InvalidArgumentError(
            "impl='triton' takes float16, bfloat16 or float32, not float64; use impl='torch'"
        )
    if query.requires_grad:
        raise InvalidArgumentError(
            "query requires grad; kvlab's paged attention is for inference: pass query.detach()"
        )
    if query.dtype != torch.float64 and scale_ > torch.finfo(torch.float32).max:
        raise InvalidArgumentError(
            f"scale {scale_:g} is past float32's range, where {query.dtype} queries are computed: "
            "use a smaller scale (1/sqrt(head_dim) is usual) or float64"
        )
    if shape.num_seqs == 0 or shape.num_heads == 0:
        return query.new_empty(query.shape)
    query = query.resolve_neg()  # a negated view (torch._neg_view) as plain values: kernels read raw memory
    # the plan's private copies of the tables: the columns any sequence reaches
    block_tables, seq_lens = plan._block_tables, plan._seq_lens
    if impl == "reference":
        return _reference_decode(query, key_cache, value_cache, block_tables, seq_lens, scale_, shape)
    if impl == "torch":
        return _torch_decode(query, key_cache, value_cache, plan, scale_, shape)
    if impl == "flex":
        return flex_decode(query, key_cache, value_cache, block_tables, seq_lens, scale_, shape)
    if not triton_available():
        raise InvalidArgumentError(
            "impl='triton' needs the triton package: pip install triton (or use impl='torch')"
        )
    from kvlab.engine.triton_paged import triton_paged_attention

    return triton_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, scale=scale_)


def gather_sequence(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's first ``seq_len`` tokens of ``cache`` as a dense [seq_len, num_kv_heads, head_dim] tensor."""
    block_size = cache.shape[1]
    n_blocks = cdiv(seq_len, block_size)
    blocks = block_table_row[:n_blocks].to(torch.int64)
    return cache.index_select(0, blocks).reshape(n_blocks * block_size, *cache.shape[2:])[:seq_len]


def _dense_attention_f64(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None
):
    """q [n, H, D], k/v [t, Hkv, D] -> [n, H, D], in float64; ``mask`` [n, t] True where allowed."""
    group = q.shape[1] // k.shape[1]
    k = k.to(torch.float64).repeat_interleave(group, dim=1)
    v = v.to(torch.float64).repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,thd->hnt", q.to(torch.float64), k) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hnt,thd->nhd", torch.softmax(scores, dim=-1), v)


def _reference_decode(query, key_cache, value_cache, block_tables, seq_lens, scale, shape: PagedShape):
    out = torch.empty_like(query)
    for s, n in enumerate(seq_lens.tolist()):
        k = gather_sequence(key_cache, block_tables[s], n)
        v = gather_sequence(value_cache, block_tables[s], n)
        out[s] = _dense_attention_f64(query[s : s + 1], k, v, scale, None)[0].to(query.dtype)
    return out


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are computed in float32 (as a kernel accumulates); float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _cpu_flash() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """torch's CPU flash-attention kernel with its log-sum-exp (what SDPA runs on a CPU), if this torch has it."""
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _torch_decode(query, key_cache, value_cache, plan: DecodePlan, scale, shape: PagedShape):
    """``impl="torch"``: the compiled CPU decode for big calls, else the per-sequence walk.

    The compiled kernel (``compiled_decode``) reads K and V in place, in a few
    fused C++ loop nests per step that every thread shares; the walk pays a gather
    copy and Python's per-op cost per tile, and a second thread has little to
    do in its small ops. Small calls keep the walk: a first call compiles for
    seconds, which only a big call repays. The batched tiles
    (``_batched_decode``) are exact too but never won against the walk at one
    thread; the benchmark times all three.
    """
    block_tables, seq_lens = plan._block_tables, plan._seq_lens
    if _compiled_decode_applies(
        query, key_cache, value_cache, plan.total_tokens, shape
    ) and _weightless_finite(value_cache, plan, shape):
        out = compiled_decode(query, key_cache, value_cache, block_tables, seq_lens, scale, shape, plan=plan)
        if out is not None:
            return out
    return _torch_walk(query, key_cache, value_cache, block_tables, seq_lens, scale, shape)


# ---------------------------------------------------------------------------- compiled CPU decode


@dataclass
class CompiledDecode:
    """How ``impl="torch"``'s compiled CPU decode runs here, kept for the process.

    ``fn`` is the one cached ``torch.compile`` of ``_chunked_decode_graph``;
    ``kinds`` the (dtype, block size, KV heads, group, head_dim, pool layout) it has run;
    ``over_limit`` the kinds dynamo would not compile again (its recompile
    limit: they run the walk); ``failure`` why compiling failed, if it did
    (every call then runs the walk, and a warning said so once); ``enabled``
    False sends every call to the walk (tests compare the two).
    """

    fn: Callable[..., torch.Tensor] | None = None
    kinds: set[tuple] = field(default_factory=set)
    over_limit: set[tuple] = field(default_factory=set)
    failure: str | None = None
    enabled: bool = True


COMPILED = CompiledDecode()


def compile_available() -> bool:
    """Whether ``torch.compile`` can build a CPU kernel here: inductor imports and a C++ compiler is on PATH."""
    import shutil

    try:
        import torch._inductor  # noqa: F401
    except ImportError:  # pragma: no cover - a torch without inductor
        return False
    return any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++"))


def _weightless_blocks(seq_lens, block_tables, block_size: int, chunk_blocks: int) -> torch.Tensor | None:
    """The blocks whose values the compiled kernel weighs by 0 somewhere, as an index tensor (None: none).

    A partial last block's slots past the end (never written: a fresh pool is
    ``torch.empty`` memory), and a short last chunk's padding, which repeats the
    sequence's last block. 0 * inf and 0 * nan are nan, so a call whose such blocks hold
    anything but finite values runs the walk, which reads only real slots (vLLM's kernel
    zeroes the last block's values past the context length for the same reason).
    """
    lens = host_ints(seq_lens)
    n_blocks = (lens + block_size - 1) // block_size
    chosen = np.flatnonzero((lens % block_size != 0) | (n_blocks % chunk_blocks != 0))
    if chosen.size == 0:
        return None
    last = np.unique(host_ints(block_tables)[chosen, n_blocks[chosen] - 1])
    return torch.from_numpy(last).to(block_tables.device)


def _weightless_finite(value_cache, plan: DecodePlan, shape: PagedShape) -> bool:
    """Whether every block the compiled kernel weighs by 0 somewhere holds finite values (one test of them all)."""
    blocks = plan._weightless_blocks(_chunk_blocks(shape, value_cache.element_size()))
    return blocks is None or _blocks_finite(value_cache, blocks)


def _blocks_finite(value_cache: torch.Tensor, blocks: torch.Tensor) -> bool:
    """Whether the pool's ``blocks`` hold only finite values, summed row by row rather than gathered.

    A sum holds inf or nan exactly when one of its terms does (or when finite values
    overflow it, which sends the call to the walk: slower, still exact). Gathering the
    blocks first costs a fresh buffer, page faults included, every call: 8 MiB for 32
    blocks of 16 tokens x 32 KV heads x 128 floats, 10 ms against 0.8 ms for the sums.
    """
    rows = _block_rows(value_cache)
    if rows is None:  # a strided pool: gather its blocks
        return bool(torch.isfinite(value_cache.index_select(0, blocks)).all())
    sums = torch.nn.functional.embedding_bag(blocks.view(1, -1), rows, mode="sum")
    return bool(torch.isfinite(sums).all())


def _block_rows(cache: torch.Tensor) -> torch.Tensor | None:
    """The pool as [num_blocks, numbers of a block], a view in the pool's own memory order; None if it has none."""
    layout = pool_layout(cache)
    if layout == "strided":
        return None
    ordered = cache if layout == "token-major" else cache.permute(0, 2, 1, 3)
    return ordered.view(cache.shape[0], -1)


def _compiled_decode_applies(query, key_cache, value_cache, total_tokens: int, shape: PagedShape) -> bool:
    """A CPU call in float32/16/bf16, without autograd, reading at least ``COMPILED_MIN_BYTES`` of K and V."""
    if not COMPILED.enabled or COMPILED.failure is not None or query.device.type != "cpu":
        return False
    if torch._dynamo.config.disable:  # torch.compile would run the graph eagerly: gathers and all
        return False
    if query.dtype == torch.float64 or any(t.requires_grad for t in (query, key_cache, value_cache)):
        return False
    kind = _compiled_kind(query, key_cache, value_cache, shape)
    if kind in COMPILED.over_limit or (
        kind not in COMPILED.kinds and len(COMPILED.kinds) >= COMPILED_MAX_KINDS
    ):
        return False
    per_token = 2 * shape.num_kv_heads * shape.head_dim * key_cache.element_size()
    return total_tokens * per_token >= COMPILED_MIN_BYTES


def _compiled_kind(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, shape: PagedShape
) -> tuple:
    """What one compile of the decode serves: dtype, block size, KV heads, group, head_dim and the pool's layout.

    The layout is part of it because the generated C++ bakes in the pool's strides.
    """
    return (
        query.dtype,
        shape.block_size,
        shape.num_kv_heads,
        shape.group,
        shape.head_dim,
        _layouts(key_cache, value_cache),
    )


def _layouts(key_cache: torch.Tensor, value_cache: torch.Tensor) -> str:
    """The pool's layout, or both where keys and values differ ("token-major/head-major")."""
    key, value = pool_layout(key_cache), pool_layout(value_cache)
    return key if key == value else f"{key}/{value}"


def _members_per_pass(group: int) -> int:
    """The query heads one pass over a KV head's rows serves: the largest divisor of ``group`` up to ``PASS_MEMBERS``."""
    return max(m for m in range(1, min(group, PASS_MEMBERS) + 1) if group % m == 0)


def _by_pass(gathered: torch.Tensor, passes: int) -> torch.Tensor:
    """[C, chunk_blocks, block_size, kv_heads, head_dim] as [C, kv_heads * passes, chunk_blocks, block_size, head_dim].

    Each KV head's rows read ``passes`` times, once per pass of its query heads: an
    expanded view, which inductor reads in place. Run eagerly the reshape would copy K or
    V ``passes`` times over, so ``_compiled_decode_applies`` sends a call to the walk when
    dynamo is disabled.
    """
    c, cb, bs, kv, d = gathered.shape
    by_kv = gathered.permute(0, 3, 1, 2, 4)[:, :, None]
    return by_kv.expand(c, kv, passes, cb, bs, d).reshape(c, kv * passes, cb, bs, d)


def _chunked_decode_graph(
    query, scale, key_cache, value_cache, chunk_table, chunk_seq, chunk_valid, seq_chunks, used
):
    """The compiled decode, written so that inductor fuses every gather into the loop that reads it.

    ``query`` [num_seqs, kv_heads, group, head_dim] in the cache's dtype; ``scale`` (a float32
    scalar tensor) multiplies each score, once per score rather than once per query element,
    which inductor would repeat inside every score's sum; the plan has one sequence more than
    ``query`` has rows (its extra one, dropped here, so no eager op follows the kernel), and the
    result is [num_seqs, heads, head_dim] in the cache's dtype;
    chunk ``c`` is the blocks ``chunk_table[c]``, scored with query row ``chunk_seq[c]``,
    its first ``chunk_valid[c]`` tokens real; ``seq_chunks[s]`` lists sequence
    ``s``'s chunks (``used`` False on padding). Scores are an elementwise
    product summed over head_dim, not a matmul, so the indexed load of each key
    row sits inside the reduction (a vectorised loop over head_dim) and the
    gathered keys never exist; likewise each value row inside the weighted
    sum. Each chunk gets its own max, sum and output; a sequence's chunks are
    then merged exactly by their maxima (flash-decoding's split, one chunk a
    split). Short chunks keep every reduction short: inductor sums into one
    register, so a long sum waits on each add in turn.

    The query heads that share a KV head are served in passes of ``PASS_MEMBERS``
    (``_members_per_pass``), each pass written as that many reductions over the same
    [chunk, pass, ...] ranges, one per member, not one reduction over an expanded head
    axis: inductor fuses reductions of equal ranges that read the same buffer into one
    loop nest, so in a pass each key and value row is loaded once and feeds one fused
    multiply-add per member, each into its own register, as a matrix product blocked over
    the group would (at 32 x 2k tokens, 8 KV heads, 4 query heads each, one thread:
    0.94-0.97x SDPA against 1.18-1.21x for one reduction over all 32 heads, which loads
    each row 4 times).

    The scores' loop nest runs chunk, block, pass, token (the keys' view transposed): in a
    head-major pool that reads each block's keys front to back, one KV head's rows after
    another, where chunk, pass, block, token (the values' order) jumps between the chunk's
    blocks for every head. At 8 x 512 tokens, 8 KV heads, on a 2-core AMD EPYC with the
    cache flushed between calls, the first order took 0.86-0.97x SDPA's time against
    1.08-1.12x for the second; values read in the first order too were slower again. The
    scores (a few KiB a chunk) are written out and read back by the loop nest of their
    maximum, exponentials and sum.
    """
    num_chunks, chunk_blocks = chunk_table.shape
    block_size = key_cache.shape[1]
    group = query.shape[2]
    members = _members_per_pass(group)
    # keys [C, chunk_blocks, kv_heads * passes, block_size, head_dim], values [C, kv_heads * passes,
    # chunk_blocks, block_size, head_dim]: views, never materialised
    keys = _by_pass(key_cache[chunk_table].float(), group // members).transpose(1, 2)
    values = _by_pass(value_cache[chunk_table].float(), group // members)
    chunk_query = query[chunk_seq].float().reshape(num_chunks, -1, members, query.shape[3])
    position = torch.arange(chunk_blocks * block_size, device=query.device).view(
        1, chunk_blocks, 1, block_size
    )
    valid = position < chunk_valid.view(-1, 1, 1, 1)
    maxima_, sums_, outs_ = [], [], []
    for member in range(members):  # the query heads of one pass over a KV head's rows
        # [C, chunk_blocks, kv_heads * passes, block_size]
        scores = (keys * chunk_query[:, None, :, member, None, :]).sum(-1) * scale
        scores = torch.where(valid, scores, float("-inf"))
        chunk_max = scores.amax(dim=(1, 3))  # [C, kv_heads * passes]
        weights = torch.exp(scores - chunk_max[:, None, :, None])
        maxima_.append(chunk_max)
        sums_.append(weights.sum(dim=(1, 3)))
        # slots past a sequence's end get weight 0 here, so they must hold finite values (0 * nan is
        # nan): _torch_decode sends a call whose unwritten slots hold nan or inf to the walk, which zeroes them
        weights = weights.permute(0, 2, 1, 3)  # [C, kv_heads * passes, chunk_blocks, block_size]
        outs_.append((weights[..., None] * values).sum(dim=(2, 3)))  # [C, kv_heads * passes, head_dim]
    # [C, heads]: head h is pass h // members (of KV head h // group), member h % members
    chunk_max = torch.stack(maxima_, dim=2).flatten(1)
    chunk_sum = torch.stack(sums_, dim=2).flatten(1)
    chunk_out = torch.stack(outs_, dim=2).flatten(1, 2)  # [C, heads, head_dim]
    # [sequences + 1, most chunks + 1, heads]: the plan's extra sequence and padding column
    maxima = torch.where(used[:, :, None], chunk_max[seq_chunks], float("-inf"))
    weight = torch.exp(maxima - maxima.amax(dim=1, keepdim=True))  # each chunk's share, by its maximum
    total = (weight * chunk_sum[seq_chunks]).sum(dim=1)
    out = (weight[..., None] * chunk_out[seq_chunks]).sum(dim=1) / total[..., None]
    return out[:-1].to(key_cache.dtype)


def _chunk_blocks(shape: PagedShape, element_size: int) -> int:
    """Blocks per chunk of the compiled decode: about ``COMPILED_CHUNK_TOKENS`` tokens, fewer for wide rows."""
    row_bytes = shape.num_kv_heads * shape.head_dim * element_size
    tokens = COMPILED_CHUNK_TOKENS if row_bytes <= COMPILED_WIDE_ROW_BYTES else COMPILED_WIDE_CHUNK_TOKENS
    return max(1, round(tokens / shape.block_size))


def _chunk_plan(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, chunk_blocks: int):
    """Cut every sequence into chunks of ``chunk_blocks`` blocks: the index tensors ``_chunked_decode_graph`` reads.

    A short last chunk repeats the sequence's last block (always valid; its
    tokens are past ``chunk_valid`` and masked), so no table entry past a
    sequence's end is read. Padding in ``seq_chunks`` repeats a real chunk.
    One extra one-token sequence (block 0, its result dropped; its chunk reads
    the last real query row, so the queries need no padded copy) and one extra
    padding column keep every dynamic size of the plan at least 2: torch.compile
    specialises sizes 0 and 1, and would compile again for a single sequence.
    Computed in numpy (CPU tensors only): these are a few dozen small arrays, and
    numpy's per-call cost is a fraction of torch's, which a small decode call feels.
    """
    tables = host_ints(block_tables)
    lens = np.append(host_ints(seq_lens), 1)
    tables = np.concatenate([tables, np.zeros((1, tables.shape[1]), dtype=np.int64)])
    n_blocks = (lens + block_size - 1) // block_size
    n_chunks = (n_blocks + chunk_blocks - 1) // chunk_blocks
    chunk_seq = np.repeat(np.arange(lens.size), n_chunks)
    first = np.cumsum(n_chunks) - n_chunks
    index = np.arange(chunk_seq.size) - first[chunk_seq]
    cols = index[:, None] * chunk_blocks + np.arange(chunk_blocks)[None, :]
    cols = np.minimum(cols, (n_blocks[chunk_seq] - 1)[:, None])
    chunk_table = tables[chunk_seq[:, None], cols]
    chunk_valid = np.minimum(lens[chunk_seq] - index * chunk_blocks * block_size, chunk_blocks * block_size)
    slot = np.arange(int(n_chunks.max()) + 1)[None, :]
    seq_chunks = np.minimum(first[:, None] + slot, (first + n_chunks - 1)[:, None])
    used = slot < n_chunks[:, None]
    # the extra sequence reads a real query row, so the queries need no padded copy
    query_row = np.minimum(chunk_seq, lens.size - 2)
    return tuple(torch.from_numpy(a) for a in (chunk_table, query_row, chunk_valid, seq_chunks, used))


def compiled_decode(
    query,
    key_cache,
    value_cache,
    block_tables,
    seq_lens,
    scale,
    shape: PagedShape,
    plan: DecodePlan | None = None,
):
    """``_chunked_decode_graph`` compiled by inductor (a C++ kernel), or None where compiling is not possible.

    Sizes that change between calls (sequences, chunks, pool blocks) are
    marked dynamic, so one kind compiles once or twice, not once per batch;
    past dynamo's recompile limit, or if compiling fails, the call returns
    None and the caller runs the walk (a failure warns once and turns this
    path off for the process).
    """
    kind = _compiled_kind(query, key_cache, value_cache, shape)
    if COMPILED.fn is None:
        if not compile_available():
            COMPILED.failure = "torch.compile needs inductor and a C++ compiler (g++ or clang++)"
            return None
        keep_freed_memory()  # every call's scratch is reused, not page-faulted in again (kvlab.engine.memory)
        COMPILED.fn = torch.compile(_chunked_decode_graph, fullgraph=True, options=COMPILE_OPTIONS)
    chunk_blocks = _chunk_blocks(shape, key_cache.element_size())
    chunks = (
        _chunk_plan(block_tables, seq_lens, shape.block_size, chunk_blocks)
        if plan is None
        else plan._chunk_tables(chunk_blocks)  # made by the step's first layer, reused by the rest
    )
    # the queries as they are (the kernel scales them; the plan's extra sequence reads the last real row)
    q = query.reshape(shape.num_seqs, shape.num_kv_heads, shape.group, shape.head_dim)
    args = (q, _scale_tensor(scale), key_cache, value_cache, *chunks)
    if kind not in COMPILED.kinds:  # once compiled with these sizes symbolic, later calls reuse that graph
        for tensor, dims in zip(args, _DYNAMIC_DIMS, strict=True):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
    config = torch._dynamo.config
    saved = config.fail_on_recompile_limit_hit, config.recompile_limit
    try:  # set and restored by hand: config.patch costs a context manager's setup on every call
        config.fail_on_recompile_limit_hit, config.recompile_limit = True, 64
        with torch.no_grad():
            out = COMPILED.fn(*args)
    except Exception as exc:  # noqa: BLE001 - any compiler failure: say so once, then run the walk
        if "recompile" in type(exc).__name__.lower():
            COMPILED.over_limit.add(kind)
            return None
        lines = str(exc).splitlines()
        reason = next((line.strip() for line in lines if "error" in line.lower()), lines[0] if lines else "")
        COMPILED.failure = f"{type(exc).__name__}: {reason[:200]}"
        warnings.warn(
            f"torch.compile of the CPU paged decode failed ({COMPILED.failure}); impl='torch' runs the "
            "per-sequence walk",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    finally:
        config.fail_on_recompile_limit_hit, config.recompile_limit = saved
    COMPILED.kinds.add(kind)
    return out


# the sizes that change between calls, per argument of _chunked_decode_graph: sequences, pool blocks, chunks
_DYNAMIC_DIMS = ((0,), (), (0,), (0,), (0,), (0,), (0,), (0, 1), (0, 1))

_SCALES: dict[float, torch.Tensor] = {}


def _scale_tensor(scale: float) -> torch.Tensor:
    """``scale`` as a float32 scalar tensor, made once per value (a few are kept).

    A tensor, not a float, so that the compiled decode does not compile again for every
    scale (dynamo specialises on a float argument's value).
    """
    tensor = _SCALES.get(scale)
    if tensor is None:
        if len(_SCALES) >= 16:
            _SCALES.clear()
        tensor = _SCALES[scale] = torch.tensor(scale, dtype=torch.float32)
    return tensor


def _batched_decode(
    query,
    key_cache,
    value_cache,
    block_tables,
    seq_lens,
    scale,
    shape: PagedShape,
    tile_tokens: int | None = None,
):
    """Chunks of every sequence batched into tiles, each tile one call of torch's CPU flash kernel.

    Every sequence is cut into chunks of ``tile_tokens`` tokens (whole blocks).
    Chunks of many sequences are gathered together into one small reused
    buffer (a tile of about ``BATCH_TILE_BYTES`` of keys, so it stays in the
    CPU cache) and attended by torch's CPU flash kernel in one call, which
    spreads the (chunk, KV head) pairs over all threads and returns each
    chunk's log-sum-exp. Chunks of one sequence are then merged exactly:
    weights ``softmax`` of their log-sum-exps. Short last chunks are padded to
    a power of two of blocks with a repeated valid block, hidden by an additive mask.

    Why tiles of many sequences: one call per tile, not per sequence, so
    Python's per-op cost is paid per megabyte, not per sequence, and a second
    thread has work even when each sequence is short.
    """
    flash = _cpu_flash()
    work = _work_dtype(query.dtype)
    bs, hkv, group, dim = shape.block_size, shape.num_kv_heads, shape.group, shape.head_dim
    per_token = hkv * dim * torch.finfo(work).bits // 8
    if tile_tokens is None:
        tile_tokens = max(MIN_TILE_TOKENS, min(MAX_TILE_TOKENS, CHUNK_BYTES // per_token))
    chunk_blocks = max(1, tile_tokens // bs)
    lens = seq_lens.to(torch.int64)
    n_blocks = (lens + bs - 1) // bs
    n_chunks = (n_blocks + chunk_blocks - 1) // chunk_blocks
    max_chunks = int(n_chunks.max())
    # one row per (sequence, chunk): its sequence, chunk number, first block and valid tokens
    pair_seq = torch.repeat_interleave(torch.arange(shape.num_seqs), n_chunks)
    starts = torch.cumsum(n_chunks, 0) - n_chunks
    pair_chunk = torch.arange(pair_seq.numel()) - starts[pair_seq]
    first_block = pair_chunk * chunk_blocks
    pair_blocks = torch.clamp(n_blocks[pair_seq] - first_block, max=chunk_blocks)
    pair_valid = torch.clamp(lens[pair_seq] - first_block * bs, max=chunk_blocks * bs)
    # tile widths: a whole chunk, or a power of two of blocks for a short last chunk (few distinct shapes)
    width = torch.where(
        pair_blocks == chunk_blocks,
        chunk_blocks,
        torch.clamp(
            2 ** torch.ceil(torch.log2(pair_blocks.to(torch.float64))).to(torch.int64), max=chunk_blocks
        ),
    )
    tables = block_tables.to(torch.int64)
    q_all = (query.to(work) * scale).view(shape.num_seqs, hkv, group, dim)
    out_pairs = torch.empty((pair_seq.numel(), hkv, group, dim), dtype=work)
    lse_pairs = torch.empty((pair_seq.numel(), hkv, group), dtype=work)
    for w in torch.unique(width).tolist():
        rows = (width == w).nonzero()[:, 0]
        cols = first_block[rows, None] + torch.arange(w)[None, :]
        last = (first_block[rows] + pair_blocks[rows] - 1)[:, None]
        ids = tables[pair_seq[rows, None], torch.minimum(cols, last)]  # pad with the chunk's last block
        _attend_tiles(
            flash, q_all, key_cache, value_cache, rows, pair_seq, pair_valid, ids, work, out_pairs, lse_pairs
        )
    if max_chunks == 1:
        out = out_pairs
    else:
        lse_pad = lse_pairs.new_full((shape.num_seqs, max_chunks, hkv, group), float("-inf"))
        out_pad = out_pairs.new_zeros((shape.num_seqs, max_chunks, hkv, group, dim))
        lse_pad[pair_seq, pair_chunk] = lse_pairs
        out_pad[pair_seq, pair_chunk] = out_pairs
        weights = torch.softmax(lse_pad, dim=1).to(work)
        out = torch.einsum("scgh,schgd->shgd", weights.transpose(2, 3), out_pad)
    return out.reshape(shape.num_seqs, shape.num_heads, dim).to(query.dtype)


def _attend_tiles(
    flash, q_all, key_cache, value_cache, rows, pair_seq, pair_valid, ids, work, out_pairs, lse_pairs
):
    """Attend the chunks ``rows`` (all ``ids.shape[1]`` blocks wide) a tile at a time into ``out_pairs``/``lse_pairs``."""
    _, bs, hkv, dim = key_cache.shape
    width = ids.shape[1]
    tokens = width * bs
    per_tile = max(1, BATCH_TILE_BYTES // (tokens * hkv * dim * key_cache.element_size()))
    size = (min(per_tile, rows.numel()) * width, bs, hkv, dim)
    k_buf, v_buf = key_cache.new_empty(size), value_cache.new_empty(size)
    positions = torch.arange(tokens)
    for first in range(0, rows.numel(), per_tile):
        part = slice(first, first + per_tile)
        tile_rows = rows[part]
        n = tile_rows.numel()
        flat = ids[part].reshape(-1)
        k = torch.index_select(key_cache, 0, flat, out=k_buf[: n * width])
        v = torch.index_select(value_cache, 0, flat, out=v_buf[: n * width])
        k = k.view(n, tokens, hkv, dim).transpose(1, 2).to(work)
        v = v.view(n, tokens, hkv, dim).transpose(1, 2).to(work)
        valid = pair_valid[tile_rows]
        mask = None
        if int(valid.min()) < tokens:
            hidden = positions[None, :] >= valid[:, None]
            mask = torch.zeros((n, 1, 1, tokens), dtype=work).masked_fill_(
                hidden.view(n, 1, 1, tokens), float("-inf")
            )
        out, lse = flash(q_all[pair_seq[tile_rows]], k, v, 0.0, False, attn_mask=mask, scale=1.0)
        out_pairs[tile_rows] = out
        lse_pairs[tile_rows] = lse


def _torch_walk(
    query,
    key_cache,
    value_cache,
    block_tables,
    seq_lens,
    scale,
    shape: PagedShape,
    tile_tokens: int | None = None,
):
    """Online softmax over tiles of whole blocks, one sequence at a time (any device).

    For each sequence: gather one tile of its blocks into a small reused buffer
    (it stays in the CPU cache), score it for all heads with one batched matmul
    (each KV head's group of query heads against that head's keys, read in
    place through strides), and fold it into the running max ``m``, sum ``l``
    and accumulator ``acc``. Only one tile is ever gathered.

    Why per sequence: a tile of one sequence, viewed ``[kv_heads, head_dim,
    tokens]``, is a batch of matrices with one uniform stride, so the matmul
    reads it without a copy; a tile of several sequences is not, and the copy
    that torch would make costs more than the Python loop saves. Tile widths
    are the tile size or a power of two of blocks, so a BLAS backend that
    prepares a kernel per shape sees few shapes.
    """
    work = _work_dtype(query.dtype)
    device = query.device
    bs, hkv, group, dim = shape.block_size, shape.num_kv_heads, shape.group, shape.head_dim
    if tile_tokens is None:
        per_token = hkv * dim * torch.finfo(work).bits // 8
        tile_tokens = max(MIN_TILE_TOKENS, min(MAX_TILE_TOKENS, TILE_BYTES // per_token))
    tile_blocks = max(1, tile_tokens // bs)
    lens = seq_lens.to(torch.int64).tolist()
    tables = block_tables.to(torch.int64)
    q_all = (query.to(work) * scale).view(shape.num_seqs, hkv, group, dim)
    out = torch.empty((shape.num_seqs, hkv, group, dim), dtype=work, device=device)
    buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for s, n in enumerate(lens):
        n_blocks = cdiv(n, bs)
        width = tile_blocks if n_blocks >= tile_blocks else 1 << (n_blocks - 1).bit_length()
        if width not in buffers:
            size = (width, bs, hkv, dim)
            buffers[width] = (key_cache.new_empty(size), value_cache.new_empty(size))
        k_buf, v_buf = buffers[width]
        # pad the table to whole tiles with the sequence's first block (always valid); the mask hides it
        n_cols = cdiv(n_blocks, width) * width
        row = tables[s, :n_blocks]
        if n_cols > n_blocks:
            row = torch.cat([row, row[:1].expand(n_cols - n_blocks)])
        q = q_all[s]
        m = torch.full((hkv, group, 1), float("-inf"), dtype=work, device=device)
        l_sum = torch.zeros_like(m)
        acc = torch.zeros((hkv, group, dim), dtype=work, device=device)
        for first in range(0, n_blocks, width):
            ids = row[first : first + width]
            torch.index_select(key_cache, 0, ids, out=k_buf)
            k = k_buf.view(width * bs, hkv, dim).to(work)
            scores = torch.matmul(q, k.permute(1, 2, 0))  # [hkv, group, tokens]
            valid = n - first * bs
            if valid < width * bs:
                scores[..., valid:] = float("-inf")
            m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
            p = scores.sub_(m_new).exp_()
            alpha = torch.sub(m, m_new).exp_()  # rescales what earlier tiles summed (0 before the first)
            l_sum.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
            torch.index_select(value_cache, 0, ids, out=v_buf)
            v = v_buf.view(width * bs, hkv, dim)
            if valid < width * bs:  # never-written slots may hold nan: 0 * nan would poison the sum
                v[valid:] = 0
            v = v.to(work)
            acc.mul_(alpha).baddbmm_(p, v.transpose(0, 1))  # [hkv, group, dim]
            m = m_new
        out[s] = acc / l_sum
    return out.view(shape.num_seqs, shape.num_heads, dim).to(query.dtype)


# ---------------------------------------------------------------------------- FlexAttention


@dataclass
class FlexBackend:
    """How ``impl="flex"`` runs here, kept for the process.

    ``compiled_fn`` is the one cached ``torch.compile(flex_attention)``;
    ``failures`` maps a (dtype, block size) that torch could not compile to
    why (that kind then runs eagerly; e.g. torch 2.13's CPU template emits C++
    that does not build for 1-token blocks).
    """

    compiled_fn: Callable[..., torch.Tensor] | None = None
    compiled: set[tuple[torch.dtype, int]] = field(default_factory=set)
    failures: dict[tuple[torch.dtype, int], str] = field(default_factory=dict)


FLEX_BACKEND = FlexBackend()


def flex_available() -> bool:
    """Whether this torch has FlexAttention (torch >= 2.5)."""
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def flex_mode(dtype: torch.dtype, block_size: int) -> str:
    """'compiled' or 'eager': how the next ``impl="flex"`` call with this dtype and block size will run."""
    if dtype == torch.float64 or (dtype, block_size) in FLEX_BACKEND.failures:
        return "eager"
    return "compiled"


def _flex_block_mask(block_tables: torch.Tensor, seq_lens: torch.Tensor, shape: PagedShape):
    """The paged block mask: sequence ``s`` visits exactly the physical blocks its table row names.

    As in attention-gym's ``PagedAttention.convert_logical_block_mask``: whole
    blocks are "full" kv blocks (no mask_mod call), the last, partial block is
    a masked kv block, and the mask_mod maps a physical slot to its logical
    position through ``physical_to_logical`` [num_seqs, num_blocks] (-1: not
    this sequence's). The eager path ignores block sparsity and evaluates the
    mask_mod everywhere, so the mask_mod alone is the whole truth.
    """
    from torch.nn.attention.flex_attention import BlockMask

    device, bs = block_tables.device, shape.block_size
    num_seqs, width = block_tables.shape
    # owners, physical_to_logical and the mask's kv indices: about four int64 [num_seqs, num_blocks] tensors
    mask_bytes = 4 * 8 * num_seqs * shape.num_blocks
    if mask_bytes > LIMITS.memory_mib * 2**20:
        raise InvalidArgumentError(
            f"impl='flex' builds its block mask over every block of the pool for every sequence: "
            f"{num_seqs:,} sequences x {shape.num_blocks:,} blocks would take {mask_bytes >> 20:,} MiB, more than "
            f"{LIMITS.memory_mib:,} (LIMITS.memory_mib); use impl='torch', fewer sequences or a smaller pool"
        )
    lens = seq_lens.to(device=device, dtype=torch.int64)
    n_blocks = (lens + bs - 1) // bs
    n_full = lens // bs
    cols = torch.arange(width, device=device)
    used = cols[None, :] < n_blocks[:, None]
    table = torch.where(used, block_tables.to(torch.int64), 0)
    rows = torch.arange(num_seqs, device=device)[:, None].expand(num_seqs, width)
    owners = torch.zeros((num_seqs, shape.num_blocks), dtype=torch.int64, device=device)
    owners.index_put_(
        (rows[used], table[used]), torch.ones((), dtype=torch.int64, device=device), accumulate=True
    )
    if bool((owners > 1).any()):
        seq = int((owners > 1).any(dim=1).nonzero()[0])
        raise InvalidArgumentError(
            f"impl='flex' needs each sequence's blocks to be distinct, but block_tables[{seq}] names a block "
            "twice; use impl='torch'"
        )
    physical_to_logical = torch.full((num_seqs, shape.num_blocks), -1, dtype=torch.int32, device=device)
    physical_to_logical[rows[used], table[used]] = cols[None, :].expand(num_seqs, width)[used].to(torch.int32)
    # as many index columns as the pool has blocks: the compiled kernel needs the mask to span the KV length
    span = max(width, shape.num_blocks)
    full_indices = torch.zeros((num_seqs, span), dtype=torch.int32, device=device)
    full_indices[:, :width] = torch.where(cols[None, :] < n_full[:, None], table, 0)
    partial_indices = torch.zeros_like(full_indices)
    partial_indices[:, 0] = table.gather(1, (n_blocks - 1).clamp(min=0)[:, None])[:, 0].to(torch.int32)
    partial_count = (lens > n_full * bs).to(torch.int32)
    lens32 = lens.to(torch.int32)

    def mask_mod(b, h, q_idx, kv_idx):
        logical = physical_to_logical[b, kv_idx // bs]
        return (logical >= 0) & (logical * bs + kv_idx % bs < lens32[b])

    def view(t: torch.Tensor) -> torch.Tensor:
        return t.view(num_seqs, 1, 1, *t.shape[1:])

    args = (view(partial_count), view(partial_indices), view(n_full.to(torch.int32)), view(full_indices))
    kwargs = {
        "BLOCK_SIZE": (FLEX_Q_BLOCK, bs),
        "mask_mod": mask_mod,
        "seq_lengths": (shape.group, shape.num_blocks * bs),  # a KV head's query heads are its query rows
    }
    try:  # the query-side index only serves the backward pass; skip building it where torch allows
        return BlockMask.from_kv_blocks(*args, **kwargs, compute_q_blocks=False)
    except TypeError:  # pragma: no cover - torch < 2.6
        return BlockMask.from_kv_blocks(*args, **kwargs)


def _flex_call(kind: tuple[torch.dtype, int] | None, *args, **kwargs) -> torch.Tensor:
    """flex_attention compiled (``kind`` = (dtype, block size)) or eager (``kind`` None)."""
    from torch.nn.attention.flex_attention import flex_attention

    if kind is None:
        return flex_attention(*args, **kwargs)
    if FLEX_BACKEND.compiled_fn is None:
        # static shapes: torch 2.13's CPU flex template emits C++ that does not build once dynamo makes the
        # query rows or the KV length symbolic, as it does when shapes change (cur_qSplitSize4 /
        # cur_kvSplitSize8 "not declared"; in one process the fifth of six shapes turned the kind eager);
        # each new shape compiles anew instead, up to FLEX_RECOMPILE_LIMIT shapes, past which the call
        # raises and the kind runs eagerly
        FLEX_BACKEND.compiled_fn = torch.compile(flex_attention, dynamic=False)
    try:
        with torch._dynamo.config.patch(
            fail_on_recompile_limit_hit=True, recompile_limit=FLEX_RECOMPILE_LIMIT
        ):
            out = FLEX_BACKEND.compiled_fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any compiler failure: say so once, then run eager
        lines = str(exc).splitlines()
        reason = next((line.strip() for line in lines if "error" in line.lower()), lines[0] if lines else "")
        FLEX_BACKEND.failures[kind] = f"{type(exc).__name__}: {reason[:200]}"
        warnings.warn(
            f"torch.compile of flex_attention failed for {kind[0]} with {kind[1]}-token blocks "
            f"({FLEX_BACKEND.failures[kind]}); impl='flex' runs those eagerly",
            RuntimeWarning,
            stacklevel=3,
        )
        return flex_attention(*args, **kwargs)
    FLEX_BACKEND.compiled.add(kind)
    return out


def _unwritten_nonfinite(value_cache, block_tables, seq_lens, block_size: int) -> tuple[int, int, int] | None:
    """The first (sequence, block, slot) past a sequence's end in its last block that holds nan or inf, if any.

    Those slots were never written (a fresh pool is ``torch.empty`` memory). A kernel that
    weighs them by 0 still gets nan from them (0 * nan is nan); vLLM's kernel zeroes the last
    block's values past the context length for this reason. Only each sequence's last block
    is read; the index math is numpy (a decode step feels torch's per-op cost).
    """
    lens = host_ints(seq_lens)
    tail = lens % block_size
    partial = np.flatnonzero(tail)
    if partial.size == 0:  # every last block is full: nothing past an end
        return None
    last = host_ints(block_tables)[partial, (lens[partial] - 1) // block_size]
    blocks = value_cache.index_select(0, torch.from_numpy(last).to(value_cache.device))
    finite = torch.isfinite(blocks).flatten(2).all(dim=2).cpu().numpy()
    bad = np.argwhere((np.arange(block_size)[None, :] >= tail[partial][:, None]) & ~finite)
    if len(bad) == 0:
        return None
    row, slot = (int(x) for x in bad[0])
    return int(partial[row]), int(last[row]), slot


def _check_unwritten_values(value_cache, block_tables, seq_lens, shape: PagedShape) -> None:
    """Refuse nan or inf in the slots past each sequence's end in its last block, which flex weighs by 0."""
    found = _unwritten_nonfinite(value_cache, block_tables, seq_lens, shape.block_size)
    if found is not None:
        seq, block, slot = found
        raise InvalidArgumentError(
            f"value_cache block {block} holds nan or inf in slot {slot}, past the end of sequence {seq}: "
            "impl='flex' weighs such slots by 0, and 0 * nan is nan; zero the unwritten slots, or use "
            "impl='torch'"
        )


def flex_views(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches as FlexAttention reads them, [1, num_kv_heads, num_blocks * block_size, head_dim] views.

    That is one run of tokens per KV head, which a token-major pool (or a slice of one) allows
    and a head-major one does not: refused with kvlab's error, naming each cache's layout.
    """
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    try:
        return tuple(  # type: ignore[return-value]
            c.view(1, num_blocks * block_size, num_kv_heads, head_dim).transpose(1, 2)
            for c in (key_cache, value_cache)
        )
    except RuntimeError:
        named = f"key_cache is {pool_layout(key_cache)}, value_cache is {pool_layout(value_cache)}"
        raise InvalidArgumentError(
            f"impl='flex' reads the pool as one run of tokens per KV head, which needs token-major caches "
            f"({named}): make the pool token-major (layer_pool(..., layout='token-major'), "
            "KVPool(..., layout='token-major'), or key_cache.contiguous() and value_cache.contiguous()), "
            "or use impl='torch'"
        ) from None


def flex_decode(
    query, key_cache, value_cache, block_tables, seq_lens, scale, shape: PagedShape, *, compiled=None
):
    """Decode through FlexAttention over the pool viewed as [1, num_kv_heads, num_blocks * block_size, head_dim].

    ``compiled`` None: compiled where it works (not for float64), else eager;
    True/False forces one (tests use eager for many shapes, compiled for few).
    """
    if not flex_available():
        raise InvalidArgumentError("impl='flex' needs torch >= 2.5 (FlexAttention); use impl='torch'")
    k, v = flex_views(key_cache, value_cache)  # refused before the block mask is built
    mask = _flex_block_mask(block_tables, seq_lens, shape)
    if compiled is None:
        compiled = flex_mode(query.dtype, shape.block_size) == "compiled"
    _check_unwritten_values(value_cache, block_tables, seq_lens, shape)
    # grouped: each KV head's query heads are the query rows of one attention over that head's keys, so a
    # block of keys is read once per KV head, not once per query head (decode is exact this way)
    q = query.view(shape.num_seqs, shape.num_kv_heads, shape.group, shape.head_dim)
    out = _flex_call(
        (query.dtype, shape.block_size) if compiled else None, q, k, v, block_mask=mask, scale=scale
    )
    return out.reshape(query.shape)


# ---------------------------------------------------------------------------- prefill


def slot_mapping(block_table_row: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """The pool slot of each token position: ``table[p // block_size] * block_size + p % block_size``.

    vLLM computes the same in ``vllm/v1/worker/block_table.py``. Returns int64.
    """
    pos = positions.to(torch.int64)
    return block_table_row.to(torch.int64)[pos // block_size] * block_size + pos % block_size


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Store ``key``/``value`` [num_tokens, num_kv_heads, head_dim] at pool ``slots`` (vLLM's reshape_and_cache).

    A slot of -1 skips its token (vLLM pads batches that way).
    """
    kc, vc = check_writable_cache(key_cache, value_cache)
    _check_kv_rows(key, value, kc)
    sl = _check_tensor("slots", slots, 1, "[num_tokens]")
    _check_int_tensor("slots", sl)
    if sl.shape[0] != key.shape[0]:
        raise InvalidArgumentError(
            f"slots has {sl.shape[0]} entries for {key.shape[0]} tokens: give one per token"
        )
    _write_slots(key, value, kc, vc, _checked_slots(sl, kc))


def _check_kv_rows(key: object, value: object, kc: torch.Tensor) -> None:
    k = _check_tensor("key", key, 3, "[num_tokens, num_kv_heads, head_dim]")
    v = _check_tensor("value", value, 3, "[num_tokens, num_kv_heads, head_dim]")
    if k.shape != v.shape or tuple(k.shape[1:]) != tuple(kc.shape[2:]):
        raise InvalidArgumentError(
            f"key {tuple(k.shape)} and value {tuple(v.shape)} must both be [num_tokens, "
            f"{kc.shape[2]}, {kc.shape[3]}] to match the cache"
        )
    if k.dtype != kc.dtype or v.dtype != kc.dtype:
        raise InvalidArgumentError(
            f"key/value are {k.dtype}/{v.dtype} but the cache is {kc.dtype}: use one dtype"
        )
    if k.device != kc.device or v.device != kc.device:
        raise InvalidArgumentError("key, value and the cache must be on one device")


def _checked_slots(slots: torch.Tensor, kc: torch.Tensor) -> torch.Tensor:
    s = slots.to(torch.int64)
    capacity = kc.shape[0] * kc.shape[1]
    if s.numel() and (int(s.min()) < -1 or int(s.max()) >= capacity):
        bad = int(s[(s < -1) | (s >= capacity)][0])
        raise InvalidArgumentError(
            f"slot {bad} is outside the pool's {capacity} slots (use -1 to skip a token)"
        )
    return s


def _write_slots(key, value, kc, vc, slots: torch.Tensor) -> None:
    """Each kept token's rows into (block, offset) = divmod(slot, block_size), through the pool's own strides."""
    keep = slots >= 0
    blocks, offsets = slots[keep] // kc.shape[1], slots[keep] % kc.shape[1]
    kc[blocks, offsets] = key[keep]
    vc[blocks, offsets] = value[keep]


def paged_prefill(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: torch.Tensor,
    *,
    scale: float | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Write the new tokens' K/V through the slot mapping, then attend causally over prefix + new tokens.

    The new tokens are packed: sequence ``s`` contributes ``query_lens[s]`` rows
    of ``query`` [num_tokens, num_heads, head_dim] and of ``key``/``value``
    [num_tokens, num_kv_heads, head_dim], in order. They are the last tokens of
    a sequence that is ``seq_lens[s]`` long after this call, so its first
    ``seq_lens[s] - query_lens[s]`` tokens must already be in the cache (a prefix
    hit). The new token at position ``p`` attends to positions ``0..p``.
    Nothing is written unless every argument is valid.
    """
    impl = _check_impl(impl, PREFILL_IMPLS)
    q = _check_tensor("query", query, 3, "[num_tokens, num_heads, head_dim]")
    kc, vc = check_writable_cache(key_cache, value_cache)
    _check_kv_rows(key, value, kc)
    if key.shape[0] != q.shape[0]:
        raise InvalidArgumentError(
            f"query has {q.shape[0]} tokens but key/value {key.shape[0]}: give one row each"
        )
    if q.dtype != kc.dtype or q.device != kc.device:
        raise InvalidArgumentError(
            f"query ({q.dtype}, {q.device}) must match the cache ({kc.dtype}, {kc.device})"
        )
    if q.shape[2] != kc.shape[3] or q.shape[1] % kc.shape[2]:
        raise InvalidArgumentError(
            f"query [*, {q.shape[1]}, {q.shape[2]}] needs head_dim {kc.shape[3]} and a multiple of "
            f"{kc.shape[2]} heads"
        )
    ql = _check_tensor("query_lens", query_lens, 1, "[num_seqs]")
    _check_int_tensor("query_lens", ql)
    bt, sl = _check_tables(block_tables, seq_lens, ql.shape[0], kc.shape[1], kc.shape[0], kc.device)
    q_lens = ql.to(torch.int64).tolist()
    s_lens = sl.to(torch.int64).tolist()
    if any(n < 1 for n in q_lens) or sum(q_lens) != q.shape[0]:
        raise InvalidArgumentError(
            f"query_lens {q_lens} must be positive and add up to the {q.shape[0]} query tokens"
        )
    if any(n > t for n, t in zip(q_lens, s_lens, strict=True)):
        raise InvalidArgumentError(
            f"query_lens {q_lens} cannot exceed seq_lens {s_lens}: new tokens are part of the sequence"
        )
    scale_ = _check_scale(scale, kc.shape[3])
    slots = (
        torch.cat(
            [
                slot_mapping(bt[s], torch.arange(t - n, t, device=kc.device), kc.shape[1])
                for s, (n, t) in enumerate(zip(q_lens, s_lens, strict=True))
            ]
        )
        if q_lens
        else torch.empty(0, dtype=torch.int64, device=kc.device)
    )
    # validated: from here on the cache changes
    _write_slots(key, value, kc, vc, slots)
    out = torch.empty_like(q)
    start = 0
    for s, (n, t) in enumerate(zip(q_lens, s_lens, strict=True)):
        k = gather_sequence(kc, bt[s], t)
        v = gather_sequence(vc, bt[s], t)
        rows = slice(start, start + n)
        # query i sits at position t - n + i and may see keys 0 .. t - n + i
        mask = torch.arange(t, device=kc.device)[None, :] <= torch.arange(t - n, t, device=kc.device)[:, None]
        if impl == "reference":
            out[rows] = _dense_attention_f64(q[rows], k, v, scale_, mask).to(q.dtype)
        else:
            out[rows] = _sdpa_causal(q[rows], k, v, scale_, mask)
        start += n
    return out


def _sdpa_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor
) -> torch.Tensor:
    """torch's fused attention on one gathered sequence; q [n, H, D], k/v [t, Hkv, D], ``mask`` [n, t].

    The n new queries are the last n rows of a causal t x t attention. When
    they are at least half of it, the queries are padded at the front with
    zeros (rows that are computed and dropped) so that torch can run plain
    causal attention, which skips the upper triangle; that costs t*t/2 scores
    against n*t with an explicit mask. Inputs are 4-D so that torch's CPU
    flash kernel, not the much slower math fallback, runs.
    """
    work = _work_dtype(q.dtype)
    n, t = q.shape[0], k.shape[0]
    pad = 2 * n >= t
    if pad and n < t:
        q = torch.cat([q.new_zeros((t - n, *q.shape[1:])), q])
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None].to(work),
        k.transpose(0, 1)[None].to(work),
        v.transpose(0, 1)[None].to(work),
        attn_mask=None if pad else mask,
        is_causal=pad,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out[0, :, -n:].transpose(0, 1).to(q.dtype)
