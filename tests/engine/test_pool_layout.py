"""The pool's memory layout: head-major on the CPU, token-major on a GPU, and every kernel's answer the same in both.

vLLM 0.33's CPU attention backend stores each block as [num_kv_heads, block_size, head_size]
(its KVCacheLayout.LBHNC); its GPU backends default to token-major (NHD). kvlab's pools keep
the logical shape [num_blocks, block_size, num_kv_heads, head_dim] in either, so a layout is
only a choice of strides: these tests check that nothing a caller sees depends on it, apart
from FlexAttention, which needs one run of tokens per KV head and says so.
"""

from __future__ import annotations

import pytest
from hostile import hostile_values, kvlab_or_ok
from hypothesis import given, settings
from hypothesis import strategies as st
from test_paged_attention import LENS, dense_f64, head_major, make_case

from kvlab.errors import InvalidArgumentError, raised_limits

torch = pytest.importorskip("torch")

from kvlab.engine import attention  # noqa: E402
from kvlab.engine.attention import (  # noqa: E402
    layer_pool,
    paged_attention,
    paged_prefill,
    plan_decode,
    pool_layout,
    write_kv_cache,
)
from kvlab.engine.model import KVPool, ModelConfig, TinyTransformer  # noqa: E402

SMALL = {
    "num_layers": 2,
    "d_model": 32,
    "num_heads": 4,
    "num_kv_heads": 2,
    "ffn_dim": 32,
    "embedding_rows": 64,
}


@pytest.fixture
def tiny():
    """The tiny model's config, the model, and a three-block table (a 29-token prompt and a few steps)."""
    config = ModelConfig(**SMALL)
    return (
        config,
        TinyTransformer(config, output_ids=list(range(8))),
        torch.tensor([2, 0, 3], dtype=torch.int32),
    )


def test_layer_pool_lays_out_each_block_by_kv_head_on_the_cpu():
    """Same shape in both layouts; head-major puts a KV head's block_size rows in one run of memory."""
    keys, values = layer_pool(5, 16, 4, 8)
    assert keys.shape == values.shape == (5, 16, 4, 8)
    assert keys.dtype == torch.float32 and not keys.any() and not values.any()
    assert pool_layout(keys) == pool_layout(values) == "head-major"
    assert keys.stride() == (16 * 4 * 8, 8, 16 * 8, 1)  # token step 8 numbers, head step 16 rows
    token_major, _ = layer_pool(5, 16, 4, 8, layout="token-major", dtype=torch.bfloat16)
    assert token_major.is_contiguous() and token_major.dtype == torch.bfloat16
    assert pool_layout(token_major) == "token-major"
    assert pool_layout(keys.transpose(0, 1)) == "strided"
    # the two keys of one layer_pool call are separate memory
    keys[0, 0, 0, 0] = 1.0
    assert values[0, 0, 0, 0] == 0


