"""kvlab's llama-server models against a real llama-server (tools/conformance/llama_harness.py).

Runs a few random slot and sliding-window scenarios, and the lessons' real-server cells, on the real
server at llama.cpp 0c1e57098 when its binary is built (``python tools/conformance/llama_harness.py
--build``; CI builds it when a compiler and cmake are there); those skip, saying how to build it,
otherwise. The last test checks what a lesson cell prints without the binary.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "conformance"))
import llama_harness  # noqa: E402
import llama_models  # noqa: E402

from kvlab.lessons import ex10, ex11, ex12, real_llama  # noqa: E402

needs_server = pytest.mark.skipif(
    llama_harness.find_server() is None,
    reason=f"no llama-server at {llama_harness.server_path()}: "
    "run `python tools/conformance/llama_harness.py --build` (see tools/conformance/README.md)",
)


@pytest.fixture(scope="module")
def models():
    return llama_models.ensure_models(llama_harness.cache_root())


@pytest.mark.slow
@needs_server
@pytest.mark.parametrize("seed", range(3))
def test_slot_scenarios_agree_request_for_request(models, seed):
    spt, _ = llama_harness.measure_state_size(models["llama"])
    scenario = llama_harness.gen_slot_scenario(7_000 + seed, 12)
    result = llama_harness.run_slot_scenario(scenario, models["llama"], spt)
    assert result["first"] is None, (scenario["config"], result["first"])
    assert result["agree"] == result["total"]


@pytest.mark.slow
@needs_server
@pytest.mark.parametrize("seed", range(2))
def test_sliding_window_scenarios_agree(models, seed):
    scenario = llama_harness.gen_swa_scenario(8_000 + seed, 6)
    result = llama_harness.run_swa_scenario(scenario, models["gemma3"])
    assert result["first"] is None, (scenario["config"], result["first"])


@pytest.mark.slow
@needs_server
@pytest.mark.parametrize("lesson", [ex10, ex11, ex12], ids=["10", "11", "12"])
def test_the_lessons_real_server_cells_agree(models, lesson):
    lines = lesson.on_real_server()
    assert len(lines) > 1 and not any("differs" in line for line in lines), "\n".join(lines)
    if lesson is ex11:  # the lesson's recorded save: 748 tokens, 778,060 bytes
        assert "n_written 778,060" in lines[2] and "cache_n 748 | 748" in lines[3]


def test_without_the_binary_a_lesson_cell_prints_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_LLAMA_CACHE", str(tmp_path))
    monkeypatch.delenv("KVLAB_LLAMA_SERVER", raising=False)
    assert real_llama.find_server() is None and not real_llama.available("llama")
    for lesson in (ex10, ex11, ex12):
        (line,) = lesson.on_real_server()
        assert line.startswith("no llama-server here") and real_llama.BUILD_COMMAND in line
    with pytest.raises(FileNotFoundError):
        real_llama.run_slots([real_llama.Request((3, 4, 5))])
