"""Every exercise test starts with no hints revealed, no predictions or reveals, no log file, and may register throwaway exercises.

``feedback`` is the check the notebooks' exercise tests share.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlab.exercises as ex
from kvlab.exercises import core


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(core, "_attempts", {})
    monkeypatch.setattr(core, "_predictions", {})
    monkeypatch.setattr(core, "_revealed", set())
    monkeypatch.setattr(core, "_REGISTRY", dict(core._REGISTRY))
    monkeypatch.delenv(core.LOG_ENV, raising=False)


@pytest.fixture
def feedback():
    """``feedback(exercise_id, right, remark, wrong)``: ``right`` passes with ``remark`` in its message,
    and each ``(answer, words)`` of ``wrong`` gets a message containing ``words``."""

    def check(exercise_id: str, right: Any, remark: str, wrong: list[tuple[Any, str]]) -> None:
        result = ex.check(exercise_id, right)
        assert result.right and remark in result.message, result.message
        for answer, words in wrong:
            message = ex.check(exercise_id, answer).message
            assert words in message, f"{exercise_id} {answer!r}: {message}"

    return check
