"""``python -m kvlab fleet``: the lesson's table as printed, --json, one-row scenarios, bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvlab.cli.fleet import main
from kvlab.fleet import FleetConfig, simulate

LESSON_TABLE = """\
scenario                                        cache  hit rate  prefill tokens
no cache                                       0.0GiB      0.0% 2,581,118 of 2.6M
shared system prompt, stable prefix           39.1GiB     92.8%   187,102 of 2.6M
same, cache 4x smaller                         9.8GiB     67.8%   831,582 of 2.6M
same, cache too small for the sessions         2.0GiB     58.0% 1,083,470 of 2.6M
timestamp placed before the system prompt     39.1GiB      0.0% 2,583,518 of 2.6M
per-user salt (no cross-user sharing)         39.1GiB     56.5% 1,123,214 of 2.6M
"""

SMALL_ARGS = ["--users", "12", "--turns", "4", "--system-tokens", "160", "--capacity-blocks", "600"]
SMALL = FleetConfig(users=12, turns=4, system_tokens=160, capacity_blocks=600)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_prints_the_lessons_table(capsys):
    assert run(capsys) == (0, LESSON_TABLE, "")


def test_json_rows(capsys):
    code, out, _ = run(capsys, "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 6
    assert all(
        set(r) == {"scenario", "capacity_blocks", "hit_rate", "prefill_tokens", "total_tokens"} for r in rows
    )
    assert [r["capacity_blocks"] for r in rows] == [0, 20_000, 5_000, 1_000, 20_000, 20_000]
    assert [r["prefill_tokens"] for r in rows] == [
        2_581_118,
        187_102,
        831_582,
        1_083_470,
        2_583_518,
        1_123_214,
    ]
    assert [round(100 * r["hit_rate"], 1) for r in rows] == [0.0, 92.8, 67.8, 58.0, 0.0, 56.5]
    assert rows[4]["total_tokens"] == 2_583_518


def test_a_scenario_option_prints_one_row(capsys):
    code, out, _ = run(capsys, *SMALL_ARGS, "--json")
    (row,) = json.loads(out)
    assert code == 0 and row == simulate(SMALL).row()
    code, out, _ = run(capsys, *SMALL_ARGS)
    header, line = out.splitlines()
    assert header.startswith("scenario") and line.startswith("cache 600 blocks, users 12, turns 4")
    assert line.endswith(f"{simulate(SMALL).prefill_tokens:,} of {simulate(SMALL).total_tokens / 1e3:.1f}k")


@pytest.mark.parametrize(
    ("extra", "config"),
    [
        (["--header", "before-message"], {"header": "before-message"}),
        (["--salt", "tenant", "--tenants", "3"], {"salt": "tenant", "tenants": 3}),
        (["--replicas", "3", "--routing", "user-hash"], {"replicas": 3, "routing": "user-hash"}),
        (["--replicas", "3"], {"replicas": 3}),
        (["--seed", "-4", "--block-size", "8"], {"seed": -4, "block_size": 8}),
    ],
)
def test_options_reach_the_model(capsys, extra, config):
    code, out, _ = run(capsys, *SMALL_ARGS, *extra, "--json")
    expected = FleetConfig(**{**SMALL.__dict__, **config})
    assert code == 0 and json.loads(out) == [simulate(expected).row()]


def test_engine_options(capsys):
    code, out, _ = run(capsys, *SMALL_ARGS, "--engine", "--busy-blocks", "400", "--concurrent", "2", "--json")
    assert code == 0 and json.loads(out) == [
        simulate(SMALL, engine=True, concurrent=2, busy_blocks=400).row()
    ]
    code, out, _ = run(capsys, *SMALL_ARGS, "--engine")
    assert code == 0 and out.splitlines()[-1].startswith(
        "engine model (kvlab.models.prefix_cache): 1 chat request"
    )
    code, out, _ = run(capsys, *SMALL_ARGS, "--hash", "sha256-repr", "--json")
    assert json.loads(out) == [simulate(SMALL).row()]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--users", "-5"], "argument --users: must be at least 1, got -5"),
        (["--users", "x"], "argument --users: must be an integer"),
        (["--replicas", "0"], "argument --replicas: must be at least 1, got 0"),
        (["--capacity-blocks", "-1"], "argument --capacity-blocks: must be at least 0"),
        (["--tenants", "10"], "--tenants only applies with --salt tenant"),
        (["--salt", "tenant"], "--salt tenant needs --tenants K"),
        (["--salt", "tenant", "--tenants", "201"], "tenants (201) cannot exceed users (200)"),
        (["--routing", "user-hash"], "--routing only applies with --replicas"),
        (["--concurrent", "4"], "--concurrent only applies with --engine"),
        (["--busy-blocks", "4"], "--busy-blocks only applies with --engine"),
        (["--header", "middle"], "invalid choice: 'middle'"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--engine", "--capacity-blocks", "100"], "give capacity_blocks of at least"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvlab fleet: error: ") and message in err
    assert "Traceback" not in err


def test_help(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "--routing" in out and "--engine" in out


def test_dispatch_through_python_m_kvlab():
    done = subprocess.run(
        [sys.executable, "-m", "kvlab", "fleet", *SMALL_ARGS, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [simulate(SMALL).row()]
    bad = subprocess.run(
        [sys.executable, "-m", "kvlab", "fleet", "--replicas", "0"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


HUGE = "9" * 5000  # more digits than Python converts by default


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--system-tokens", str(10**12)], "LIMITS.tokens"),
        (["--users", str(10**9)], "LIMITS.users"),
        (["--turns", str(10**9)], "LIMITS.turns"),
        (["--replicas", str(10**9)], "LIMITS.replicas"),
        (["--users", "100000"], "LIMITS.total_tokens"),
        (["--users", "2000", "--turns", "30"], "LIMITS.total_tokens"),
        (["--block-size", str(10**9)], "LIMITS.block_size"),
        (["--capacity-blocks", str(10**15)], "LIMITS.total_tokens"),
        (["--engine", "--capacity-blocks", str(10**8)], "LIMITS.num_blocks"),
        (["--engine", "--concurrent", str(10**15)], "LIMITS.slots"),
        (["--engine", "--busy-blocks", str(10**15)], "LIMITS.num_blocks"),
        (["--salt", "tenant", "--tenants", str(10**15)], "LIMITS.users"),
        (["--users", HUGE], "at most 20 digits"),
        (["--seed", "-" + HUGE], "at most 20 digits"),
        (["--seed", str(10**19)], "seed must be at most"),
    ],
)
def test_absurd_options_exit_2_at_once_with_one_line(capsys, argv, message):
    import time

    start = time.perf_counter()
    code, out, err = run(capsys, *argv)
    assert time.perf_counter() - start < 1.0, "an absurd option must be refused before any traffic is drawn"
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvlab fleet: error: ") and message in err
    assert len(err) < 400 and "Traceback" not in err
