import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import kvlab.engine.attention as attention  # noqa: E402
from kvlab.engine import paged_attention, paged_prefill, slot_mapping, write_kv_cache  # noqa: E402
from kvlab.engine.attention import (  # noqa: E402
    CompiledDecode,
    _batched_decode,
    _torch_walk,
    check_decode_args,
    compile_available,
    compiled_decode,
    flex_available,
)
from kvlab.errors import InvalidArgumentError  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def make_case(
    lens,
    block_size,
    num_kv_heads,
    group,
    head_dim=32,
    dtype=torch.float32,
    seed=0,
    spare_blocks=3,
    layout="token-major",
):
    """Dense per-sequence K/V scattered into shuffled physical blocks; unused table entries hold garbage.

    ``layout="head-major"`` returns the same pool with each block's KV heads' rows side by side in memory.
    """
    gen = torch.Generator().manual_seed(seed)
    num_heads = num_kv_heads * group
    keys = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype) for n in lens]
    values = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype) for n in lens]
    query = torch.randn(len(lens), num_heads, head_dim, generator=gen).to(dtype)
    blocks_needed = [-(-n // block_size) for n in lens]
    num_blocks = sum(blocks_needed) + spare_blocks
    physical = torch.randperm(num_blocks, generator=gen)
    width = max(blocks_needed) + 2
    tables = torch.full((len(lens), width), 10**6, dtype=torch.int32)  # never read: far outside the pool
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    used = 0
    for s, n in enumerate(lens):
        for b in range(blocks_needed[s]):
            block = int(physical[used])
            used += 1
            tables[s, b] = block
            rows = slice(b * block_size, min(n, (b + 1) * block_size))
            key_cache[block, : rows.stop - rows.start] = keys[s][rows]
            value_cache[block, : rows.stop - rows.start] = values[s][rows]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    if layout == "head-major":
        key_cache, value_cache = (head_major(c) for c in (key_cache, value_cache))
    return query, key_cache, value_cache, tables, seq_lens, keys, values


def head_major(cache):
    """The same pool, each block's KV heads one after another in memory (what layer_pool gives on the CPU)."""
    return cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def dense_f64(query, keys, values, scale=None):
    """Float64 attention of each sequence's query row over its dense keys (the test's own oracle)."""
    out = []
    for s, (k, v) in enumerate(zip(keys, values, strict=True)):
        q = query[s].double()
        group = q.shape[0] // k.shape[1]
        k2 = k.double().repeat_interleave(group, dim=1)
        v2 = v.double().repeat_interleave(group, dim=1)
        sc = scale if scale is not None else q.shape[-1] ** -0.5
        w = torch.softmax(torch.einsum("hd,thd->ht", q, k2) * sc, dim=-1)
        out.append(torch.einsum("ht,thd->hd", w, v2))
    return torch.stack(out)


LENS = [1, 7, 16, 17, 100, 300, 1100]  # 1100 tokens span several tiles of the torch walk


@pytest.mark.parametrize("impl", ["reference", "torch"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_matches_float64_dense_attention(impl, block_size, group, dtype):
    q, kc, vc, bt, sl, keys, values = make_case(
        LENS, block_size, 2, group, dtype=dtype, seed=block_size + group
    )
    out = paged_attention(q, kc, vc, bt, sl, impl=impl)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.double(), dense_f64(q, keys, values), atol=TOLERANCE[dtype], rtol=0)


def test_torch_decode_in_bfloat16_and_float64():
    for dtype, atol in ((torch.bfloat16, 1e-2), (torch.float64, 1e-12)):
        q, kc, vc, bt, sl, keys, values = make_case([3, 40, 270], 16, 2, 4, dtype=dtype)
        out = paged_attention(q, kc, vc, bt, sl, impl="torch")
        torch.testing.assert_close(out.double(), dense_f64(q, keys, values), atol=atol, rtol=0)


def test_auto_is_torch_on_the_cpu_and_scale_is_used():
    q, kc, vc, bt, sl, keys, values = make_case([5, 33], 16, 1, 2)
    auto = paged_attention(q, kc, vc, bt, sl, scale=0.3)
    torch.testing.assert_close(
        auto, paged_attention(q, kc, vc, bt, sl, scale=0.3, impl="torch"), atol=0, rtol=0
    )
    torch.testing.assert_close(auto.double(), dense_f64(q, keys, values, scale=0.3), atol=1e-5, rtol=0)


def _check_shared_blocks_and_an_int64_table() -> None:
    """Two sequences share physical blocks (a prefix hit) through an int64 table: still exact."""
    q, kc, vc, bt, sl, keys, values = make_case([40], 16, 2, 4)
    tables = torch.stack([bt[0], bt[0]]).to(torch.int64)
    query = torch.cat([q, q.flip(-1)])
    out = paged_attention(query, kc, vc, tables, torch.tensor([40, 20]), impl="torch")
    expected = dense_f64(query, [keys[0], keys[0][:20]], [values[0], values[0][:20]])
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


def test_shared_blocks_and_an_int64_table():
    """Two sequences may share physical blocks (a prefix hit); a table may be int64."""
    _check_shared_blocks_and_an_int64_table()


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.integers(1, 90), min_size=1, max_size=5),
    block_size=st.sampled_from([1, 2, 5, 16, 32]),
    group=st.sampled_from([1, 2, 4]),
    tile_tokens=st.sampled_from([None, 1, 16, 40]),
    seed=st.integers(0, 2**16),
)
def test_torch_decode_equals_the_reference_on_random_shapes(lens, block_size, group, tile_tokens, seed):
    """Any chunk size (several chunks per sequence, padded last chunks) gives the reference's answer,
    in the batched CPU path and in the per-sequence walk that other devices use."""
    q, kc, vc, bt, sl, _, _ = make_case(lens, block_size, 2, group, head_dim=16, seed=seed)
    shape, scale = check_decode_args(q, kc, vc, bt, sl, None)
    expected = paged_attention(q, kc, vc, bt, sl, impl="reference")
    for decode in (_batched_decode, _torch_walk):
        out = decode(q, kc, vc, bt, sl, scale, shape, tile_tokens=tile_tokens)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_many_sequences_of_mixed_lengths_in_one_call():
    """A serving step: 40 sequences, lengths 1..1500, several tiles, chunks and padded widths."""
    lens = [1 + (37 * i * i) % 1500 for i in range(40)]
    q, kc, vc, bt, sl, keys, values = make_case(lens, 16, 2, 4, head_dim=16, seed=11)
    expected = dense_f64(q, keys, values)
    shape, scale = check_decode_args(q, kc, vc, bt, sl, None)
    torch.testing.assert_close(
        _batched_decode(q, kc, vc, bt, sl, scale, shape).double(), expected, atol=1e-5, rtol=0
    )
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out = paged_attention(q, kc, vc, bt, sl, impl="torch")
            torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_batched_tiles_in_other_dtypes(dtype):
    atol = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}[dtype]
    q, kc, vc, bt, sl, keys, values = make_case([3, 40, 700], 16, 2, 4, dtype=dtype)
    shape, scale = check_decode_args(q, kc, vc, bt, sl, None)
    out = _batched_decode(q, kc, vc, bt, sl, scale, shape, tile_tokens=256)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), dense_f64(q, keys, values), atol=atol, rtol=0)


