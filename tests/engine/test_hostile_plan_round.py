"""Hostile round on ``plan_decode`` / ``DecodePlan.attend``.

The failing tests first (each a real bug on the code as it stood), then a few passing pins of what held.
The rule: a refused call raises kvlab's ``InvalidArgumentError`` and changes nothing; an accepted call
gives what ``paged_attention`` gives (and, within rounding, what ``impl="reference"`` gives); nothing a
user controls sizes memory without a bound or reads outside the pool.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_paged_attention import dense_f64, make_case  # noqa: E402

from kvlab.engine import DecodePlan, paged_attention, plan_decode  # noqa: E402
from kvlab.engine.attention import flex_available, triton_available  # noqa: E402
from kvlab.errors import InvalidArgumentError  # noqa: E402

# float64 keeps impl="flex" eager (no torch.compile) in every test here
IMPLS = ["reference", "torch"] + (["flex"] if flex_available() else [])
CPU = torch.device("cpu")
HUGE = (
    2**48
)  # past any address space once multiplied by an element size: an allocation this big fails at once


def small_case(dtype=torch.float64):
    """Two sequences (3 and 4 tokens) in a pool of 4 blocks of 2 tokens, 1 KV head, head_dim 4."""
    gen = torch.Generator().manual_seed(0)
    kc = torch.randn(4, 2, 1, 4, generator=gen, dtype=dtype)
    vc = torch.randn(4, 2, 1, 4, generator=gen, dtype=dtype)
    q = torch.randn(2, 1, 4, generator=gen, dtype=dtype)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    sl = torch.tensor([3, 4], dtype=torch.int32)
    return q, kc, vc, bt, sl


# ---------------------------------------------------------------------------- failing: hand-built / mutated plans

HAND_BUILT = {
    # attend trusts the fields: IndexError from index_select / index_put_ (a compiled or Triton kernel reads out of bounds)
    "block id outside the pool": (2, [[0, 99], [2, 3]], [3, 4]),
    # reference returns torch.empty garbage for sequence 1, torch returns zeros, flex a ValueError
    "fewer table rows than sequences": (2, [[0, 1]], [3]),
    # a length past its table row: RuntimeError "shape '[4, 1, 4]' is invalid" / IndexError
    "a length past its table row": (2, [[0], [2]], [3, 4]),
    # a zero length: torch gives nan, reference and flex give zeros
    "a zero length": (2, [[0, 1], [2, 3]], [0, 4]),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(HAND_BUILT))
def test_a_hand_built_plan_with_inconsistent_fields_is_refused(case, impl):
    """DecodePlan is public and built from any fields; attend must refuse what plan_decode would refuse."""
    q, kc, vc, _, _ = small_case()
    num_seqs, tables, lens = HAND_BUILT[case]
    with pytest.raises(InvalidArgumentError):
        plan = DecodePlan(num_seqs, 4, 2, CPU, torch.tensor(tables), torch.tensor(lens))
        plan.attend(q, kc, vc, impl=impl)


def test_a_plan_hands_out_no_tensor_a_caller_could_write_into():
    """The checked tables are private (a public tensor field let a write reach unchecked entries),
    and the plan's fields cannot be reassigned."""
    import dataclasses

    q, kc, vc, bt, sl = small_case()
    plan = plan_decode(bt, sl, kc)
    public = [name for name in vars(plan) if not name.startswith("_")]
    assert all(not isinstance(getattr(plan, name), torch.Tensor) for name in public)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.num_seqs = 5  # type: ignore[misc]


# ---------------------------------------------------------------------------- failing: unbounded sizes


@pytest.mark.parametrize("kind", ["int32 lengths", "negated int64 lengths"])
def test_a_huge_expanded_batch_is_refused_before_its_lengths_are_copied(kind):
    """2**50 sequences as zero-stride views: the number of sequences is never bounded before
    host_ints copies every length (numpy MemoryError "Unable to allocate 8.00 PiB" for int32;
    torch RuntimeError "DefaultCPUAllocator: can't allocate memory" for a negated view, which
    resolve_neg materialises). It is refused only afterwards, by MAX_TABLE_ENTRIES.
    (Plain int64 lengths are not copied but lens.min() then walks 2**50 entries: it hangs.)"""
    _, kc, _, _, _ = small_case()
    rows = 2**50
    table = torch.zeros(1, 1, dtype=torch.int32).expand(rows, 1)
    if kind == "int32 lengths":
        lens = torch.ones(1, dtype=torch.int32).expand(rows)
    else:
        lens = torch._neg_view(torch.full((1,), -1, dtype=torch.int64).expand(rows))
    with pytest.raises(InvalidArgumentError):
        plan_decode(table, lens, kc)


