import json
import subprocess
import sys

import pytest

from kvlab.cli.chat import main

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")


def run_json(capsys, *args):
    assert main(["--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_slot_mode_follows_llama_servers_rule(capsys):
    turns = run_json(capsys, "--turns", "4", "--max-tokens", "8")
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]
    assert set(turns[0]) == {"turn", "prompt_tokens", "cache_n", "prompt_n", "ttft_ms", "text"}
    assert turns[0]["prompt_tokens"] == 34 and turns[0]["cache_n"] == 0
    for prev, t in zip(turns, turns[1:], strict=False):
        assert t["cache_n"] == prev["prompt_tokens"] + 8 - 1
        assert t["prompt_n"] == t["prompt_tokens"] - t["cache_n"]
    assert all(len(t["text"].split()) == 8 and t["ttft_ms"] > 0 for t in turns)


def test_blocks_mode_reuses_whole_blocks_capped_below_the_prompt(capsys):
    turns = run_json(capsys, "--cache", "blocks", "--block-size", "16", "--turns", "3", "--max-tokens", "5")
    assert turns[0]["cache_n"] == 0
    for prev, t in zip(turns, turns[1:], strict=False):
        assert t["cache_n"] % 16 == 0 and t["cache_n"] <= t["prompt_tokens"] - 1
        assert t["cache_n"] == (prev["prompt_tokens"] + 5 - 1) // 16 * 16


def test_a_clock_in_the_system_prompt_collapses_reuse(capsys):
    slot = run_json(capsys, "--clock", "--turns", "3")
    assert [t["cache_n"] for t in slot] == [
        0,
        10,
        10,
    ]  # the lesson's run: "Time: 10:0" then the minute changes
    blocks = run_json(capsys, "--clock", "--turns", "3", "--cache", "blocks")
    assert [t["cache_n"] for t in blocks] == [0, 0, 0]
    off = run_json(capsys, "--turns", "2", "--cache", "off")
    assert [t["cache_n"] for t in off] == [0, 0]


def test_a_long_system_prompt_is_reused(capsys):
    turns = run_json(capsys, "--system-tokens", "300", "--turns", "2", "--max-tokens", "2")
    assert turns[0]["prompt_tokens"] > 300 and turns[0]["prompt_n"] == turns[0]["prompt_tokens"]
    assert turns[1]["prompt_n"] < 40  # timings are in the benchmark; here only the counters


def test_the_table_output(capsys):
    assert main(["--turns", "2", "--max-tokens", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cache=slot block_size=16 max_tokens=3")
    assert out[1].startswith("turn 1: prompt_tokens    34  cache_n     0  prompt_n    34  ttft_ms")
    assert "cache_n    36" in out[2]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--turns", "0"], "--turns: must be at least 1"),
        (["--max-tokens", "x"], "--max-tokens: expected a whole number"),
        (["--cache", "radix"], "invalid choice"),
        (["--block-size", "-4"], "--block-size: must be at least 1"),
        (["--block-size", "9999"], "--block-size: 9999 is too large"),
        (["--system-tokens", "-1"], "--system-tokens: must be 0 or more"),
        (["--system-tokens", "99999"], "at most 16000"),
        (["--threads", "0"], "--threads: must be at least 1"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_options_exit_2_with_one_clear_line(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_bad_options_through_python_dash_m():
    done = subprocess.run(
        [sys.executable, "-m", "kvlab", "chat", "--turns", "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith("kvlab chat: argument --turns") and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--turns", str(10**9)], "--turns: at most 1000"),
        (["--max-tokens", str(10**12)], "--max-tokens: at most 4096"),
        (["--threads", str(10**6)], "--threads: at most 1024"),
        (["--block-size", str(10**15)], "too large"),
        (["--system-tokens", str(10**12)], "at most 16000"),
        (["--turns", "9" * 5000], "at most 20 digits"),
        (["--max-tokens", "4.0"], "expected a whole number"),
    ],
)
def test_absurd_options_exit_2_at_once_with_one_line(capsys, args, message):
    import time

    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert time.perf_counter() - start < 1.0
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and len(err) < 300 and "Traceback" not in err
