"""Hostile round on ``paged_attention`` (impl torch / flex / compiled) and ``timing_per_turn_figure``.

Each test asserts what kvlab's rule requires: a refused call raises kvlab's own error (a
``KvlabError``), an accepted call returns what ``impl="reference"`` returns, and no call
turns a compiled path off for later good calls.
"""

from __future__ import annotations

import pytest
import torch

import kvlab.engine.attention as attention
from kvlab.engine import paged_attention
from kvlab.errors import KvlabError

BS = 4


def make_case(dtype=torch.float32, lens=(5, 9), num_blocks=8, hkv=2, group=2, dim=8, width=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kc = torch.randn(num_blocks, BS, hkv, dim, generator=gen, dtype=dtype)
    vc = torch.randn(num_blocks, BS, hkv, dim, generator=gen, dtype=dtype)
    q = torch.randn(len(lens), hkv * group, dim, generator=gen, dtype=dtype)
    bt = torch.randperm(num_blocks, generator=gen)[: len(lens) * width].view(len(lens), width).to(torch.int32)
    sl = torch.tensor(lens, dtype=torch.int32)
    return q, kc, vc, bt, sl


def accepted_or_refused(args, impl, **kw):
    """The rule: either kvlab's own error, or the reference's answer."""
    try:
        out = paged_attention(*args, impl=impl, **kw)
    except KvlabError:
        return
    ref = paged_attention(*args, impl="reference", **kw)
    torch.testing.assert_close(out.double(), ref.double(), atol=1e-4, rtol=1e-4, equal_nan=False)


def poison_unwritten_slots(vc, bt, sl, value):
    """Fill the slots past each sequence's end in its last block (never written: torch.empty memory)."""
    vc = vc.clone()
    for s, n in enumerate(sl.tolist()):
        off = n % BS
        if off:
            vc[int(bt[s, (n - 1) // BS]), off:] = value
    return vc


# ------------------------------------------------------------------ impl="torch"


def test_torch_decode_with_a_key_cache_that_requires_grad():
    # the walk's index_select(out=...) raises torch's RuntimeError about autograd
    q, kc, vc, bt, sl = make_case()
    accepted_or_refused((q, kc.clone().requires_grad_(True), vc, bt, sl), "torch")


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_torch_walk_ignores_unwritten_slots_of_the_last_block(poison):
    # p = 0 for a masked slot, but 0 * nan (or inf) = nan poisons the weighted sum of values
    q, kc, vc, bt, sl = make_case()
    vc = poison_unwritten_slots(vc, bt, sl, poison)
    out = paged_attention(q, kc, vc, bt, sl, impl="torch")
    ref = paged_attention(q, kc, vc, bt, sl, impl="reference")
    assert not ref.isnan().any()
    torch.testing.assert_close(out.double(), ref.double(), atol=1e-5, rtol=1e-5)


def test_compiled_decode_ignores_unwritten_slots_of_the_last_block(monkeypatch):
    monkeypatch.setattr(attention, "COMPILED_MIN_BYTES", 0)
    q, kc, vc, bt, sl = make_case()
    vc = poison_unwritten_slots(vc, bt, sl, float("nan"))
    out = paged_attention(q, kc, vc, bt, sl, impl="torch")
    ref = paged_attention(q, kc, vc, bt, sl, impl="reference")
    torch.testing.assert_close(out.double(), ref.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["torch", "flex"])
def test_a_finite_scale_past_float32_range_is_refused_or_exact(impl):
    # scale=1e39 is a positive finite Python float and is accepted; the float32 kernels give nan
    q, kc, vc, bt, sl = make_case()
    accepted_or_refused((q, kc, vc, bt, sl), impl, scale=1e39)


def test_flex_with_a_query_of_zero_heads_does_not_kill_the_process():
    # num_heads 0 passes "a multiple of num_kv_heads"; impl="flex" then dies with SIGFPE (Floating point
    # exception, a division by zero in native code) instead of refusing or returning the empty result
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from kvlab.engine import paged_attention\n"
        "from kvlab.errors import KvlabError\n"
        "q = torch.randn(2, 0, 8); kc = torch.randn(8, 4, 2, 8); vc = torch.randn(8, 4, 2, 8)\n"
        "bt = torch.arange(8, dtype=torch.int32).view(2, 4); sl = torch.tensor([5, 9], dtype=torch.int32)\n"
        "try:\n"
        "    out = paged_attention(q, kc, vc, bt, sl, impl='flex')\n"
        "    assert out.shape == (2, 0, 8), out.shape\n"
        "except KvlabError:\n"
        "    pass\n"
    )
    if not attention.flex_available():
        pytest.skip("FlexAttention needs torch >= 2.5")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-800:]}"


@pytest.mark.parametrize("impl", ["torch", "reference"])
def test_meta_tensors_are_refused_with_kvlab_s_error(impl):
    q, kc, vc, bt, sl = (t.to("meta") for t in make_case())
    with pytest.raises(KvlabError):
        paged_attention(q, kc, vc, bt, sl, impl=impl)


@pytest.mark.parametrize("which", ["query", "cache", "block_tables", "seq_lens"])
def test_sparse_tensors_are_refused_with_kvlab_s_error(which):
    q, kc, vc, bt, sl = make_case()
    if which == "query":
        q = q.to_sparse()
    elif which == "cache":
        kc, vc = kc.to_sparse(), vc.to_sparse()
    elif which == "block_tables":
        bt = bt.to_sparse()
    else:
        sl = sl.to_sparse()
    with pytest.raises(KvlabError):
        paged_attention(q, kc, vc, bt, sl, impl="torch")


def test_a_wide_expanded_table_is_not_materialised():
    # a 2 x 2**40 table that costs 4 bytes (stride 0): the check allocates 8 TiB (arange over every column)
    # and fails with torch's allocator RuntimeError. Only the first cdiv(seq_len, block_size) columns matter.
    q, kc, vc, bt, sl = make_case()
    wide = bt[:, :1].expand(2, 2**40)
    narrow = bt[:, :1].expand(2, 4)
    sl = torch.tensor([3, 4], dtype=torch.int32)
    try:
        out = paged_attention(q, kc, vc, wide, sl, impl="torch")
    except KvlabError:
        return
    ref = paged_attention(q, kc, vc, narrow, sl, impl="reference")
    torch.testing.assert_close(out.double(), ref.double(), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ impl="flex"

flex_only = pytest.mark.skipif(not attention.flex_available(), reason="FlexAttention needs torch >= 2.5")


@flex_only
@pytest.mark.parametrize("layout", ["permuted", "expanded"])
def test_flex_with_a_non_contiguous_cache(layout, monkeypatch):
    monkeypatch.setattr(attention, "FLEX_BACKEND", attention.FlexBackend())  # a compile failure stays here
    # flex_decode does key_cache.view(...): torch's RuntimeError "view size is not compatible"
    q, kc, vc, bt, sl = make_case()
    if layout == "permuted":
        kc = kc.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    else:
        kc = kc[:1].expand(8, -1, -1, -1)
    accepted_or_refused((q, kc, vc, bt, sl), "flex")


@flex_only
def test_flex_ignores_unwritten_slots_of_the_last_block(monkeypatch):
    monkeypatch.setattr(attention, "FLEX_BACKEND", attention.FlexBackend())  # a compile failure stays here
    q, kc, vc, bt, sl = make_case()
    vc = poison_unwritten_slots(vc, bt, sl, float("nan"))
    with pytest.raises(KvlabError, match="past the end of sequence 0: impl='flex' weighs such slots by 0"):
        paged_attention(q, kc, vc, bt, sl, impl="flex")  # refused, naming the block: flex cannot skip them
    vc = poison_unwritten_slots(vc, bt, sl, 0.0)  # zeroed, as the message says: accepted and right
    accepted_or_refused((q, kc, vc, bt, sl), "flex")


@flex_only
def test_flex_with_a_query_that_requires_grad_neither_raises_plainly_nor_turns_compiling_off(monkeypatch):
    # the compiled call raises NotImplementedError (no backward on CPU), _flex_call records it as a
    # compiler failure of (float32, 4) for the process, and the eager retry raises it again, plainly
    monkeypatch.setattr(attention, "FLEX_BACKEND", attention.FlexBackend())
    q, kc, vc, bt, sl = make_case()
    try:
        paged_attention(q.clone().requires_grad_(True), kc, vc, bt, sl, impl="flex")
    except KvlabError:
        pass
    except Exception as exc:  # noqa: BLE001
        failures = dict(attention.FLEX_BACKEND.failures)
        pytest.fail(f"plain {type(exc).__name__}: {exc}; flex failures now {failures}")
    assert attention.FLEX_BACKEND.failures == {}
    assert attention.flex_mode(torch.float32, BS) == "compiled"


# ------------------------------------------------------------------ timing_per_turn_figure


def test_timing_figure_with_title_none():
    # check_title accepts None, then title_text(None) raises AttributeError: 'NoneType' has no 'split'
    from kvlab.core.timing import Timing
    from kvlab.views import timing_per_turn_figure

    t = Timing((1.0, 2.0, 3.0), (1.0, 2.0, 3.0))
    try:
        fig = timing_per_turn_figure({"a": [t, t]}, y_title="ms", title=None)
    except KvlabError:
        return
    assert len(fig.data) == 1


def test_timing_figure_checks_the_quartiles_it_draws():
    # a Timing subclass whose quartiles lie (text, nan) is drawn from its own samples, checked again
    from kvlab.core.timing import Timing
    from kvlab.views import timing_per_turn_figure

    class TextQ1(Timing):
        @property
        def q1_ms(self):
            return "1.0"

    class NanQ3(Timing):
        @property
        def q3_ms(self):
            return float("nan")

    for fake in (TextQ1((1.0, 2.0, 4.0), (1.0, 2.0, 4.0)), NanQ3((1.0, 2.0, 4.0), (1.0, 2.0, 4.0))):
        fig = timing_per_turn_figure({"a": [fake]}, y_title="ms", title="T")  # drawn from its own samples
        honest = Timing((1.0, 2.0, 4.0), (1.0, 2.0, 4.0))
        assert list(fig.data[0].error_y.array) == [honest.q3_ms - honest.median_ms]
        assert list(fig.data[0].error_y.arrayminus) == [honest.median_ms - honest.q1_ms]
