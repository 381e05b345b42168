"""plan_decode / DecodePlan.attend: one step's tables checked once, every layer's answer unchanged."""

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_paged_attention import LENS, dense_f64, make_case  # noqa: E402

import kvlab.engine.attention as attention  # noqa: E402
from kvlab.engine import DecodePlan, paged_attention, plan_decode  # noqa: E402
from kvlab.engine.attention import compile_available, flex_available  # noqa: E402
from kvlab.errors import InvalidArgumentError  # noqa: E402

IMPLS = ["reference", "torch"] + (["flex"] if flex_available() else [])


def layers(kc, vc, count, seed=1):
    """``count`` layers' pools of the same shape (the first is ``kc``, ``vc``): one plan serves them all."""
    gen = torch.Generator().manual_seed(seed)
    more = [
        (torch.randn(kc.shape, generator=gen).to(kc.dtype), torch.randn(vc.shape, generator=gen).to(vc.dtype))
        for _ in range(count - 1)
    ]
    return [(kc, vc), *more]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("block_size, group", [(1, 1), (16, 4), (64, 8)])
def test_a_plan_gives_every_layer_what_paged_attention_gives(impl, block_size, group):
    dtype = torch.float64 if impl == "flex" else torch.float32  # flex eager: no compiled flex state leaks out
    q, kc, vc, bt, sl, keys, values = make_case(LENS[:6], block_size, 2, group, dtype=dtype, seed=block_size)
    plan = plan_decode(bt, sl, kc)
    assert isinstance(plan, DecodePlan) and plan.num_seqs == len(LENS[:6])
    for key_cache, value_cache in layers(kc, vc, 3):
        out = plan.attend(q, key_cache, value_cache, impl=impl)
        torch.testing.assert_close(
            out, paged_attention(q, key_cache, value_cache, bt, sl, impl=impl), atol=0, rtol=0
        )
    torch.testing.assert_close(
        plan.attend(q, kc, vc, impl=impl).double(), dense_f64(q, keys, values), atol=1e-5, rtol=0
    )


@pytest.mark.slow
@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler")
def test_the_compiled_kernel_cuts_a_plans_chunks_once_for_every_layer(monkeypatch):
    monkeypatch.setattr(attention, "COMPILED_MIN_BYTES", 0)
    monkeypatch.setattr(attention.COMPILED, "enabled", True)
    q, kc, vc, bt, sl, keys, values = make_case(LENS, 16, 2, 4)
    plan = plan_decode(bt, sl, kc)
    outs = [plan.attend(q, k, v, impl="torch") for k, v in layers(kc, vc, 3)]
    assert attention.COMPILED.failure is None, attention.COMPILED.failure
    assert len(plan._chunks) == 1  # one chunk size, cut by the first layer and read by the others
    chunks = next(iter(plan._chunks.values()))
    plan.attend(q, kc, vc, impl="torch")
    assert next(iter(plan._chunks.values())) is chunks
    torch.testing.assert_close(outs[0].double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)
    for (k, v), out in zip(layers(kc, vc, 3), outs, strict=True):
        torch.testing.assert_close(out, paged_attention(q, k, v, bt, sl, impl="torch"), atol=0, rtol=0)


def test_a_plan_keeps_the_tables_it_checked():
    """Changing the caller's tensors after planning reaches neither the answer nor the pool's bounds."""
    q, kc, vc, bt, sl, keys, values = make_case([5, 40, 33], 16, 2, 4, dtype=torch.float64)
    plan = plan_decode(bt, sl, kc)
    before = plan.attend(q, kc, vc, impl="torch")
    bt.fill_(10**6)  # far outside the pool
    sl.fill_(10**5)
    for impl in IMPLS:
        torch.testing.assert_close(plan.attend(q, kc, vc, impl=impl), before, atol=1e-5, rtol=0)
    torch.testing.assert_close(before.double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)