def test_one_kv_head_or_one_token_a_block_is_token_major_either_way():
    """Where a block's heads or tokens are one, the head-major strides are a contiguous tensor's."""
    assert pool_layout(layer_pool(3, 16, 1, 8)[0]) == "token-major"
    assert pool_layout(layer_pool(3, 1, 4, 8)[0]) == "token-major"


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: layer_pool(0, 16, 2, 8), "num_blocks"),
        (lambda: layer_pool(4, 0, 2, 8), "block_size"),
        (lambda: layer_pool(4, 16, 0, 8), "num_kv_heads"),
        (lambda: layer_pool(4, 16, 2, -1), "head_dim"),
        (lambda: layer_pool(4, 16, 2, 8.0), "head_dim"),
        (lambda: layer_pool(4, 16, 2, 8, dtype=torch.int32), "dtype"),
        (lambda: layer_pool(4, 16, 2, 8, dtype="float32"), "dtype"),
        (lambda: layer_pool(4, 16, 2, 8, layout="NHD"), "layout"),
        (lambda: layer_pool(4, 16, 2, 8, layout=None), "layout"),
        (lambda: layer_pool(4, 16, 2, 8, device="tpu"), "device"),
        (lambda: layer_pool(4, 16, 2, 8, device="no such device"), "device"),
        (lambda: layer_pool(4, 16, 2, 8, device=object()), "device"),
        (lambda: layer_pool(10**6, 16, 32, 128), "LIMITS.memory_mib"),
        (lambda: KVPool(ModelConfig(**SMALL), 4, 16, layout="HND"), "layout"),
        (lambda: KVPool(ModelConfig(**SMALL), 4, 16, device="meta"), "device"),
        (lambda: KVPool(ModelConfig(**SMALL), 4, 16).layer(-1), "layer must be at least 0"),
        (
            lambda: KVPool(ModelConfig(**SMALL), 4, 16).layer(ModelConfig(**SMALL).num_layers),
            "layer must be at most",
        ),
        (lambda: KVPool(ModelConfig(**SMALL), 4, 16).layer(0.0), "layer"),
    ],
)
def test_pools_refuse_bad_sizes_dtypes_layouts_and_devices(call, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal a CPU-only torch gives")
def test_a_cuda_pool_without_a_gpu_is_refused_with_the_way_out():
    with pytest.raises(InvalidArgumentError, match="device='cpu'"):
        layer_pool(4, 16, 2, 8, device="cuda")


def test_the_memory_bound_is_checked_before_anything_is_allocated_and_can_be_raised():
    """4 GiB is refused up front (no allocation); raised_limits lets a deliberate caller past it."""
    with pytest.raises(InvalidArgumentError, match="4,096"):
        layer_pool(2**16, 16, 8, 128)  # 2 x 4 GiB
    with raised_limits(memory_mib=8):
        keys, _ = layer_pool(2, 16, 8, 64)  # 1 MiB
    assert keys.shape == (2, 16, 8, 64)


def test_a_pool_larger_than_the_machine_is_refused_with_kvlabs_error():
    """Past a raised limit, torch's own allocation failure comes back as kvlab's error with the way out.

    2 x 1 PiB is beyond any address space, so malloc refuses at once (nothing is zeroed or paged in).
    """
    with (
        raised_limits(memory_mib=2**32, num_blocks=2**35),
        pytest.raises(InvalidArgumentError, match=r"could not be allocated on cpu.*fewer or smaller blocks"),
    ):
        layer_pool(2**34, 16, 8, 128)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"num_blocks": 1.5}, "num_blocks must be an integer"),
        ({"num_blocks": 0}, "num_blocks must be at least 1"),
        ({"num_blocks": 2**64}, "LIMITS.num_blocks"),
        ({"dtype": "float32"}, "dtype must be"),
        ({"dtype": torch.int64}, "dtype must be"),
        ({"lead": "ab"}, "lead must be"),
        ({"lead": None}, "lead must be"),
        ({"lead": (2, 3)}, "lead must be"),
        ({"lead": (0,)}, "num_layers must be at least 1"),
        ({"head_dim": 2**64}, "head_dim must be at most"),
        ({"num_kv_heads": 2**63}, "num_kv_heads must be at most"),
        ({"max_mib": 0}, "max_mib must be at least 1"),
        ({"num_blocks": 1024, "max_mib": 1}, "more than 1 .the bound max_mib"),
    ],
)
def test_pool_tensors_checks_every_argument_itself(change, needle):
    args = dict(lead=(), num_blocks=4, block_size=16, num_kv_heads=2, head_dim=8)
    args.update(dtype=torch.float32, device="cpu", layout="auto")
    args.update(change)
    sizes = [args.pop(k) for k in ("lead", "num_blocks", "block_size", "num_kv_heads", "head_dim")]
    with raised_limits(memory_mib=2**200), pytest.raises(InvalidArgumentError, match=needle):
        attention.pool_tensors(*sizes, **args)


def test_pool_tensors_holds_to_the_memory_limit_by_default():
    with raised_limits(memory_mib=1), pytest.raises(InvalidArgumentError, match="LIMITS.memory_mib"):
        attention.pool_tensors((), 1024, 16, 8, 128, dtype=torch.float32, device="cpu", layout="auto")


def test_a_model_pool_is_bounded_by_its_own_sizes_not_the_configs_figure(monkeypatch):
    """A config whose kv_bytes_per_token says 0 still gets a pool sized, and bounded, by its real shape."""
    from kvlab.engine import model

    class Lying(model.ModelConfig):
        def kv_bytes_per_token(self) -> int:
            return 0

    config = Lying(num_layers=1, d_model=1024, num_heads=8, num_kv_heads=8)
    monkeypatch.setattr(model, "MAX_MIB", 64)  # the weights fit; 128 MiB of KV do not
    with pytest.raises(InvalidArgumentError, match="128 MiB.*the bound max_mib"):
        model.KVPool(config, 1024, 16)


