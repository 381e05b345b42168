"""``paged_attention(impl="flex")``: FlexAttention driven by a block mask built from the block tables.

The eager path evaluates the mask everywhere; the compiled path visits only the
blocks the mask lists. Both are checked against float64 attention: eager on
the full grid of cases (block sizes 1/16/64, GQA 1/4/8, ragged lengths,
shuffled blocks), compiled on a few small shapes (each new shape compiles, and
the compiled callable is cached for the process).
"""

import shutil
import warnings

import pytest

torch = pytest.importorskip("torch")

from test_paged_attention import LENS, TOLERANCE, dense_f64, make_case  # noqa: E402

from kvlab.engine import attention, paged_attention  # noqa: E402
from kvlab.engine.attention import (  # noqa: E402
    FLEX_BACKEND,
    check_decode_args,
    flex_available,
    flex_decode,
    flex_mode,
)
from kvlab.errors import InvalidArgumentError  # noqa: E402

pytestmark = pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch >= 2.5")


def run_flex(case, compiled):
    q, kc, vc, bt, sl = case[:5]
    shape, scale = check_decode_args(q, kc, vc, bt, sl, None)
    return flex_decode(q, kc, vc, bt, sl, scale, shape, compiled=compiled)


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_eager_flex_matches_float64_dense_attention(block_size, group, dtype):
    case = make_case(LENS, block_size, 2, group, dtype=dtype, seed=block_size + group)
    out = run_flex(case, compiled=False)
    assert out.dtype == dtype and out.shape == case[0].shape
    torch.testing.assert_close(
        out.double(), dense_f64(case[0], case[5], case[6]), atol=TOLERANCE[dtype], rtol=0
    )


@pytest.mark.parametrize(("block_size", "group"), [(16, 4), (1, 8)])
def test_compiled_flex_matches_float64_dense_attention(block_size, group):
    """Ragged lengths with partial last blocks, shuffled blocks, spare blocks and a garbage table tail.

    With a C++ compiler present, 16-token blocks must compile; torch 2.13's CPU
    template fails to build for 1-token blocks, which then run eagerly (and say so).
    """
    case = make_case([1, 7, 16, 17, 100], block_size, 2, group, seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = paged_attention(*case[:5], impl="flex")
    kind = (torch.float32, block_size)
    if kind in FLEX_BACKEND.failures:
        assert any("runs those eagerly" in str(w.message) for w in caught)
        assert flex_mode(*kind) == "eager"
    else:
        assert kind in FLEX_BACKEND.compiled and flex_mode(*kind) == "compiled"
    if block_size == 16 and (shutil.which("g++") or shutil.which("c++")):
        assert kind in FLEX_BACKEND.compiled, f"flex did not compile: {FLEX_BACKEND.failures.get(kind)}"
    torch.testing.assert_close(out.double(), dense_f64(case[0], case[5], case[6]), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("g++") or shutil.which("c++")), reason="compiling flex needs a C++ compiler"
)
def test_compiled_flex_stays_compiled_across_pool_sizes_groups_and_batches(monkeypatch):
    """A process meets many shapes; torch 2.13's CPU template fails to build once sizes turn symbolic.

    So compiled flex keeps every shape static: each new pool size, group or batch compiles anew
    and stays exact, and none turns the kind eager.
    """
    monkeypatch.setattr(attention, "FLEX_BACKEND", attention.FlexBackend())
    shapes = [
        ([100, 37, 300], 2, 4, 3),
        ([50, 60], 2, 4, 5),
        ([10, 20, 30, 40], 2, 4, 1),
        ([5, 500], 2, 2, 3),
    ]
    shapes += [([77], 1, 8, 2), ([300, 301, 302], 2, 8, 3)]
    for seed, (lens, kv_heads, group, spare) in enumerate(shapes):
        case = make_case(lens, 16, kv_heads, group, seed=seed, spare_blocks=spare)
        out = paged_attention(*case[:5], impl="flex")
        assert attention.FLEX_BACKEND.failures == {}, (
            f"{lens}, {kv_heads} KV heads x {group}: {attention.FLEX_BACKEND.failures}"
        )
        torch.testing.assert_close(out.double(), dense_f64(case[0], case[5], case[6]), atol=1e-5, rtol=0)
    assert flex_mode(torch.float32, 16) == "compiled"


def test_flex_in_float64_runs_eagerly_and_exactly():
    case = make_case([3, 40, 270], 16, 2, 4, dtype=torch.float64)
    assert flex_mode(torch.float64, 16) == "eager"
    out = paged_attention(*case[:5], impl="flex")
    torch.testing.assert_close(out, dense_f64(case[0], case[5], case[6]), atol=1e-12, rtol=0)


def test_flex_agrees_with_the_other_implementations_and_uses_scale():
    case = make_case([5, 33, 64], 16, 2, 2, seed=7)
    q, kc, vc, bt, sl = case[:5]
    shape, _ = check_decode_args(q, kc, vc, bt, sl, None)
    flex = flex_decode(q, kc, vc, bt, sl, 0.3, shape, compiled=False)
    torch.testing.assert_close(
        flex, paged_attention(q, kc, vc, bt, sl, scale=0.3, impl="torch"), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(flex.double(), dense_f64(q, case[5], case[6], scale=0.3), atol=1e-5, rtol=0)


def test_sequences_may_share_blocks_but_a_row_may_not_repeat_one():
    q, kc, vc, bt, sl, keys, values = make_case([40], 16, 2, 4)
    tables = torch.stack([bt[0], bt[0]]).to(torch.int64)
    query = torch.cat([q, q.flip(-1)])
    shape, scale = check_decode_args(query, kc, vc, tables, torch.tensor([40, 20]), None)
    out = flex_decode(query, kc, vc, tables, torch.tensor([40, 20]), scale, shape, compiled=False)
    expected = dense_f64(query, [keys[0], keys[0][:20]], [values[0], values[0][:20]])
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
    repeated = bt.clone()
    repeated[0, 1] = repeated[0, 0]
    with pytest.raises(InvalidArgumentError, match="names a block twice"):
        paged_attention(q, kc, vc, repeated, sl, impl="flex")


def test_flex_refuses_what_the_others_refuse():
    q, kc, vc, bt, sl = make_case([5, 20], 4, 2, 2)[:5]
    with pytest.raises(InvalidArgumentError, match="outside the pool"):
        bad = bt.clone()
        bad[1, 2] = kc.shape[0]
        paged_attention(q, kc, vc, bad, sl, impl="flex")
    with pytest.raises(InvalidArgumentError, match="at least 1"):
        paged_attention(q, kc, vc, bt, torch.tensor([0, 20], dtype=torch.int32), impl="flex")
