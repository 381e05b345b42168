"""kvlab's replays against the real vLLM and SGLang cache code (tools/conformance/).

Runs a short fuzz (a few hundred ops each) when the unpacked wheels are in the
conformance cache folder ($KVLAB_CONFORMANCE_DIR, default ~/.cache/kvlab-conformance);
skips, saying how to fetch them, otherwise. tools/conformance/README.md has the
full fuzz.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "conformance"))
import sglang_harness  # noqa: E402
import vllm_harness  # noqa: E402

from kvlab.cli.replay import replay  # noqa: E402
from kvlab.lessons.ex07 import example_7_scenario  # noqa: E402

needs_vllm = pytest.mark.skipif(
    not vllm_harness.available(),
    reason=f"vLLM {vllm_harness.VERSION} sources are not unpacked in {vllm_harness.source_dir()}: "
    "run `python tools/conformance/vllm_harness.py --fetch` (see tools/conformance/README.md)",
)
needs_sglang = pytest.mark.skipif(
    not sglang_harness.available(),
    reason=f"SGLang {sglang_harness.VERSION} sources are not unpacked in {sglang_harness.source_dir()}: "
    "run `python tools/conformance/sglang_harness.py --fetch` (see tools/conformance/README.md)",
)


@needs_vllm
def test_example_7_with_the_null_block_matches_vllm():
    scenario = example_7_scenario(4, hash_scheme="vllm")
    config = dict(scenario["config"], num_blocks=7, null_block=True)
    ours = replay("prefix-cache", config, scenario["ops"])
    assert ours == vllm_harness.replay(config, scenario["ops"])
    # the lesson's story with every block id one higher: evictions a3, b2, b1 come from blocks 3, 5, 4
    assert ours[5]["evicted"] == [3, 5, 4] and ours[6]["free_queue"] == [6, 2, 1]


@needs_vllm
def test_short_fuzz_against_vllm():
    import fuzz_vllm

    assert fuzz_vllm.run(range(4), 100) == 400


@needs_sglang
def test_example_8_matches_sglang(example_8_scenario):
    config, ops = example_8_scenario["config"], example_8_scenario["ops"]
    assert config == {"page_size": 1}
    ours = replay("radix", config, ops)
    assert ours == sglang_harness.replay(config, ops)
    assert ours[3]["matched_len"] == 9 and ours[5]["evicted"] == [[30, 31]]


@needs_sglang
def test_short_fuzz_against_sglang():
    import fuzz_sglang

    assert fuzz_sglang.run(range(4), 100) == 400


@needs_vllm
def test_the_benchmark_s_vllm_prompt_check_is_vllm_s_own_with_kvlab_s_bound():
    """benchmarks/prefix_cache.py times vLLM's own prompt check: it passes 0..MAX_TOKEN_ID and refuses what lies outside."""
    from kvlab.errors import MAX_TOKEN_ID

    v = vllm_harness.load()
    validate = v.token_id_check(MAX_TOKEN_ID + 1)
    assert validate.func is v.renderers.BaseRenderer.validate_token_ids  # vLLM's function itself
    validate([0, 17, MAX_TOKEN_ID])
    for bad in ([3, -1], [MAX_TOKEN_ID + 1, 2]):
        with pytest.raises(v.exceptions.VLLMValidationError, match="out of vocabulary"):
            validate(bad)
