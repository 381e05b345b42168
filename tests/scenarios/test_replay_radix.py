"""kvlab.scenarios.radix and ``python -m kvlab replay radix``: records, example 8, handles, bad scenarios."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.errors import ScenarioError
from kvlab.scenarios.radix import replay

ROOT = Path(__file__).resolve().parents[2]


def node(key, lock_ref=0, *children, **extra):
    return {"key": key, "lock_ref": lock_ref, **extra, "children": list(children)}


def run_cli(stdin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvlab", "replay", "radix", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def check_example_8(records):
    assert [r["op"] for r in records] == ["insert", "insert", "insert", "match", "lock", "evict"]
    assert [r["prefix_len"] for r in records[:3]] == [0, 6, 8]
    assert records[2]["tree"] == node(
        [], 1, node([1, 2, 3, 4, 5, 6], 0, node([10, 11], 0, node([30, 31])), node([20, 21, 22]))
    )
    assert records[3]["matched_len"] == 9
    assert (records[4]["evictable_size"], records[4]["protected_size"]) == (4, 9)
    last = records[5]
    assert last == {
        "op": "evict",
        "evicted_tokens": 2,
        "evicted": [[30, 31]],
        "evictable_size": 2,
        "protected_size": 9,
        "tree": node([], 1, node([1, 2, 3, 4, 5, 6], 1, node([10, 11]), node([20, 21, 22], 1))),
    }


def test_example_8_through_the_api(example_8_scenario):
    check_example_8(replay(example_8_scenario["config"], example_8_scenario["ops"]))


def test_example_8_through_the_cli(tmp_path, example_8_scenario):
    done = run_cli(json.dumps(example_8_scenario))
    assert done.returncode == 0, done.stderr
    check_example_8(json.loads(done.stdout))
    path = tmp_path / "ex8.json"
    path.write_text(json.dumps(example_8_scenario))
    from_file = run_cli("", str(path))
    assert from_file.returncode == 0 and json.loads(from_file.stdout) == json.loads(done.stdout)


def test_record_fields_per_op():
    records = replay(
        {},
        [
            {"op": "insert", "tokens": [1, 2]},
            {"op": "match", "tokens": [1, 2]},
            {"op": "match", "tokens": [1, 2], "as": "a"},
            {"op": "lock", "node": "a"},
            {"op": "unlock", "node": "a"},
            {"op": "evict", "num_tokens": 0},
        ],
    )
    tail = ["evictable_size", "protected_size", "tree"]
    assert [list(r) for r in records] == [
        ["op", "prefix_len", *tail],
        ["op", "matched_len", *tail],
        ["op", "matched_len", *tail],
        ["op", *tail],
        ["op", *tail],
        ["op", "evicted_tokens", "evicted", *tail],
    ]
    assert records[-1]["evicted"] == [] and records[-1]["evicted_tokens"] == 0


def test_split_handles_page_size_and_extra_key():
    records = replay(
        {"page_size": 2},
        [
            {"op": "insert", "tokens": [1, 2, 3, 4, 5]},
            {"op": "match", "tokens": [1, 2, 3, 4], "as": "whole"},
            {"op": "lock", "node": "whole"},
            {
                "op": "match",
                "tokens": [1, 2, 7, 7],
                "as": "head",
            },  # splits the locked node at the page boundary
            {"op": "insert", "tokens": [1, 2, 3, 4], "extra_key": "lora-1"},
            {"op": "unlock", "node": "whole"},  # the handle is the lower half now; unlocks the whole path
            {"op": "evict", "num_tokens": 1},
        ],
    )
    assert records[0]["prefix_len"] == 0 and records[0]["tree"]["children"] == [node([1, 2, 3, 4])]
    assert records[3]["matched_len"] == 2
    assert records[3]["tree"]["children"] == [node([1, 2], 1, node([3, 4], 1))]
    assert records[4]["prefix_len"] == 0
    assert records[4]["tree"]["children"][1] == node([1, 2, 3, 4], 0, extra_key="lora-1")
    assert (records[5]["evictable_size"], records[5]["protected_size"]) == (8, 0)
    assert records[6]["evicted"] == [[3, 4]]  # stamped by the splitting match, older than the lora-1 leaf


def test_root_handle_and_rebinding():
    records = replay(
        {},
        [
            {"op": "insert", "tokens": [1, 2]},
            {"op": "match", "tokens": [9], "as": "h"},  # matches nothing: the root
            {"op": "lock", "node": "h"},
            {"op": "match", "tokens": [1, 2], "as": "h"},
            {"op": "lock", "node": "h"},
        ],
    )
    assert records[2]["protected_size"] == 0 and records[2]["tree"]["lock_ref"] == 1
    assert records[4]["protected_size"] == 2


def test_unbalanced_unlocks_follow_sglang_below_zero():
    # Regression (tools/conformance/fuzz_sglang.py): every record below was written by hand from
    # SGLang 0.5.23's real RadixCache (tools/conformance/sglang_harness.py) on this scenario.
    # "mid" is locked only through "deep"'s path, so the two unlocks take [1, 2] to -1. The first
    # evict stops after [3, 4] (2 of 3 tokens): a parent left childless is pushed within the call
    # only at count 0; at -1 it is an evictable leaf from the next call on.
    ops = [
        {"op": "insert", "tokens": [1, 2, 3, 4]},
        {"op": "match", "tokens": [1, 2, 3, 4], "as": "deep"},
        {"op": "match", "tokens": [1, 2], "as": "mid"},
        {"op": "lock", "node": "deep"},
        {"op": "unlock", "node": "mid"},
        {"op": "unlock", "node": "deep"},
        {"op": "evict", "num_tokens": 3},
        {"op": "evict", "num_tokens": 1},
    ]
    records = replay({}, ops)
    sizes = [(r["evictable_size"], r["protected_size"]) for r in records]
    assert sizes == [(4, 0), (4, 0), (4, 0), (0, 4), (2, 2), (4, 0), (2, 0), (0, 0)]
    assert records[4]["tree"] == node([], 1, node([1, 2], 0, node([3, 4], 1)))
    assert records[5]["tree"] == node([], 1, node([1, 2], -1, node([3, 4], 0)))
    assert records[6] == {
        "op": "evict",
        "evicted_tokens": 2,
        "evicted": [[3, 4]],
        "evictable_size": 2,
        "protected_size": 0,
        "tree": node([], 1, node([1, 2], -1)),
    }
    assert records[7] == {
        "op": "evict",
        "evicted_tokens": 2,
        "evicted": [[1, 2]],
        "evictable_size": 0,
        "protected_size": 0,
        "tree": node([], 1),
    }
    with pytest.raises(ScenarioError, match="not locked") as info:
        replay({}, ops[:6] + [{"op": "unlock", "node": "mid"}])  # at -1 it is not locked
    assert info.value.index == 6


BAD = [
    # (scenario, op index in the message or None, words the message must contain)
    ('{"ops": [', None, "not valid JSON"),
    ('{"config": {"page_size": 0}, "ops": []}', None, "page_size"),
    ('{"config": {"page_size": "2"}, "ops": []}', None, "page_size"),
    ('{"config": {"block_size": 2}, "ops": []}', None, "block_size"),
    ('{"ops": [{"op": "insert", "tokens": [1]}, {"op": "delete"}]}', 1, "unknown op"),
    ('{"ops": ["insert"]}', 0, "JSON object"),
    ('{"ops": [{"op": "insert", "tokens": "123"}]}', 0, "tokens"),
    ('{"ops": [{"op": "insert", "tokens": [1, 2.5]}]}', 0, "tokens[1]"),
    ('{"ops": [{"op": "insert", "tokens": [true]}]}', 0, "tokens[0]"),
    ('{"ops": [{"op": "match", "tokens": []}]}', 0, "empty"),
    ('{"ops": [{"op": "insert"}]}', 0, "'tokens'"),
    ('{"ops": [{"op": "insert", "tokens": [1], "token": [2]}]}', 0, "unknown field"),
    ('{"ops": [{"op": "insert", "tokens": [1], "extra_key": 5}]}', 0, "extra_key"),
    ('{"ops": [{"op": "match", "tokens": [1], "as": 3}]}', 0, "'as'"),
    ('{"ops": [{"op": "lock", "node": "nobody"}]}', 0, "no node named 'nobody'"),
    (
        '{"ops": [{"op": "insert", "tokens": [1]}, {"op": "match", "tokens": [1], "as": "a"},'
        ' {"op": "unlock", "node": "a"}]}',
        2,
        "not locked",
    ),
    (
        '{"ops": [{"op": "insert", "tokens": [1]}, {"op": "match", "tokens": [1], "as": "a"},'
        ' {"op": "evict", "num_tokens": 5}, {"op": "lock", "node": "a"}]}',
        3,
        "evicted",
    ),
    ('{"ops": [{"op": "evict", "num_tokens": -1}]}', 0, "at least 0"),
    ('{"ops": [{"op": "evict", "num_tokens": 1.5}]}', 0, "integer"),
]


@pytest.mark.parametrize("text, index, words", BAD[1:])
def test_bad_scenarios_through_the_api(text, index, words):
    data = json.loads(text)
    with pytest.raises(ScenarioError) as info:
        replay(data.get("config", {}), data["ops"])
    assert info.value.index == index and words in str(info.value)


def check_one_line_error(code: int, out: str, err: str, index: int | None, words: str) -> None:
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("kvlab replay: ") and words in lines[0]
    if index is not None:
        assert f"op {index}:" in lines[0]


@pytest.mark.parametrize("text, index, words", BAD)
def test_bad_scenarios_through_the_cli_entry_point(text, index, words, monkeypatch, capsys):
    """The CLI's own main(), in process (fast); the subprocess test below covers the real command."""
    from kvlab.__main__ import main

    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    code = main(["replay", "radix"])
    captured = capsys.readouterr()
    check_one_line_error(code, captured.out, captured.err, index, words)


@pytest.mark.parametrize("text, index, words", [BAD[0], BAD[-5], BAD[-3]])
def test_bad_scenarios_through_the_cli(text, index, words):
    done = run_cli(text)
    check_one_line_error(done.returncode, done.stdout, done.stderr, index, words)