def _expanded(claim: str):
    """A cache (and query) that claims one huge size through zero strides, holding a few numbers."""
    if claim == "block_size":
        kc = torch.zeros(1, 1, 1, 4, dtype=torch.float64).expand(1, HUGE, 1, 4)
        q = torch.ones(1, 1, 4, dtype=torch.float64)
    elif claim == "num_blocks":
        kc = torch.zeros(1, 2, 1, 4, dtype=torch.float64).expand(HUGE, 2, 1, 4)
        q = torch.ones(1, 1, 4, dtype=torch.float64)
    else:  # head_dim
        kc = torch.zeros(1, 1, 1, 1, dtype=torch.float64).expand(1, 4, 1, HUGE)
        q = torch.ones(1, 1, 1, dtype=torch.float64).expand(1, 1, HUGE)
    return q, kc


@pytest.mark.parametrize(
    "claim, impl",
    [
        ("block_size", "reference"),  # LIMITS.block_size is 65,536; gather_sequence allocates 2 PiB
        ("block_size", "torch"),  # the walk's tile buffer: new_empty((1, 2**48, 1, 4))
        (
            "num_blocks",
            "flex",
        ),  # _flex_block_mask's owners [num_seqs, num_blocks] int64, before the view check
        ("head_dim", "torch"),  # query.to(work) * scale over an expanded 2**48 head_dim
    ],
)
def test_a_cache_claiming_a_huge_size_through_expand_is_refused(claim, impl):
    """plan_decode and attend accept a zero-stride cache of any claimed size (num_blocks past
    LIMITS.num_blocks, block_size past LIMITS.block_size); the kernels then size buffers by the
    claim: RuntimeError "DefaultCPUAllocator: can't allocate memory: you tried to allocate
    2251799813685248 bytes" escapes. Should be InvalidArgumentError before any allocation."""
    if impl == "flex" and not flex_available():
        pytest.skip("no FlexAttention")
    q, kc = _expanded(claim)
    with pytest.raises(InvalidArgumentError, match="expanded view"):
        plan_decode(torch.zeros(1, 1, dtype=torch.int32), torch.tensor([2]), kc).attend(q, kc, kc, impl=impl)
    with pytest.raises(InvalidArgumentError, match="expanded view"):
        paged_attention(q, kc, kc, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([2]), impl=impl)


# ---------------------------------------------------------------------------- failing: scale and impl


def test_a_huge_integer_scale_is_refused():
    """scale=10**400 is an int: math.isfinite raises OverflowError ("int too large to convert to float")."""
    q, kc, vc, bt, sl = small_case()
    plan = plan_decode(bt, sl, kc)
    with pytest.raises(InvalidArgumentError, match="scale"):
        plan.attend(q, kc, vc, scale=10**400)


SETUP = """
import torch
from kvlab.engine import DecodePlan, plan_decode
from kvlab.errors import InvalidArgumentError
g = torch.Generator().manual_seed(0)
kc = torch.randn(4, 2, 1, 4, generator=g); vc = torch.randn(4, 2, 1, 4, generator=g)
q = torch.randn(2, 1, 4, generator=g)
bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32); sl = torch.tensor([3, 4], dtype=torch.int32)
plan = plan_decode(bt, sl, kc)
def attend(plan):
    try:
        print("ANSWER", plan.attend(q, kc, vc, impl="triton").flatten().tolist(), flush=True)
    except InvalidArgumentError as e:
        print("REFUSED", e, flush=True)
"""


def _run(body: str, interpret: bool) -> subprocess.CompletedProcess:
    """A fresh interpreter: TRITON_INTERPRET is read when triton is imported, and a crash must not take pytest down."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", SETUP + body],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_impl_triton_with_cpu_tensors_is_refused():
    """Outside the test suite (no TRITON_INTERPRET), impl='triton' on CPU tensors launches the kernel:
    triton's RuntimeError "0 active drivers ([]). There should only be one." escapes."""
    done = _run("attend(plan)", interpret=False)
    assert done.returncode == 0 and "REFUSED" in done.stdout, done.stderr[-400:]


TRITON_OOB = {
    "a hand-built plan": "plan = DecodePlan(2, 4, 2, torch.device('cpu'), torch.tensor([[0, 10**5], [2, 3]]), sl.long())",
}


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("case", list(TRITON_OOB))
def test_an_unchecked_table_entry_does_not_crash_the_triton_kernel(case):
    """Block id 100000 in a 4-block pool reaching impl='triton' (the interpreter, as the suite runs it on
    a CPU): the kernel reads outside the pool and the process dies of SIGSEGV (returncode -11)."""
    done = _run(f"attend(plan)\n{TRITON_OOB[case]}\nattend(plan)", interpret=True)
    assert done.returncode == 0, f"returncode {done.returncode}: {done.stderr[-400:]}"
    first, second = done.stdout.split("\n")[:2]
    assert second.startswith("REFUSED") or second == first


# ---------------------------------------------------------------------------- passing pins