# ---------------------------------------------------------------- the compiled CPU decode

needs_compiler = pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler")


@pytest.fixture
def compiled_for_every_size(monkeypatch):
    """impl="torch" compiles even small calls (the tests' sizes), with the process's one compiled callable.

    The tests compile more kinds than a process would (both layouts, many dtypes and groups), so
    the limit on kinds is lifted too.
    """
    monkeypatch.setattr(attention, "COMPILED_MIN_BYTES", 0)
    monkeypatch.setattr(attention, "COMPILED_MAX_KINDS", 64)
    monkeypatch.setattr(attention.COMPILED, "enabled", True)


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize(
    "block_size, group, dtype",
    [
        (16, 4, torch.float32),
        (1, 1, torch.float16),
        (64, 8, torch.bfloat16),
        (16, 8, torch.float32),
        (16, 6, torch.float32),
    ],
)
@pytest.mark.parametrize("layout", ["token-major", "head-major"])
def test_compiled_decode_matches_float64_dense_attention(
    block_size, group, dtype, layout, compiled_for_every_size
):
    """Ragged lengths (1 to 1100, so many chunks and short last chunks), shuffled blocks, garbage past each table's end."""
    q, kc, vc, bt, sl, keys, values = make_case(
        LENS, block_size, 2, group, dtype=dtype, seed=block_size + group, layout=layout
    )
    if block_size == 1:  # one token a block: the head-major strides are a contiguous tensor's
        layout = "token-major"
    assert attention.pool_layout(kc) == layout
    shape, scale = check_decode_args(q, kc, vc, bt, sl, None)
    out = compiled_decode(q, kc, vc, bt, sl, scale, shape)
    assert out is not None, f"the compiled decode did not run: {attention.COMPILED.failure}"
    assert out.dtype == dtype and out.shape == q.shape
    atol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(out.double(), dense_f64(q, keys, values), atol=atol, rtol=0)
    kind = (dtype, block_size, 2, group, 32, layout)
    assert kind in attention.COMPILED.kinds
    # impl="torch" takes the compiled path for this call, and gives its answer
    torch.testing.assert_close(paged_attention(q, kc, vc, bt, sl, impl="torch"), out, atol=0, rtol=0)


