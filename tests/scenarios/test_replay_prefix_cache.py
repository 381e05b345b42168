"""kvlab.scenarios.prefix_cache and ``python -m kvlab replay prefix-cache``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.errors import ScenarioError
from kvlab.lessons.ex07 import example_7_scenario
from kvlab.scenarios.prefix_cache import replay

ROOT = Path(__file__).resolve().parents[2]


def run_cli(stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvlab", "replay", "prefix-cache"],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def check_example_7(records: list[dict]) -> None:
    assert [r["op"] for r in records] == ["alloc", "free", "alloc", "free", "alloc", "alloc", "free"]
    assert all(r["ok"] for r in records)
    assert [r["free_queue"] for r in records if r["op"] == "free"] == [
        [3, 4, 5, 2, 1, 0],
        [5, 2, 1, 0, 4, 3],
        [5, 1, 0],
    ]
    c, d = records[4], records[5]
    assert c["hit_block_ids"] == [0, 1] and c["new_block_ids"] == [5] and c["block_table"] == [0, 1, 5]
    assert d["new_block_ids"] == [2, 4, 3] and d["evicted"] == [2, 4, 3]  # a3, b2, b1
    assert records[-1]["block_table"] == [0, 1, 5]


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("scheme", ["lesson", "vllm"])
def test_example_7_through_the_api(block_size, scheme):
    scenario = example_7_scenario(block_size, hash_scheme=scheme)
    records = replay(scenario["config"], scenario["ops"])
    check_example_7(records)
    assert records[4]["num_cached_tokens"] == 2 * block_size


def test_example_7_through_the_cli():
    done = run_cli(json.dumps(example_7_scenario(16)))
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    check_example_7(records)
    assert records[4]["num_cached_tokens"] == 32


def test_records_have_every_field_and_probe_allocates_nothing():
    ops = [
        {"op": "alloc", "req": "A", "tokens": list(range(10)), "cache_salt": "t1"},
        {"op": "probe", "tokens": list(range(10)), "cache_salt": "t1"},
        {"op": "probe", "tokens": list(range(10))},
        {"op": "append", "req": "A", "tokens": [10, 11, 12]},
        {"op": "free", "req": "A"},
    ]
    records = replay({"block_size": 4, "num_blocks": 6}, ops)
    fields = ["op", "req", "ok", "num_cached_tokens", "hit_block_ids", "new_block_ids"]
    fields += ["block_table", "evicted", "free_queue"]
    assert all(list(r) == fields for r in records)
    probe, unsalted, append, free = records[1:]
    assert probe["req"] is None and probe["num_cached_tokens"] == 8 and probe["hit_block_ids"] == [0, 1]
    assert probe["free_queue"] == records[0]["free_queue"] == [3, 4, 5]
    assert unsalted["num_cached_tokens"] == 0
    assert append["new_block_ids"] == [3] and append["block_table"] == [0, 1, 2, 3]
    assert free["block_table"] == [0, 1, 2, 3] and free["free_queue"] == [3, 4, 5, 2, 1, 0]


def test_vllm_numbering_with_the_null_block():
    common = [i for i in range(3) for _ in range(16)]
    ops = [
        {"op": "alloc", "req": "0", "tokens": common + [3] * 7},
        {"op": "alloc", "req": "1", "tokens": common + [3] * 5},
        {"op": "free", "req": "0"},
        {"op": "free", "req": "1"},
    ]
    records = replay({"block_size": 16, "num_blocks": 11, "null_block": True, "hash": "vllm"}, ops)
    assert records[0]["block_table"] == [1, 2, 3, 4]
    assert records[1]["hit_block_ids"] == [1, 2, 3] and records[1]["new_block_ids"] == [5]
    assert records[3]["free_queue"] == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]


def test_refused_ops_are_not_errors_and_change_nothing():
    ops = [
        {"op": "alloc", "req": "A", "tokens": list(range(8))},
        {"op": "free", "req": "A"},
        {"op": "alloc", "req": "B", "tokens": list(range(16))},  # 2 free hits + 2 new > 3 free
        {"op": "alloc", "req": "C", "tokens": list(range(12))},
        {"op": "append", "req": "C", "tokens": [1, 2]},
    ]
    records = replay({"block_size": 4, "num_blocks": 3}, ops)
    refused = records[2]
    assert refused["ok"] is False
    assert refused["hit_block_ids"] == [0, 1] and refused["num_cached_tokens"] == 8  # what the lookup found
    assert refused["new_block_ids"] == [] and refused["block_table"] == [] and refused["evicted"] == []
    assert refused["free_queue"] == records[1]["free_queue"] == [2, 1, 0]
    assert records[3]["ok"] and records[3]["block_table"] == [0, 1, 2]
    assert records[4]["ok"] is False and records[4]["block_table"] == [0, 1, 2]
    with pytest.raises(ScenarioError, match="unknown request 'B'"):
        replay({"block_size": 4, "num_blocks": 3}, ops[:3] + [{"op": "free", "req": "B"}])


def test_a_freed_id_can_be_allocated_again():
    ops = [
        {"op": "alloc", "req": "A", "tokens": [1]},
        {"op": "free", "req": "A"},
        {"op": "alloc", "req": "A", "tokens": [2]},
        {"op": "free", "req": "A"},
    ]
    assert [r["ok"] for r in replay({"block_size": 4, "num_blocks": 2}, ops)] == [True] * 4


GOOD = {"block_size": 4, "num_blocks": 4}
ALLOC_A = {"op": "alloc", "req": "A", "tokens": [1, 2, 3]}
BAD_SCENARIOS = {
    "unknown config key": (
        {"block_size": 4, "num_blocks": 4, "watermark": 0.1},
        [],
        None,
        "unknown config key",
    ),
    "no block_size": ({"num_blocks": 4}, [], None, "block_size"),
    "block_size 0": ({"block_size": 0, "num_blocks": 4}, [], None, "block_size"),
    "pool 0": ({"block_size": 4, "num_blocks": 0}, [], None, "num_blocks"),
    "pool as text": ({"block_size": 4, "num_blocks": "4"}, [], None, "num_blocks"),
    "null_block not bool": ({"block_size": 4, "num_blocks": 4, "null_block": 1}, [], None, "null_block"),
    "unknown hash": ({"block_size": 4, "num_blocks": 4, "hash": "md5"}, [], None, "hash"),
    "pool too large": ({"block_size": 4, "num_blocks": 10**9}, [], None, "too large"),
    "op name not a string": (GOOD, [{"op": ["alloc"], "req": "A"}], 0, "unknown op"),
    "op not an object": (GOOD, [ALLOC_A, ["alloc"]], 1, "object"),
    "unknown op": (GOOD, [ALLOC_A, {"op": "evict"}], 1, "unknown op"),
    "missing tokens": (GOOD, [{"op": "alloc", "req": "A"}], 0, "tokens"),
    "extra field": (GOOD, [{"op": "free", "req": "A", "tokens": [1]}, ALLOC_A], 0, "does not take"),
    "req not a string": (GOOD, [{"op": "alloc", "req": 1, "tokens": [1]}], 0, "req"),
    "duplicate req": (GOOD, [ALLOC_A, ALLOC_A], 1, "already allocated"),
    "unknown req append": (
        GOOD,
        [ALLOC_A, {"op": "append", "req": "B", "tokens": [1]}],
        1,
        "unknown request",
    ),
    "unknown req free": (GOOD, [{"op": "free", "req": "B"}], 0, "unknown request"),
    "double free": (
        GOOD,
        [ALLOC_A, {"op": "free", "req": "A"}, {"op": "free", "req": "A"}],
        2,
        "double free",
    ),
    "append after free": (
        GOOD,
        [ALLOC_A, {"op": "free", "req": "A"}, {"op": "append", "req": "A", "tokens": [1]}],
        2,
        "already freed",
    ),
    "float token": (GOOD, [{"op": "alloc", "req": "A", "tokens": [1, 2.5]}], 0, r"tokens\[1\]"),
    "bool token": (GOOD, [{"op": "probe", "tokens": [True]}], 0, r"tokens\[0\]"),
    "negative token": (GOOD, [{"op": "alloc", "req": "A", "tokens": [-1]}], 0, r"tokens\[0\]"),
    "tokens not a list": (GOOD, [{"op": "alloc", "req": "A", "tokens": "abc"}], 0, "list"),
    "empty prompt": (GOOD, [{"op": "alloc", "req": "A", "tokens": []}], 0, "empty"),
    "empty append": (GOOD, [ALLOC_A, {"op": "append", "req": "A", "tokens": []}], 1, "empty"),
    "empty salt": (GOOD, [{"op": "alloc", "req": "A", "tokens": [1], "cache_salt": ""}], 0, "cache_salt"),
}


@pytest.mark.parametrize("case", list(BAD_SCENARIOS))
def test_bad_scenarios_through_the_api(case):
    config, ops, index, message = BAD_SCENARIOS[case]
    with pytest.raises(ScenarioError, match=message) as info:
        replay(config, ops)
    assert info.value.index == index


def test_bad_scenarios_through_the_cli():
    """Every bad scenario, plus malformed JSON: exit status 2, one line on stderr, no traceback, no output."""
    cases = [json.dumps({"config": c, "ops": o}) for c, o, _, _ in BAD_SCENARIOS.values()]
    cases += ['{"config": {"block_size": 4, "num_blocks": 4}, "ops": [', "[]"]
    # one interpreter per case would cost seconds; a small driver runs the real CLI entry point per case
    driver = (
        "import io, json, sys\n"
        "from kvlab.__main__ import main\n"
        "out = []\n"
        "for text in json.load(sys.stdin):\n"
        "    sys.stdin, sys.stdout, sys.stderr = io.StringIO(text), io.StringIO(), io.StringIO()\n"
        "    code = main(['replay', 'prefix-cache'])\n"
        "    out.append([code, sys.stdout.getvalue(), sys.stderr.getvalue()])\n"
        "sys.__stdout__.write(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", driver], input=json.dumps(cases), capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    expected_index = [index for _, _, index, _ in BAD_SCENARIOS.values()] + [None, None]
    for (code, out, err), index in zip(results, expected_index, strict=True):
        assert code == 2 and out == ""
        assert err.startswith("kvlab replay: ") and err.count("\n") == 1 and "Traceback" not in err
        if index is not None:
            assert f"op {index}: " in err


@pytest.mark.parametrize("case", ["double free", "float token", "unknown config key"])
def test_bad_scenario_in_a_fresh_interpreter(case):
    config, ops, index, _ = BAD_SCENARIOS[case]
    done = run_cli(json.dumps({"config": config, "ops": ops}))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert index is None or f"op {index}:" in done.stderr


def test_a_one_block_pool_with_the_null_block_refuses_every_allocation_like_vllm() -> None:
    """vLLM's BlockPool(num_gpu_blocks=1) pops block 0 as the null block and then refuses every
    allocation (allocate_slots returns None); the scenario itself is valid."""
    ops = [
        {"op": "alloc", "req": "A", "tokens": [1, 2, 3]},
        {"op": "probe", "tokens": [1, 2, 3, 4, 5]},
    ]
    records = replay({"block_size": 4, "num_blocks": 1, "null_block": True}, ops)
    assert records[0]["ok"] is False and records[0]["new_block_ids"] == [] and records[0]["free_queue"] == []
    assert records[1]["num_cached_tokens"] == 0