def test_a_plan_refuses_what_paged_attention_refuses():
    q, kc, vc, bt, sl, _, _ = make_case([5, 40], 16, 2, 4)
    for tables, lens in (
        (bt.float(), sl),
        (bt[:, :1], sl),
        (bt, sl * 0),
        (bt + 1000, sl),
        (bt, sl.view(2, 1)),
    ):
        with pytest.raises(InvalidArgumentError) as planned:
            plan_decode(tables, lens, kc)
        with pytest.raises(InvalidArgumentError) as direct:
            paged_attention(q, kc, vc, tables, lens)
        assert str(planned.value) == str(direct.value)
    with pytest.raises(InvalidArgumentError, match="block_tables has 2 rows but seq_lens 1 entries"):
        plan_decode(bt, sl[:1], kc)
    for bad in (None, "kc", kc[0], kc[:, :, :, :0]):
        with pytest.raises(InvalidArgumentError, match="key_cache"):
            plan_decode(bt, sl, bad)


def test_a_plan_refuses_another_pool_or_batch_and_changes_nothing():
    q, kc, vc, bt, sl, _, _ = make_case([5, 40], 16, 2, 4)
    plan = plan_decode(bt, sl, kc)
    expected = plan.attend(q, kc, vc)
    bigger = torch.randn(kc.shape[0] + 1, *kc.shape[1:])
    wider = torch.randn(kc.shape[0], 8, *kc.shape[2:])
    for k, v, match in ((bigger, bigger, "made for a pool"), (wider, wider, "made for a pool")):
        with pytest.raises(InvalidArgumentError, match=match):
            plan.attend(q, k, v)
    with pytest.raises(InvalidArgumentError, match="sequences but this plan 2"):
        plan.attend(q[:1], kc, vc)
    with pytest.raises(InvalidArgumentError, match="query is torch.float64"):
        plan.attend(q.double(), kc, vc)
    with pytest.raises(InvalidArgumentError, match="unknown impl"):
        plan.attend(q, kc, vc, impl="fast")
    with pytest.raises(InvalidArgumentError, match="scale"):
        plan.attend(q, kc, vc, scale=-1.0)
    torch.testing.assert_close(plan.attend(q, kc, vc), expected, atol=0, rtol=0)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=5),
    block_size=st.sampled_from([1, 4, 16]),
    group=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**16),
)
def test_a_plan_matches_paged_attention_on_random_batches(lens, block_size, group, seed):
    q, kc, vc, bt, sl, keys, values = make_case(lens, block_size, 2, group, head_dim=8, seed=seed)
    out = plan_decode(bt, sl, kc).attend(q, kc, vc, impl="torch")
    torch.testing.assert_close(out, paged_attention(q, kc, vc, bt, sl, impl="torch"), atol=0, rtol=0)
    torch.testing.assert_close(out.double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)


def test_an_empty_batch_plans_and_attends_to_nothing():
    _, kc, vc, _, _, _, _ = make_case([5], 16, 2, 4)
    plan = plan_decode(torch.zeros((0, 3), dtype=torch.int32), torch.zeros(0, dtype=torch.int32), kc)
    assert plan.attend(torch.zeros(0, 8, 32), kc, vc).shape == (0, 8, 32)


def test_a_copy_of_a_plan_with_other_fields_is_refused():
    """dataclasses.replace keeps a plan's tables but not the sizes they were checked against."""
    import dataclasses

    q, kc, vc, bt, sl, _, _ = make_case([5, 40], 16, 2, 4)
    plan = plan_decode(bt, sl, kc)
    for changes in ({"num_seqs": 1}, {"num_blocks": kc.shape[0] - 1}, {}):
        copy = dataclasses.replace(plan, **changes)
        with pytest.raises(InvalidArgumentError, match="not made by plan_decode"):
            copy.attend(q[: copy.num_seqs], kc[: copy.num_blocks], vc[: copy.num_blocks])
    torch.testing.assert_close(plan.attend(q, kc, vc), paged_attention(q, kc, vc, bt, sl), atol=0, rtol=0)
