"""Hostile round three: ``block_hashes`` / ``plain_token_ids`` and the decode's argument checks.

Every test here failed on the code as it stood, each for the reason its docstring gives.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvlab.core.hashing import block_hashes, check_token_ids, plain_token_ids
from kvlab.errors import InvalidArgumentError

torch = pytest.importorskip("torch")

from test_paged_attention import dense_f64, make_case  # noqa: E402

import kvlab.engine.attention as attention  # noqa: E402
from kvlab.engine import paged_attention, plan_decode  # noqa: E402
from kvlab.engine.attention import compile_available, triton_available  # noqa: E402


def refused_or(call, expected):
    """The call refuses with kvlab's error, or gives ``expected``; anything else (a plain exception, another value) fails."""
    try:
        got = call()
    except InvalidArgumentError:
        return
    assert got == expected


# ---------------------------------------------------------------------------- hashing


class _Meta(type):
    """A class that says it equals every class: ``type(x) in (list, tuple)`` is True for its instances."""

    def __eq__(cls, other):
        return True

    __hash__ = type.__hash__


class _ShapeShifter(metaclass=_Meta):
    """Iterates as four plain ids once, then as anything but token ids."""

    def __init__(self):
        self.calls = 0

    def __len__(self):
        return 4

    def __iter__(self):
        self.calls += 1
        return iter([1, 2, 3, 4] if self.calls == 1 else [-5, "x", 2**80, None])


@pytest.mark.parametrize("scheme", ["lesson", "vllm"])
def test_a_class_that_claims_to_equal_list_does_not_take_the_fast_path(scheme):
    """``type(tokens) in _SEQUENCES`` compares with ==, so a metaclass __eq__ passes it; plain_token_ids then
    vouches for the first iteration and ``_chain`` hashes the second: vllm returns a digest of
    (-5, 'x', 2**80, None), lesson raises struct.error ("required argument is not an integer")."""
    refused_or(
        lambda: block_hashes(_ShapeShifter(), 4, scheme=scheme), block_hashes([1, 2, 3, 4], 4, scheme=scheme)
    )


def test_check_token_ids_never_returns_non_ids():
    """check_token_ids(_ShapeShifter()) returns [-5, 'x', 2**80, None] (list(tokens) iterates again)."""
    refused_or(lambda: check_token_ids("tokens", _ShapeShifter()), [1, 2, 3, 4])


class _NpLiar(np.int64):
    """A numpy int of value 7 whose own __int__ says 5."""

    def __int__(self):
        return 5

    def __index__(self):
        return 5


class _NpRaiser(np.int64):
    def __int__(self):
        raise RuntimeError("hostile __int__")


def test_a_numpy_int_subclass_is_hashed_as_its_plain_value():
    """check_tokens reads a numpy int through int(value), which runs a subclass's own __int__: [ _NpLiar(7) ] * 4
    hashes as [5] * 4 (an int subclass is read with int.__int__, its plain value, whatever it overrides)."""
    refused_or(lambda: block_hashes([_NpLiar(7)] * 4, 4), block_hashes([7] * 4, 4))


def test_a_numpy_int_subclass_whose_int_raises_is_read_from_its_stored_value():
    """RuntimeError('hostile __int__') escaped block_hashes (check_tokens' _as_int called int(value)); numpy's
    own item() reads the stored 7."""
    refused_or(lambda: block_hashes([_NpRaiser(7)] * 4, 4), block_hashes([7] * 4, 4))


class _FakeInt:
    @property
    def __class__(self):  # isinstance(x, int) is True through __class__
        return int


class _FakeStr:
    @property
    def __class__(self):
        return str


@pytest.mark.parametrize(
    "call",
    [
        lambda: block_hashes([_FakeInt()] * 4, 4),  # tokens
        lambda: block_hashes([_FakeInt()] * 30, 4),  # past the short loop
        lambda: block_hashes([1] * 4, _FakeInt()),  # block_size
        lambda: block_hashes([1] * 4, 4, salt=_FakeStr()),
        lambda: block_hashes([1] * 4, 4, scheme=_FakeStr()),
    ],
    ids=["token", "many tokens", "block_size", "salt", "scheme"],
)
def test_an_object_whose_class_attribute_lies_is_refused_with_kvlabs_error(call):
    """isinstance(x, int/str) is True through a __class__ property, then int.__int__(x) / str.__str__(x) raise
    TypeError ("descriptor '__int__' requires a 'int' object but received a '_FakeInt'"), which escapes."""
    with pytest.raises(InvalidArgumentError):
        call()