def test_each_pass_over_a_kv_head_serves_a_divisor_of_its_group():
    """Groups of 1 to 4 in one pass; 6 in two of 3, 8 in two of 4, 7 (prime) in seven of 1, 32 in eight of 4."""
    served = {group: attention._members_per_pass(group) for group in (1, 2, 3, 4, 6, 7, 8, 32)}
    assert served == {1: 1, 2: 2, 3: 3, 4: 4, 6: 3, 7: 1, 8: 4, 32: 4}


@needs_compiler
@pytest.mark.slow
def test_compiled_decode_on_new_batches_of_one_kind(compiled_for_every_size):
    """Other batch sizes, one sequence, shared blocks and an int64 table: the same kind, still exact."""
    for lens, seed in (([5, 900, 33], 3), ([700], 4), ([1], 5)):
        q, kc, vc, bt, sl, keys, values = make_case(lens, 16, 2, 4, seed=seed)
        torch.testing.assert_close(
            paged_attention(q, kc, vc, bt, sl, impl="torch").double(),
            dense_f64(q, keys, values),
            atol=1e-5,
            rtol=0,
        )
    _check_shared_blocks_and_an_int64_table()
    assert attention.COMPILED.failure is None


@needs_compiler
@pytest.mark.slow
def test_compiled_decode_with_wide_rows_and_a_strided_query(compiled_for_every_size):
    """Rows past COMPILED_WIDE_ROW_BYTES take shorter chunks (3 blocks of 16 here); a non-contiguous query is fine."""
    q, kc, vc, bt, sl, keys, values = make_case([1, 47, 48, 49, 200], 16, 16, 1, head_dim=128, seed=9)
    shape, _ = check_decode_args(q, kc, vc, bt, sl, None)
    assert attention._chunk_blocks(shape, kc.element_size()) == 3
    strided = torch.cat([q, q], dim=-1)[..., :128]  # the same values, every row twice as far apart
    assert not strided.is_contiguous()
    out = paged_attention(strided, kc, vc, bt, sl, impl="torch")
    torch.testing.assert_close(out.double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)
    assert (torch.float32, 16, 16, 1, 128, "token-major") in attention.COMPILED.kinds


@needs_compiler
@pytest.mark.slow
def test_the_compiled_decode_takes_any_scale_without_compiling_again(compiled_for_every_size):
    """The scale reaches the kernel as a tensor: new values give exact answers and no new graph."""
    from torch._dynamo.utils import counters

    q, kc, vc, bt, sl, keys, values = make_case([30, 70], 16, 2, 4, seed=12)
    paged_attention(q, kc, vc, bt, sl, impl="torch", scale=0.5)
    graphs = counters["stats"]["unique_graphs"]
    for scale in (0.125, 0.3, 2.0):
        out = paged_attention(q, kc, vc, bt, sl, impl="torch", scale=scale)
        torch.testing.assert_close(out.double(), dense_f64(q, keys, values, scale=scale), atol=1e-5, rtol=0)
    assert counters["stats"]["unique_graphs"] == graphs
    assert attention.COMPILED.failure is None and not attention.COMPILED.over_limit


