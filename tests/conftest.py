"""Fixtures every part of the suite shares.

``refuses`` is the suite's one form of the promise "a refused call changes nothing": it takes the
model's whole state (``snapshot()`` or ``state()``) and the length of its history before the call,
expects kvlab's error, and checks both are exactly as they were afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hostile import fingerprint as _fingerprint

from kvlab.errors import KvlabError


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
