"""Fixtures every part of the suite shares.

``refuses`` is the suite's one form of the promise "a refused call changes nothing": it takes the
model's whole state (``snapshot()`` or ``state()``) and the length of its history before the call,
expects kvlab's error, and checks both are exactly as they were afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest


def _interpret_triton_without_a_gpu() -> None:
    """Switch Triton's interpreter on before anything in the session imports triton.

    ``triton.jit`` decides at decoration time; torch.compile (which kvlab's CPU decode uses, and which a
    skip condition probes at collection) imports triton too, so the Triton kernel's test module would
    set the variable too late.
    """
    if "TRITON_INTERPRET" in os.environ:
        return
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_interpret_triton_without_a_gpu()

from hostile import fingerprint as _fingerprint  # noqa: E402 - after the interpreter switch

from kvlab.errors import KvlabError  # noqa: E402


def assert_refused(
    model: Any, call: Callable[[Any], Any], error: type[BaseException] = KvlabError, match: str | None = None
) -> pytest.ExceptionInfo:
    """Run ``call(model)``; it must raise ``error`` (matching ``match``) and leave the model as it was."""
    before = _fingerprint(model)
    with pytest.raises(error, match=match) as info:
        call(model)
    assert str(info.value), "a refusal must say what was wrong"
    assert _fingerprint(model) == before, "a refused call changed the model"
    return info


@pytest.fixture
def refuses() -> Callable[..., pytest.ExceptionInfo]:
    """``refuses(model, call, error, match)``: the call is refused with that error and changes nothing."""
    return assert_refused


@pytest.fixture
def one_thread():
    """The CI machine has two shared cores; one intra-op thread avoids OpenMP stalls on tiny torch ops."""
    torch = pytest.importorskip("torch")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