@needs_compiler
@pytest.mark.slow
def test_the_compiled_decode_serves_new_batch_and_pool_sizes_without_compiling_again(compiled_for_every_size):
    """Sizes are marked dynamic only until a kind has compiled; later batches and pools reuse that graph."""
    from torch._dynamo.utils import counters

    paged_attention(*make_case([30, 70], 16, 2, 2, seed=20)[:5], impl="torch")
    graphs = counters["stats"]["unique_graphs"]
    for lens, spare in (([5, 90, 33], 3), ([200, 17, 64, 64, 3], 40), ([48, 49], 7)):
        q, kc, vc, bt, sl, keys, values = make_case(lens, 16, 2, 2, seed=len(lens), spare_blocks=spare)
        out = paged_attention(q, kc, vc, bt, sl, impl="torch")
        torch.testing.assert_close(out.double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)
    assert counters["stats"]["unique_graphs"] == graphs
    assert (torch.float32, 16, 2, 2, 32, "token-major") in attention.COMPILED.kinds


@needs_compiler
@pytest.mark.slow
def test_the_compiled_decode_leaves_dynamo_s_settings_as_it_found_them(compiled_for_every_size):
    """It raises dynamo's recompile limit for its own call only: a user's torch.compile keeps its settings."""
    config = torch._dynamo.config
    before = config.fail_on_recompile_limit_hit, config.recompile_limit
    q, kc, vc, bt, sl, keys, values = make_case([30, 70], 16, 2, 4, seed=11)
    paged_attention(q, kc, vc, bt, sl, impl="torch")
    assert (config.fail_on_recompile_limit_hit, config.recompile_limit) == before


