"""kvlab's llama-server models against a real llama-server (tools/conformance/llama_harness.py).

Runs a few random slot and sliding-window scenarios on the real server at llama.cpp 0c1e57098 when
its binary is built (``python tools/conformance/llama_harness.py --build``; CI builds it when a
compiler and cmake are there); skips, saying how to build it, otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "conformance"))
import llama_harness  # noqa: E402
import llama_models  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        llama_harness.find_server() is None,
        reason=f"no llama-server at {llama_harness.server_path()}: "
        "run `python tools/conformance/llama_harness.py --build` (see tools/conformance/README.md)",
    ),
]


@pytest.fixture(scope="module")
def models():
    return llama_models.ensure_models(llama_harness.cache_root())


def test_slot_scenarios_agree_request_for_request(models):
    spt, _ = llama_harness.measure_state_size(models["llama"])
    for seed in range(3):
        scenario = llama_harness.gen_slot_scenario(7_000 + seed, 12)
        result = llama_harness.run_slot_scenario(scenario, models["llama"], spt)
        assert result["first"] is None, (scenario["config"], result["first"])
        assert result["agree"] == result["total"]


def test_sliding_window_scenarios_agree(models):
    for seed in range(2):
        scenario = llama_harness.gen_swa_scenario(8_000 + seed, 6)
        result = llama_harness.run_swa_scenario(scenario, models["gemma3"])
        assert result["first"] is None, (scenario["config"], result["first"])