@pytest.mark.parametrize(
    "scheme, replacement",
    [("lesson", [-1] * 32), ("lesson", [2**40] * 32), ("vllm", [1.5] * 32)],
    ids=["lesson -1", "lesson 2**40", "vllm floats"],
)
def test_the_tokens_hashed_are_the_tokens_checked(scheme, replacement):
    """The fast check vouches for the list, then block_size's check runs user code (int() of a numpy int
    subclass), which rewrites the list; _chain hashes what is there: digests of 32 ids -1 (lesson), of
    32 floats (vllm), or struct.error "'i' format requires -2147483648 <= number <= 2147483647" escapes."""
    tokens = [1] * 32

    class Size(np.int64):
        def __int__(self):
            tokens[:] = replacement
            return 4

    refused_or(lambda: block_hashes(tokens, Size(4), scheme=scheme), block_hashes([1] * 32, 4, scheme=scheme))


class _ListLiar(list):
    def __iter__(self):
        return iter([1, 2, 3])


@pytest.mark.parametrize(
    "value",
    [range(5), {1, 2}, {1: "a"}, b"abc", _ListLiar([-1, "x"]), iter([1, 2]), None, 5],
    ids=["range", "set", "dict", "bytes", "list subclass", "iterator", "None", "int"],
)
def test_plain_token_ids_is_false_for_anything_but_a_list_or_tuple(value):
    """Up to 24 items the check is a loop that never looks at the container: range, set, dict, bytes and a
    list subclass holding [-1, 'x'] give True; an iterator, None or an int raise TypeError (len())."""
    try:
        result = plain_token_ids(value)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"plain_token_ids raised {type(exc).__name__}: {exc}")
    assert result is False


# ---------------------------------------------------------------------------- decode: scale and impl


def _case():
    return make_case([5, 40], 16, 2, 4, dtype=torch.float64)


class _NeverBelowZero(float):
    def __le__(self, other):
        return False


class _FloatsNegative(float):
    def __float__(self):
        return -2.0


@pytest.mark.parametrize("use_plan", [False, True])
@pytest.mark.parametrize(
    "scale, stored",
    [(_NeverBelowZero(-1.0), -1.0), (_FloatsNegative(0.5), 0.5)],
    ids=["-1.0 with a lying <=", "0.5 whose float() is -2"],
)
def test_a_scale_is_read_from_its_stored_value(scale, stored, use_plan):
    """_check_scale compared with the subclass's own <= and returned float(scale), the subclass's __float__:
    the attention ran with scale -1.0 or -2.0. Now the stored value decides: refused when it is not
    positive, else used as it is."""
    q, kc, vc, bt, sl, keys, values = _case()

    def attend(s):
        if use_plan:
            return plan_decode(bt, sl, kc).attend(q, kc, vc, scale=s, impl="reference")
        return paged_attention(q, kc, vc, bt, sl, scale=s, impl="reference")

    if stored <= 0:
        with pytest.raises(InvalidArgumentError, match="scale"):
            attend(scale)
    else:
        torch.testing.assert_close(attend(scale), attend(stored), atol=0, rtol=0)


class _SmallLookingInt(int):
    def bit_length(self):
        return 1


class _BadRepr:
    def __repr__(self):
        raise RuntimeError("hostile __repr__")


class _NanBadRepr(float):
    def __repr__(self):
        raise RuntimeError("hostile __repr__")


class _BadEq:
    def __eq__(self, other):
        raise RuntimeError("hostile __eq__")

    __hash__ = object.__hash__


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scale": _SmallLookingInt(10**400)},  # OverflowError: int too large to convert to float
        {"scale": _BadRepr()},  # RuntimeError from f"{scale!r}"
        {"scale": _NanBadRepr("nan")},
        {"impl": _BadRepr()},  # RuntimeError from f"{impl!r}"
        {"impl": _BadEq()},  # RuntimeError from impl == "flex"
    ],
    ids=[
        "huge int subclass scale",
        "scale repr raises",
        "nan scale repr raises",
        "impl repr raises",
        "impl eq raises",
    ],
)
def test_a_hostile_scale_or_impl_is_refused_with_kvlabs_error(kwargs):
    """The scale and impl checks call the argument's own bit_length, __eq__ and __repr__ (kvlab's checks use
    brief() and exact types): OverflowError / RuntimeError escape instead of InvalidArgumentError."""
    q, kc, vc, bt, sl, _, _ = _case()
    with pytest.raises(InvalidArgumentError):
        paged_attention(q, kc, vc, bt, sl, **kwargs)
    with pytest.raises(InvalidArgumentError):
        plan_decode(bt, sl, kc).attend(q, kc, vc, **kwargs)