def test_the_chunk_plan_covers_every_token_once_from_any_integer_table():
    """Every sequence's blocks, in order, each once, whatever the table's integer dtype; nothing past the end."""
    lens = [1, 16, 17, 95, 200]
    for dtype in (torch.uint8, torch.int16, torch.int32, torch.int64):
        q, kc, vc, bt, sl, keys, values = make_case(lens, 16, 2, 4, seed=2)
        bt = torch.where(bt < kc.shape[0], bt, 0).to(dtype)
        table, seq, valid, seq_chunks, used = attention._chunk_plan(bt, sl, 16, 3)
        if dtype == torch.int64:  # the same values held through a negative view: read as the values it shows
            negated = attention._chunk_plan(torch._neg_view(-bt), torch._neg_view(-sl), 16, 3)
            assert all(
                torch.equal(a, b) for a, b in zip(negated, (table, seq, valid, seq_chunks, used), strict=True)
            )
        for s, n in enumerate(lens):
            chunks = seq_chunks[s][used[s]].tolist()
            assert [int(seq[c]) for c in chunks] == [s] * len(chunks)
            blocks = [int(b) for c in chunks for b in table[c][: -(-int(valid[c]) // 16)]]
            assert blocks == bt[s, : -(-n // 16)].tolist()
            assert sum(int(valid[c]) for c in chunks) == n


def test_small_calls_and_float64_run_the_walk_without_compiling(monkeypatch):
    fresh = CompiledDecode()
    monkeypatch.setattr(attention, "COMPILED", fresh)
    q, kc, vc, bt, sl, keys, values = make_case(LENS, 16, 2, 4)
    shape, scale = check_decode_args(q, kc, vc, bt, sl, None)
    out = paged_attention(q, kc, vc, bt, sl, impl="torch")  # 0.3 MB of K and V: below COMPILED_MIN_BYTES
    torch.testing.assert_close(out, _torch_walk(q, kc, vc, bt, sl, scale, shape), atol=0, rtol=0)
    monkeypatch.setattr(attention, "COMPILED_MIN_BYTES", 0)
    args = [t.double() for t in (q, kc, vc)] + [bt, sl]
    torch.testing.assert_close(
        paged_attention(*args, impl="torch").double(), dense_f64(q, keys, values), atol=1e-12, rtol=0
    )
    assert fresh.fn is None and not fresh.kinds


def test_without_a_compiler_impl_torch_runs_the_walk_silently(monkeypatch, tmp_path):
    """No C++ compiler on PATH: the compiled path says why once (in COMPILED.failure) and every call walks."""
    import warnings

    fresh = CompiledDecode()
    monkeypatch.setattr(attention, "COMPILED", fresh)
    monkeypatch.setattr(attention, "COMPILED_MIN_BYTES", 0)
    monkeypatch.setenv("PATH", str(tmp_path))
    q, kc, vc, bt, sl, keys, values = make_case([3, 40, 270], 16, 2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            out = paged_attention(q, kc, vc, bt, sl, impl="torch")
            torch.testing.assert_close(out.double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)
    assert fresh.fn is None and "C++ compiler" in fresh.failure


def test_with_dynamo_disabled_impl_torch_runs_the_walk(monkeypatch):
    """TORCH_COMPILE_DISABLE (dynamo's config.disable) would run the graph eagerly, gathering K and V
    group times over: the call walks instead, and compiles nothing."""
    fresh = CompiledDecode()
    monkeypatch.setattr(attention, "COMPILED", fresh)
    monkeypatch.setattr(attention, "COMPILED_MIN_BYTES", 0)
    monkeypatch.setattr(torch._dynamo.config, "disable", True)
    q, kc, vc, bt, sl, keys, values = make_case([3, 40, 270], 16, 2, 4)
    out = paged_attention(q, kc, vc, bt, sl, impl="torch")
    torch.testing.assert_close(out.double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)
    assert fresh.fn is None and not fresh.kinds


def test_no_sequences_gives_an_empty_result():
    kc = torch.zeros(2, 4, 1, 8)
    out = paged_attention(
        torch.zeros(0, 2, 8),
        kc,
        kc.clone(),
        torch.zeros(0, 1, dtype=torch.int32),
        torch.zeros(0, dtype=torch.int32),
    )
    assert out.shape == (0, 2, 8)


# ---------------------------------------------------------------- slot mapping and prefill


def test_slot_mapping_is_the_lessons_example_2():
    a = torch.tensor([7, 2, 9])
    assert slot_mapping(a, torch.tensor([0, 15, 16, 36]), 16).tolist() == [112, 127, 32, 148]
    assert slot_mapping(torch.tensor([4, 0]), torch.tensor([19]), 16).tolist() == [3]


def test_write_kv_cache_stores_rows_at_their_slots_and_skips_minus_one():
    kc = torch.zeros(3, 4, 2, 8)
    vc = torch.zeros(3, 4, 2, 8)
    key = torch.randn(3, 2, 8)
    value = torch.randn(3, 2, 8)
    write_kv_cache(key, value, kc, vc, torch.tensor([9, -1, 2]))
    assert torch.equal(kc[2, 1], key[0]) and torch.equal(vc[0, 2], value[2])
    assert int((kc != 0).any(dim=(2, 3)).sum()) == 2


def causal_f64(query, keys, values, q_len):
    """Float64 causal attention of the last ``q_len`` positions over all ``len(keys)`` positions."""
    t = keys.shape[0]
    group = query.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,thd->hnt", query.double(), k) * query.shape[-1] ** -0.5
    allowed = torch.arange(t)[None, :] <= torch.arange(t - q_len, t)[:, None]
    w = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("hnt,thd->nhd", w, v)


@pytest.mark.parametrize("impl", ["reference", "torch"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_writes_through_the_slot_mapping_and_attends_causally(impl, block_size, dtype):
    """Three sequences: a 70-token cached prefix + 9 new tokens, a brand new one, and 10 cached + 30 new."""
    gen = torch.Generator().manual_seed(block_size)
    hkv, group, dim = 2, 4, 32
    total = [79, 33, 40]
    new = [9, 33, 30]
    keys = [torch.randn(t, hkv, dim, generator=gen).to(dtype) for t in total]
    values = [torch.randn(t, hkv, dim, generator=gen).to(dtype) for t in total]
    queries = [torch.randn(n, hkv * group, dim, generator=gen).to(dtype) for n in new]
    blocks = [-(-t // block_size) for t in total]
    num_blocks = sum(blocks) + 2
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(total), max(blocks), dtype=torch.int32)
    kc = torch.zeros(num_blocks, block_size, hkv, dim, dtype=dtype)
    vc = torch.zeros_like(kc)
    for s, t in enumerate(total):
        tables[s, : blocks[s]] = torch.tensor([physical.pop() for _ in range(blocks[s])])
        cached = t - new[s]  # a prefix hit: written by an earlier request
        slots = slot_mapping(tables[s], torch.arange(cached), block_size)
        write_kv_cache(keys[s][:cached], values[s][:cached], kc, vc, slots)
    out = paged_prefill(
        torch.cat(queries),
        torch.cat([k[t - n :] for k, t, n in zip(keys, total, new, strict=True)]),
        torch.cat([v[t - n :] for v, t, n in zip(values, total, new, strict=True)]),
        kc,
        vc,
        tables,
        torch.tensor(total),
        torch.tensor(new),
        impl=impl,
    )
    expected = torch.cat([causal_f64(queries[s], keys[s], values[s], new[s]) for s in range(len(total))])
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=0)
    # every token's K/V is now in the pool, where decode reads it
    q_next = torch.randn(len(total), hkv * group, dim, generator=gen).to(dtype)
    decoded = paged_attention(q_next, kc, vc, tables, torch.tensor(total), impl="torch")
    torch.testing.assert_close(
        decoded.double(), dense_f64(q_next, keys, values), atol=TOLERANCE[dtype], rtol=0
    )


# ---------------------------------------------------------------- bad input


def good_case():
    return make_case([5, 20], 4, 2, 2)[:5]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "query": a["query"][:, :, :16]}, "head_dim"),
        (lambda a: {**a, "query": a["query"].double()}, "dtype"),
        (lambda a: {**a, "value_cache": a["value_cache"][:, :2]}, "same shape"),
        (lambda a: {**a, "query": a["query"][:, :3]}, "multiple of num_kv_heads"),
        (lambda a: {**a, "block_tables": a["block_tables"].float()}, "integers"),
        (lambda a: {**a, "seq_lens": a["seq_lens"].float()}, "integers"),
        (lambda a: {**a, "seq_lens": torch.tensor([5, 200], dtype=torch.int32)}, "block table holds"),
        (lambda a: {**a, "seq_lens": torch.tensor([0, 20], dtype=torch.int32)}, "at least 1"),
        (lambda a: {**a, "block_tables": a["block_tables"][:1]}, "one of each per sequence"),
        (lambda a: {**a, "query": a["query"][0]}, "3 dimensions"),
        (lambda a: {**a, "key_cache": "keys"}, "torch.Tensor"),
    ],
)
def test_bad_decode_arguments_are_rejected_with_a_clear_message(change, message):
    q, kc, vc, bt, sl = good_case()
    args = change({"query": q, "key_cache": kc, "value_cache": vc, "block_tables": bt, "seq_lens": sl})
    with pytest.raises(InvalidArgumentError, match=message):
        paged_attention(**args)


def test_table_entries_outside_the_pool_are_named():
    q, kc, vc, bt, sl = good_case()
    for bad in (kc.shape[0], -1):
        tables = bt.clone()
        tables[1, 2] = bad
        with pytest.raises(InvalidArgumentError, match=r"block_tables\[1, 2\] = .* outside the pool"):
            paged_attention(q, kc, vc, tables, sl)


def test_tables_of_any_integer_dtype_and_layout_give_the_same_answer_and_the_same_refusals():
    """The CPU checks read tables and lengths in numpy: strided views and small dtypes must read as they do in torch."""
    q, kc, vc, bt, sl = good_case()
    want = paged_attention(q, kc, vc, bt, sl, impl="reference")
    for dtype in (torch.uint8, torch.int16, torch.int64):
        strided = bt.to(dtype).t().contiguous().t()  # the same values, column-major
        lens = torch.stack([sl.to(dtype), sl.to(dtype)], dim=1)[:, 0]  # a strided view of the lengths
        for impl in ("reference", "torch"):
            assert torch.allclose(paged_attention(q, kc, vc, strided, lens, impl=impl), want, atol=1e-5)
        tables = strided.clone().t().contiguous().t()
        tables[1, 2] = kc.shape[0]
        with pytest.raises(InvalidArgumentError, match=rf"block_tables\[1, 2\] = {kc.shape[0]} is outside"):
            paged_attention(q, kc, vc, tables, lens)
        with pytest.raises(InvalidArgumentError, match="seq_lens must be at least 1"):
            paged_attention(q, kc, vc, strided, lens * 0)


def test_bad_impl_and_scale():
    q, kc, vc, bt, sl = good_case()
    with pytest.raises(InvalidArgumentError, match="unknown impl"):
        paged_attention(q, kc, vc, bt, sl, impl="cuda")
    with pytest.raises(InvalidArgumentError, match="decode only"):
        paged_prefill(q, q[:, :2], q[:, :2], kc, vc, bt, sl, torch.tensor([5, 20]), impl="flex")
    for scale in (0, -1.0, float("nan"), "0.1", True):
        with pytest.raises(InvalidArgumentError, match="scale"):
            paged_attention(q, kc, vc, bt, sl, scale=scale)
    with pytest.raises(InvalidArgumentError, match="float64"):
        paged_attention(q.double(), kc.double(), vc.double(), bt, sl, impl="triton")


def test_a_rejected_prefill_writes_nothing():
    kc = torch.zeros(4, 4, 1, 8)
    vc = torch.zeros(4, 4, 1, 8)
    q = torch.randn(3, 2, 8)
    k = torch.randn(3, 1, 8)
    tables = torch.tensor([[0, 1]], dtype=torch.int32)
    cases = [
        ({"query_lens": torch.tensor([2])}, "add up"),
        ({"seq_lens": torch.tensor([2])}, "cannot exceed"),
        ({"seq_lens": torch.tensor([9])}, "block table holds"),
        ({"block_tables": torch.tensor([[0, 7]], dtype=torch.int32)}, "outside the pool"),
        ({"key": k.half()}, "dtype"),
        ({"impl": "triton"}, "unknown impl"),
    ]
    for change, message in cases:
        args = {
            "query": q,
            "key": k,
            "value": k.clone(),
            "key_cache": kc,
            "value_cache": vc,
            "block_tables": tables,
            "seq_lens": torch.tensor([5]),
            "query_lens": torch.tensor([3]),
        } | change
        with pytest.raises(InvalidArgumentError, match=message):
            paged_prefill(**args)
        assert not kc.any() and not vc.any()


def test_write_kv_cache_rejects_slots_outside_the_pool():
    kc = torch.zeros(2, 4, 1, 8)
    with pytest.raises(InvalidArgumentError, match="outside the pool"):
        write_kv_cache(torch.ones(1, 1, 8), torch.ones(1, 1, 8), kc, kc.clone(), torch.tensor([8]))
    with pytest.raises(InvalidArgumentError, match="one per token"):
        write_kv_cache(torch.ones(2, 1, 8), torch.ones(2, 1, 8), kc, kc.clone(), torch.tensor([1]))
    assert not kc.any()


@pytest.mark.parametrize("which", ["key_cache", "value_cache"])
def test_a_negated_view_of_the_cache_is_refused_everywhere(which):
    """torch._neg_view holds the negated values only logically; a compiled kernel would read the raw memory."""
    q, kc, vc, bt, sl, keys, values = make_case([20, 5], 16, 2, 4)
    caches = {"key_cache": kc, "value_cache": vc}
    caches[which] = torch._neg_view(-caches[which])
    kc2, vc2 = caches["key_cache"], caches["value_cache"]
    for impl in ("reference", "torch"):
        with pytest.raises(InvalidArgumentError, match=f"{which} is a negated view"):
            paged_attention(q, kc2, vc2, bt, sl, impl=impl)
    with pytest.raises(InvalidArgumentError, match="negated view"):
        write_kv_cache(torch.zeros(1, 2, 32), torch.zeros(1, 2, 32), kc2, vc2, torch.tensor([0]))


def test_a_negated_view_of_the_query_or_the_tables_gives_the_same_answer(monkeypatch):
    """Only the caches are refused as negated views; a query or table held that way is read as the values it shows."""
    monkeypatch.setattr(attention, "FLEX_BACKEND", attention.FlexBackend())  # a compile failure stays here
    q, kc, vc, bt, sl, keys, values = make_case([20, 5], 16, 2, 4)
    expected = paged_attention(q, kc, vc, bt, sl, impl="reference")
    neg_q, neg_bt, neg_sl = torch._neg_view(-q), torch._neg_view(-bt.long()), torch._neg_view(-sl.long())
    impls = ["reference", "torch"] + (["flex"] if flex_available() else [])
    for impl in impls:
        out = paged_attention(neg_q, kc, vc, neg_bt, neg_sl, impl=impl)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