class _Layout(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def test_a_str_subclass_layout_is_read_by_its_text_not_its_eq():
    assert pool_layout(layer_pool(2, 4, 2, 8, layout=_Layout("token-major"))[0]) == "token-major"
    with pytest.raises(InvalidArgumentError, match="layout"):
        layer_pool(2, 4, 2, 8, layout=_Layout("anything"))


@settings(max_examples=40, deadline=None)
@given(value=hostile_values())
def test_hostile_pool_arguments_get_kvlab_errors_or_a_pool(value):
    """Any value in any argument: a kvlab error, or a pool of the asked shape (never torch's own error)."""
    for kwargs in (
        {"num_blocks": value},
        {"block_size": value},
        {"num_kv_heads": value},
        {"head_dim": value},
        {"dtype": value},
        {"layout": value},
        {"device": value},
    ):
        args = {"num_blocks": 2, "block_size": 4, "num_kv_heads": 2, "head_dim": 8, **kwargs}
        with raised_limits(memory_mib=64):
            kvlab_or_ok(lambda args=args: layer_pool(**args))


@pytest.mark.parametrize("impl", ["reference", "torch"])
@pytest.mark.parametrize("block_size, group", [(1, 1), (16, 4), (64, 8)])
def test_decode_is_the_same_from_either_layout(impl, block_size, group):
    """The walk (small calls) and the reference give the same numbers from either pool, exact to float64."""
    q, kc, vc, bt, sl, keys, values = make_case(LENS, block_size, 2, group, seed=block_size)
    hk, hv = head_major(kc), head_major(vc)
    assert pool_layout(hk) == "head-major" or block_size == 1
    token = paged_attention(q, kc, vc, bt, sl, impl=impl)
    head = paged_attention(q, hk, hv, bt, sl, impl=impl)
    torch.testing.assert_close(head, token, atol=1e-6, rtol=0)
    torch.testing.assert_close(head.double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)


def test_a_decode_plan_serves_a_head_major_pool():
    q, kc, vc, bt, sl, keys, values = make_case([3, 40, 200], 16, 2, 4, seed=2, layout="head-major")
    plan = plan_decode(bt, sl, kc)
    torch.testing.assert_close(plan.attend(q, kc, vc).double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)


def test_write_kv_cache_fills_either_layout_with_the_same_rows():
    """Slots land at (slot // block_size, slot % block_size) whatever the strides; -1 slots are skipped."""
    gen = torch.Generator().manual_seed(0)
    key, value = torch.randn(6, 4, 8, generator=gen), torch.randn(6, 4, 8, generator=gen)
    slots = torch.tensor([0, 17, -1, 33, 5, 47])
    written = {}
    for layout in ("token-major", "head-major"):
        kc, vc = layer_pool(3, 16, 4, 8, layout=layout)
        write_kv_cache(key, value, kc, vc, slots)
        assert pool_layout(kc) == layout  # written in place, strides kept
        written[layout] = kc.clone(), vc.clone()
    for a, b in zip(written["token-major"], written["head-major"], strict=True):
        assert torch.equal(a, b)
    kc, vc = written["head-major"]
    assert torch.equal(kc[1, 1], key[1]) and torch.equal(vc[2, 15], value[5])
    assert int((kc != 0).any(dim=(2, 3)).sum()) == 5


def test_a_nan_in_a_head_major_pool_is_still_found_where_it_matters():
    """A non-finite value in a table's block sends the call to the careful walk, so it cannot leak elsewhere."""
    q, kc, vc, bt, sl, keys, values = make_case([20, 30], 16, 2, 4, seed=3, layout="head-major")
    blocks = bt[:, :2].reshape(-1).long()
    assert attention._blocks_finite(vc, blocks)
    vc[bt[0, 0], 15, 1, 3] = float("nan")  # sequence 0's token 15, KV head 1
    assert not attention._blocks_finite(vc, blocks)
    spare = sorted(set(range(kc.shape[0])) - set(blocks.tolist()))[0]
    vc[bt[0, 0], 15, 1, 3] = 0.0
    vc[spare, 3, 0, 0] = float("inf")  # a block no table names: not the call's business
    assert attention._blocks_finite(vc, blocks)


def test_flex_refuses_a_head_major_pool_and_names_the_fix():
    q, kc, vc, bt, sl, *_ = make_case([5, 40], 16, 2, 4, seed=4, layout="head-major")
    with pytest.raises(InvalidArgumentError, match="head-major.*layout='token-major'"):
        paged_attention(q, kc, vc, bt, sl, impl="flex")


@pytest.mark.parametrize("impl", ["reference", "torch"])
def test_prefill_reads_and_writes_either_layout_alike(impl):
    """A prefill over a cached prefix: same outputs and same pool contents in both layouts."""
    gen = torch.Generator().manual_seed(5)
    cached, new, heads, kv, d, bs = 37, 21, 8, 2, 16, 16
    q = torch.randn(new, heads, d, generator=gen)
    k, v = torch.randn(new, kv, d, generator=gen), torch.randn(new, kv, d, generator=gen)
    table = torch.tensor([[3, 0, 2, 5]], dtype=torch.int32)
    results = {}
    for layout in ("token-major", "head-major"):
        kc, vc = layer_pool(6, bs, kv, d, layout=layout)
        prefix = torch.Generator().manual_seed(6)
        for pos in range(cached):  # the cached prefix, written token by token
            slot = torch.tensor([int(table[0, pos // bs]) * bs + pos % bs])
            write_kv_cache(
                torch.randn(1, kv, d, generator=prefix), torch.randn(1, kv, d, generator=prefix), kc, vc, slot
            )
        out = paged_prefill(
            q, k, v, kc, vc, table, torch.tensor([cached + new], dtype=torch.int32),
            torch.tensor([new], dtype=torch.int32), impl=impl,
        )  # fmt: skip
        results[layout] = out, kc.clone(), vc.clone()
    for a, b in zip(results["token-major"], results["head-major"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_the_tiny_model_gives_the_same_logits_from_either_pool(tiny):
    """A prefill then three decode steps, one pool of each layout: the same logits, and flex runs on token-major."""
    config, model, table = tiny
    logits = {}
    for layout in ("token-major", "head-major"):
        pool = KVPool(config, num_blocks=4, block_size=16, layout=layout)
        assert pool_layout(pool.layer(0)[0]) == layout and pool_layout(pool.layer(1)[1]) == layout
        steps = [model.prefill(list(range(1, 30)), 0, pool, table)]
        for i, token in enumerate((5, 9, 11)):
            steps.append(model.decode(token, 29 + i, pool, table))
        logits[layout] = torch.stack(steps)
    torch.testing.assert_close(logits["head-major"], logits["token-major"], atol=1e-5, rtol=0)
    assert pool_layout(KVPool(config, 4, 16).layer(0)[0]) == "head-major"  # the CPU default


def test_compiled_kinds_tell_the_layouts_apart():
    """The generated kernel bakes in the pool's strides, so each layout is its own compiled kind."""
    q, kc, vc, bt, sl, *_ = make_case([40], 16, 2, 4, seed=8)
    shape, _ = attention.check_decode_args(q, kc, vc, bt, sl, None)
    token = attention._compiled_kind(q, kc, vc, shape)
    head = attention._compiled_kind(q, head_major(kc), head_major(vc), shape)
    assert token[-1] == "token-major" and head[-1] == "head-major" and token[:-1] == head[:-1]
    mixed = attention._compiled_kind(q, kc, head_major(vc), shape)
    assert mixed[-1] == "token-major/head-major"


@given(
    st.integers(1, 4), st.integers(1, 20), st.integers(1, 4), st.sampled_from(["token-major", "head-major"])
)
@settings(max_examples=30, deadline=None)
def test_pool_layout_names_what_layer_pool_made(blocks, block_size, kv_heads, layout):
    keys, values = layer_pool(blocks, block_size, kv_heads, 8, layout=layout)
    expected = "token-major" if kv_heads == 1 or block_size == 1 else layout
    assert pool_layout(keys) == pool_layout(values) == expected


@pytest.mark.parametrize("impl", ["flex", "bogus", 5, None])
def test_a_refused_decode_step_writes_no_slot(impl, tiny):
    """The tiny model checks impl against the pool before layer 0 writes its key and value."""
    config, model, table = tiny
    pool = KVPool(config, num_blocks=4, block_size=16)  # head-major: flex cannot read it
    model.prefill(list(range(1, 30)), 0, pool, table)
    keys, values = pool.keys.clone(), pool.values.clone()
    with pytest.raises(InvalidArgumentError, match="impl") as refused:
        model.decode(5, 29, pool, table, impl=impl)
    if impl == "flex":
        assert "KVPool(..., layout='token-major')" in str(refused.value)
    with pytest.raises(InvalidArgumentError, match="impl"):
        model.decode_batch([5], [29], pool, table[None, :], impl=impl)
    assert torch.equal(pool.keys, keys) and torch.equal(pool.values, values)


@pytest.mark.parametrize("impl", ["bogus", 5, None])
def test_prefill_refuses_an_unknown_impl_before_writing(impl, tiny):
    config, model, table = tiny
    pool = KVPool(config, num_blocks=4, block_size=16)
    with pytest.raises(InvalidArgumentError, match="impl"):
        model.prefill(list(range(1, 30)), 0, pool, table, impl=impl)
    with pytest.raises(InvalidArgumentError, match="impl"):
        model.prefill_batch([list(range(1, 30))], [0], pool, table[None, :], impl=impl)
    assert not pool.keys.any() and not pool.values.any()


def test_flex_on_a_token_major_pool_in_the_tiny_model_matches_torch(tiny):
    config, model, table = tiny
    logits = {}
    for impl in ("torch", "flex"):
        pool = KVPool(config, num_blocks=4, block_size=16, layout="token-major")
        model.prefill(list(range(1, 30)), 0, pool, table)
        logits[impl] = model.decode(5, 29, pool, table, impl=impl)
    torch.testing.assert_close(logits["flex"], logits["torch"], atol=1e-5, rtol=0)


def test_flex_refuses_a_head_major_pool_before_building_its_block_mask(monkeypatch):
    """The layout refusal comes first; the mask itself, num_seqs x num_blocks, is bounded by LIMITS.memory_mib."""
    built = []
    real = attention._flex_block_mask
    monkeypatch.setattr(attention, "_flex_block_mask", lambda *a: built.append(1) or real(*a))
    q, kc, vc, bt, sl, *_ = make_case([5, 40], 16, 2, 4, seed=4, layout="head-major")
    with pytest.raises(InvalidArgumentError, match="key_cache is head-major, value_cache is head-major"):
        paged_attention(q, kc, vc, bt, sl, impl="flex")
    assert not built
    mixed = (kc.contiguous(), vc)
    with pytest.raises(InvalidArgumentError, match="key_cache is token-major, value_cache is head-major"):
        paged_attention(q, *mixed, bt, sl, impl="flex")
    kc, vc = layer_pool(2**16, 1, 1, 1, layout="token-major")
    seqs = 2**12  # 4,096 sequences x 65,536 blocks: 8 GiB of mask
    with pytest.raises(InvalidArgumentError, match="block mask"):
        paged_attention(
            torch.zeros(seqs, 1, 1), kc, vc, torch.arange(seqs, dtype=torch.int32)[:, None],
            torch.ones(seqs, dtype=torch.int32), impl="flex",
        )  # fmt: skip


@pytest.mark.parametrize("value", [None, [1, 2], "pool", 3])
def test_pool_layout_refuses_what_is_not_a_tensor(value):
    with pytest.raises(InvalidArgumentError, match="torch.Tensor"):
        pool_layout(value)


def test_pools_whose_slots_share_memory_are_refused():
    """An as_strided pool whose token and head strides overlap, or one tensor passed as both caches."""
    kc, vc = layer_pool(2, 4, 2, 8)
    overlapping = torch.zeros(72).as_strided((2, 4, 2, 8), (32, 8, 8, 1))  # token step == head step
    key, value, slot = torch.ones(1, 2, 8), torch.full((1, 2, 8), 7.0), torch.tensor([0])
    with pytest.raises(InvalidArgumentError, match="share memory"):
        write_kv_cache(key, value, kc, overlapping, slot)
    with pytest.raises(InvalidArgumentError, match="same memory"):
        write_kv_cache(key, value, kc, kc, slot)
    assert not kc.any() and not overlapping.any()
    # a pool's views that do not overlap pass: one tensor holding keys and values per block, as vLLM's does
    both = torch.zeros(2, 2, 4, 2, 8)
    write_kv_cache(key, value, both[:, 0], both[:, 1], slot)
    assert torch.equal(both[0, 0, 0], key[0]) and torch.equal(both[0, 1, 0], value[0])
