"""Every exercise test starts with no hints revealed, no log file, and may register throwaway exercises."""

from __future__ import annotations

import pytest

from kvlab.exercises import core


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(core, "_attempts", {})
    monkeypatch.setattr(core, "_REGISTRY", dict(core._REGISTRY))
    monkeypatch.delenv(core.LOG_ENV, raising=False)