@pytest.mark.parametrize("impl", IMPLS)
def test_pin_hostile_layouts_give_exactly_what_paged_attention_gives(impl):
    q, kc, vc, bt, sl, keys, values = make_case([1, 5, 17, 40], 4, 2, 2, head_dim=8, dtype=torch.float64)
    wide = torch.cat([kc, vc], dim=3)
    variants = [
        (q, kc, vc, bt, sl),
        (torch._neg_view(-q), kc, vc, torch._neg_view(-bt), torch._neg_view(-sl)),
        (q, kc, vc, bt.t().contiguous().t(), sl.to(torch.int8)),
        (q.flip(0), kc, vc, bt.flip(0), sl.flip(0)),
        (q, wide[..., ::2], wide[..., 1::2], bt.to(torch.int64), sl.to(torch.uint8)),  # strided caches
        (q, kc, kc, bt, sl),  # aliased caches
        (q[:1].expand(4, -1, -1), kc, vc, bt, sl),
    ]
    for args in variants:
        q_, k_, v_, t_, l_ = args
        out = plan_decode(t_, l_, k_).attend(q_, k_, v_, impl=impl)
        torch.testing.assert_close(out, paged_attention(*args, impl=impl), atol=0, rtol=0)
    out = plan_decode(bt, sl, kc).attend(q, kc, vc, impl=impl)
    torch.testing.assert_close(out, dense_f64(q, keys, values), atol=1e-10, rtol=0)


def test_pin_one_plan_serves_a_layer_of_another_dtype_and_head_count():
    q, kc, vc, bt, sl, _, _ = make_case([5, 40, 33], 16, 2, 4, head_dim=8)
    plan = plan_decode(bt, sl, kc)
    gen = torch.Generator().manual_seed(3)
    for dtype, hkv, dim in ((torch.float16, 2, 8), (torch.bfloat16, 1, 16), (torch.float64, 4, 4)):
        k = torch.randn(kc.shape[0], 16, hkv, dim, generator=gen).to(dtype)
        v = torch.randn(kc.shape[0], 16, hkv, dim, generator=gen).to(dtype)
        qq = torch.randn(3, hkv * 2, dim, generator=gen).to(dtype)
        for impl in ("reference", "torch"):
            torch.testing.assert_close(
                plan.attend(qq, k, v, impl=impl), paged_attention(qq, k, v, bt, sl, impl=impl), atol=0, rtol=0
            )


def test_pin_int64_tables_shared_with_numpy_are_still_copied():
    """int64 contiguous tables are read through numpy without a copy; the plan must still copy them."""
    q, kc, vc, bt, sl, keys, values = make_case([5, 40, 33], 16, 2, 4)
    bt, sl = bt.to(torch.int64), sl.to(torch.int64)
    plan = plan_decode(bt, sl, kc)
    before = plan.attend(q, kc, vc, impl="torch")
    bt.fill_(10**6)
    sl.fill_(10**5)
    torch.testing.assert_close(plan.attend(q, kc, vc, impl="torch"), before, atol=0, rtol=0)
    torch.testing.assert_close(before.double(), dense_f64(q, keys, values), atol=1e-5, rtol=0)


def test_pin_refused_attends_leave_the_plan_as_it_was():
    q, kc, vc, bt, sl = small_case()
    plan = plan_decode(bt, sl, kc)
    tables, lens = plan._block_tables.clone(), plan._seq_lens.clone()
    expected = plan.attend(q, kc, vc)
    refused = [
        lambda: plan.attend(q.requires_grad_(False).clone().requires_grad_(), kc, vc),
        lambda: plan.attend(q, kc.clone().requires_grad_(), vc),
        lambda: plan.attend(q, torch._neg_view(kc), vc),
        lambda: plan.attend(q, kc.float(), vc),
        lambda: plan.attend(q, kc[:3], vc[:3]),
        lambda: plan.attend(q, kc.reshape(2, 4, 1, 4), vc.reshape(2, 4, 1, 4)),
        lambda: plan.attend(q[:1], kc, vc),
        lambda: plan.attend(q, kc, vc, scale=math.inf),
        lambda: plan.attend(q, kc, vc, scale=True),
        lambda: plan.attend(q, kc, vc, impl=None),
        lambda: plan.attend(q.to(torch.complex128), kc, vc),
    ]
    for call in refused:
        with pytest.raises(InvalidArgumentError):
            call()
    assert torch.equal(plan._block_tables, tables) and torch.equal(plan._seq_lens, lens)
    torch.testing.assert_close(plan.attend(q, kc, vc), expected, atol=0, rtol=0)


def test_pin_plan_decode_refuses_bad_tables_with_kvlabs_error():
    _, kc, _, bt, sl = small_case()
    for tables, lens in (
        (bt.bool(), sl),
        (bt.to(torch.complex64), sl),
        (bt, sl.to(torch.uint16)),
        (bt, sl.float()),
        (bt, sl * 0),
        (bt - 1, sl),
        (torch.zeros(1, 1, dtype=torch.int64).expand(1, 2**62), torch.tensor([2**62])),
        (torch.zeros(1, 1, dtype=torch.int64).expand(9, 4 << 20), torch.full((9,), 4 << 20)),  # 18.9M entries
    ):
        with pytest.raises(InvalidArgumentError):
            plan_decode(tables, lens, kc)
    empty = plan_decode(torch.zeros((0, 2**40), dtype=torch.int32), torch.zeros(0, dtype=torch.int32), kc)
    assert empty.attend(torch.zeros(0, 1, 4, dtype=torch.float64), kc, kc).shape == (0, 1, 4)
