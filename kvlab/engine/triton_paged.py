"""A Triton paged-attention decode kernel (``paged_attention(..., impl="triton")``).

Grid: one program per (sequence, KV head, split). A program loads the query
rows of every head in the KV head's group once, then walks its share of the
sequence a tile of ``TILE`` tokens at a time. For each token it looks the
physical block up in the block table and loads the key and value rows from the
pool, so every K/V block is read once for all the query heads that share it
(GQA) -- the point of grouping on a memory-bound decode step. Scores and the
weighted values are ``tl.dot``s, with an online softmax in float32 (base-2
exponentials; the scale is folded into ``log2(e)``).

The tile is a fixed number of tokens, not one block, so block sizes 1..TILE all
use the same ``tl.dot`` shapes (which need every side >= 16): a tile may span
several blocks, and the group's query heads are padded to 16 rows.

Split-K: with few sequences there are too few programs to fill a GPU, so each
sequence can be cut into ``num_splits`` ranges; every program writes a partial
result and its log-sum-exp, and a short torch merge combines them.

Set ``TRITON_INTERPRET=1`` *before* importing this module to run the kernel on
the CPU with Triton's interpreter (slow; its bf16 ``tl.dot`` is not exact, so
bf16 is checked on a GPU only).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvlab.errors import cdiv

LOG2E = 1.4426950408889634
MIN_DOT = 16  # tl.dot needs M, N, K >= 16


@triton.jit
def paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    lens_ptr,
    out_ptr,
    lse_ptr,
    qk_scale,
    stride_q_seq,
    stride_q_head,
    stride_k_block,
    stride_k_tok,
    stride_k_head,
    stride_v_block,
    stride_v_tok,
    stride_v_head,
    stride_table_seq,
    stride_o_seq,
    stride_o_head,
    stride_o_split,
    stride_l_seq,
    stride_l_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, TILE)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tok_start = split * tiles_per_split * TILE
    tok_end = tl.minimum(tok_start + tiles_per_split * TILE, seq_len)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    q = tl.load(
        q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    table_row = table_ptr + seq.to(tl.int64) * stride_table_seq

    for t0 in range(tok_start, tok_end, TILE):
        toks = t0 + tl.arange(0, TILE)
        tok_ok = toks < tok_end
        block = tl.load(table_row + toks // BLOCK_SIZE, mask=tok_ok, other=0).to(tl.int64)
        offset = toks % BLOCK_SIZE
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        k_rows = block * stride_k_block + offset * stride_k_tok + kv_head * stride_k_head
        k = tl.load(k_ptr + k_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = tl.where(tok_ok[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_rows = block * stride_v_block + offset * stride_v_tok + kv_head * stride_v_head
        v = tl.load(v_ptr + v_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has = l_i > 0.0
    out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    o_ptrs = (
        out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + split * stride_o_split + dims[None, :]
    )
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    if NUM_SPLITS > 1:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))  # base 2
        tl.store(lse_ptr + seq * stride_l_seq + heads * stride_l_head + split, lse, mask=row_ok)


def kernel_constants(
    block_size: int, head_dim: int, group: int, num_splits: int, dtype: torch.dtype, tile: int | None = None
) -> dict[str, object]:
    """The constexpr arguments for one launch (also used to compile ahead of time in the tests)."""
    if tile is None:
        tile = 64
    return {
        "BLOCK_SIZE": block_size,
        "HEAD_DIM": head_dim,
        "DIM_PAD": max(MIN_DOT, triton.next_power_of_2(head_dim)),
        "GROUP": group,
        "GROUP_PAD": max(MIN_DOT, triton.next_power_of_2(group)),
        "TILE": max(MIN_DOT, triton.next_power_of_2(tile)),
        "NUM_SPLITS": num_splits,
        # float32 stays exact (no TF32 rounding); half inputs use the tensor cores as they are
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
    }


def compile_ahead(
    capability: int = 90,
    *,
    dtype: torch.dtype = torch.bfloat16,
    block_size: int = 16,
    head_dim: int = 128,
    group: int = 4,
    num_splits: int = 4,
) -> triton.compiler.CompiledKernel:
    """Compile the kernel for an NVIDIA GPU of compute ``capability`` (90: H100/H200) with no GPU present.

    Runs Triton's whole pipeline (Triton IR -> PTX -> cubin with the bundled
    ``ptxas``). It needs the real compiler, so it cannot run in a process that
    set ``TRITON_INTERPRET=1``.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = paged_decode_kernel
    if not hasattr(kernel, "arg_names"):
        raise RuntimeError(
            "the kernel was built for the interpreter (TRITON_INTERPRET=1); compile in a fresh process"
        )
    element = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}[dtype]
    consts = kernel_constants(block_size, head_dim, group, num_splits, dtype)
    out_type = element if num_splits == 1 else "*fp32"
    pointers = {"table_ptr": "*i32", "lens_ptr": "*i32", "out_ptr": out_type, "lse_ptr": "*fp32"}
    signature = {}
    for name in kernel.arg_names:
        if name in consts:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, element)
        else:
            signature[name] = "fp32" if name == "qk_scale" else "i32"
    source = ASTSource(kernel, signature, constexprs=consts)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32))


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device, tile: int
) -> int:
    """Enough programs to keep every GPU core busy (about 8 per SM), never splits shorter than 4 tiles."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = cdiv(8 * sms, max(1, num_seqs * num_kv_heads))
    most = max(1, cdiv(max_seq_len, 4 * tile))
    return int(max(1, min(want, most, 32)))


def triton_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    num_splits: int | None = None,
    tile: int = 64,
) -> torch.Tensor:
    """Launch the kernel on validated arguments (``paged_attention`` checks them first)."""
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    tables = block_tables.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    q = query.contiguous()
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.stride(3) != 1:
            raise ValueError(
                f"{name} must have a contiguous head_dim"
            )  # pragma: no cover - callers pass views rarely
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, int(lens.max()), query.device, tile)
    consts = kernel_constants(block_size, head_dim, group, num_splits, query.dtype, tile)
    if num_splits == 1:
        out = torch.empty_like(q)
        lse = torch.empty(1, dtype=torch.float32, device=q.device)
        o_strides = (out.stride(0), out.stride(1), 0, 0, 0)
    else:
        out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
        o_strides = (out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1))
    grid = (num_seqs, num_kv_heads, num_splits)
    paged_decode_kernel[grid](
        q,
        key_cache,
        value_cache,
        tables,
        lens,
        out,
        lse,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        tables.stride(0),
        *o_strides,
        **consts,
    )
    if num_splits == 1:
        return out
    weights = torch.exp2(lse - lse.amax(dim=-1, keepdim=True))  # every sequence has a non-empty first split
    merged = (out * weights[..., None]).sum(dim=2) / weights.sum(dim=-1)[..., None]
    return merged.to(query.dtype)