TRITON_SETUP = """
import os, sys
import torch
from kvlab.engine import paged_attention
from kvlab.errors import InvalidArgumentError
g = torch.Generator().manual_seed(0)
kc = torch.randn(4, 2, 1, 4, generator=g); vc = torch.randn(4, 2, 1, 4, generator=g)
q = torch.randn(2, 1, 4, generator=g)
bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32); sl = torch.tensor([3, 4], dtype=torch.int32)
class Liar(str):  # equal to 'auto' when impl is checked, to nothing afterwards
    calls = 0
    def __eq__(self, other):
        Liar.calls += 1
        return Liar.calls == 2
    __hash__ = str.__hash__
def attend(impl):
    try:
        out = paged_attention(q, kc, vc, bt, sl, impl=impl)
        ref = paged_attention(q, kc, vc, bt, sl, impl="reference")
        print("ANSWER", bool(torch.allclose(out, ref, atol=1e-5)), flush=True)
    except InvalidArgumentError as e:
        print("REFUSED", e, flush=True)
    except Exception as e:
        print("PLAIN", type(e).__name__, str(e)[:200], flush=True)
"""

TRITON_CASES = {
    # _check_impl compares with the subclass's __eq__ and keeps the subclass; _decode's impl == ... tests all
    # fail, so the call falls through to the Triton kernel on CPU tensors:
    # RuntimeError "0 active drivers ([]). There should only be one."
    "a str subclass impl": "attend(Liar('triton'))",
    # the CPU refusal reads os.environ at call time, but triton reads it at import: InterpreterError
    # RuntimeError("Cannot call @triton.jit'd outside of the scope of a kernel") escapes
    "TRITON_INTERPRET set after triton is imported": (
        "import triton\nos.environ['TRITON_INTERPRET'] = '1'\nattend('triton')"
    ),
}


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("case", list(TRITON_CASES))
def test_triton_on_cpu_tensors_is_refused_or_right(case):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", TRITON_SETUP + TRITON_CASES[case]],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-400:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("REFUSED") or line == "ANSWER True", line


# ---------------------------------------------------------------------------- the compiled CPU decode


@pytest.mark.skipif(not compile_available(), reason="torch.compile needs a C++ compiler")
@pytest.mark.parametrize(
    "lens, seq, position",
    [([40], 0, 35), ([48], 0, 40), ([5, 70, 33], 1, 69)],
    ids=["partial last block", "full last block", "a batch"],
)
def test_the_compiled_decode_gives_the_references_answer_for_an_infinite_written_value(
    monkeypatch, lens, seq, position
):
    """A written value of inf in a sequence's last block: the reference and the walk give inf, the compiled
    kernel gives nan. Its chunks pad a short last chunk with copies of the last block and weigh them by
    exactly 0, and 0 * inf is nan (the unwritten-slot check looks only past the end)."""
    monkeypatch.setattr(attention, "COMPILED_MIN_BYTES", 0)
    monkeypatch.setattr(attention.COMPILED, "enabled", True)
    q, kc, vc, bt, sl, keys, values = make_case(lens, 16, 2, 4)
    block = int(bt[seq, position // 16])
    vc[block, position % 16, 0, 5] = float("inf")
    values[seq][position, 0, 5] = float("inf")
    expected = paged_attention(q, kc, vc, bt, sl, impl="reference")
    assert torch.isinf(expected[seq, :4, 5]).all()  # the reference: inf for KV head 0's query heads
    out = plan_decode(bt, sl, kc).attend(q, kc, vc, impl="torch")
    assert attention.COMPILED.failure is None
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0, equal_nan=True)
    finite = [s for s in range(len(lens)) if s != seq]
    if finite:
        torch.testing.assert_close(
            out[finite].double(),
            dense_f64(q[finite], [keys[s] for s in finite], [values[s] for s in finite]),
            atol=1e-5,
            rtol=0,
        )
