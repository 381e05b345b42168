"""Notebook 15's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import random

import pytest

import kvlab.exercises as ex
from kvlab.exercises.core import reveal
from kvlab.fleet import FleetConfig, chat_traffic, simulate


@pytest.fixture(scope="module")
def percent():
    traffic = chat_traffic()

    def run(**options) -> float:
        return 100 * simulate(FleetConfig(**options), traffic=traffic).hit_rate

    return run


def test_notebook_15_has_four_exercises():
    assert [e.id for e in ex.exercises("15")] == ["15.1", "15.2", "15.3", "15.4"]


def test_the_timestamp_prediction_takes_any_percentage_before_the_reveal(percent):
    assert ex.get("15.1").kind == "prediction"
    assert ex.check("15.1", 40).right  # a wrong guess earns the points: it was made before the reveal
    assert "not a percentage" in ex.check("15.1", 140).message
    assert "expects a number" in ex.check("15.1", float("nan")).message
    assert ex.check("15.1", ...).status == ex.NOT_DONE  # the cell as it is now: no prediction any more
    shown = reveal("15.1", percent(header="before-message"))
    assert shown.on_mark is None and shown.prediction is None and "No prediction was recorded" in shown.text()
    late = ex.check("15.1", 92)
    assert late.status == ex.NOT_YET and "already on screen" in late.message


def test_the_salt_split(percent):
    feedback_ok = ex.check("15.2", [10_800, 13_872])
    assert feedback_ok.right and "9 extra computations" in feedback_ok.message
    assert (
        "Without a salt the system prompt is computed once too" in ex.check("15.2", [12_000, 12_672]).message
    )
    assert "Swapped" in ex.check("15.2", [13_872, 10_800]).message
    assert "Both causes" in ex.check("15.2", [0, 24_672]).message
    assert "add up to 24,000" in ex.check("15.2", [10_800, 13_200]).message
    assert "How many extra times" in ex.check("15.2", [11_000, 13_672]).message
    assert "two whole numbers" in ex.check("15.2", [10_800.5, 13_871.5]).message


def _by_rule(users, replicas):
    last, out = {}, []
    for i, user in enumerate(users):
        out.append(last.get(user) == i % replicas)
        last[user] = i % replicas
    return out


def test_round_robin_history_rule():
    result = ex.check("15.3", _by_rule)
    assert result.right and "of the later turns reach the replica" in result.message
    message = ex.check("15.3", lambda users, replicas: [False] * len(users)).message
    assert "should be True" in message
    message = ex.check("15.3", lambda users, replicas: [u % replicas == 0 for u in users]).message
    assert "should be" in message
    assert (
        "one True or False per request" in ex.check("15.3", lambda users, replicas: [0] * len(users)).message
    )
    hidden = ex.get("15.3").draw_cases(random.Random(4))
    shown = ex.get("15.3").draw_cases(None)
    assert hidden[: len(shown)] == shown and len(hidden) > len(shown)
    table = {repr(c): _by_rule(*c) for c in shown}
    memorised = lambda users, replicas: table.get(repr((users, replicas)), [True] * len(users))  # noqa: E731
    assert ex.check("15.3", memorised).right
    assert ex.evaluate(ex.get("15.3"), memorised, hidden).status == ex.NOT_YET


def test_same_prompt_twice():
    assert ex.check("15.4", [1984, 16]).right
    assert ex.check("15.4", (1984, 16)).right
    assert "at least one position" in ex.check("15.4", [2000, 0]).message
    assert "whole blocks" in ex.check("15.4", [1999, 1]).message
    assert "Swapped" in ex.check("15.4", [16, 1984]).message
    assert "add up to" in ex.check("15.4", [1984, 15]).message
    assert "two whole numbers" in ex.check("15.4", [1984.0, 16]).message
    assert "not what the prefix cache reports" in ex.check("15.4", [1968, 32]).message


def test_every_percentage_notebook_15_states_is_printed_by_its_cells():
    """The prose's hit rates come from the runs the notebook prints, through kvlab.lessons.fleet's lines."""
    import re
    from pathlib import Path

    import nbformat

    from kvlab.fleet import simulate_many
    from kvlab.lessons import fleet as lf

    nb = nbformat.read(Path(__file__).resolve().parents[2] / "notebooks" / "15_fleet_prefix_caching.ipynb", 4)
    stated = set()
    for cell in nb.cells:
        if cell.cell_type == "markdown" and not cell.source.startswith(
            ("## Check yourself", "#### The same probe")
        ):
            stated |= set(re.findall(r"\d+\.\d%", cell.source))
    traffic, small = chat_traffic(), chat_traffic(users=50)
    table = lf.lesson_table()
    stable, quarter, tiny, top, per_user = table[1:]
    unlimited = simulate(FleetConfig(capacity_blocks=10**7), traffic=traffic)
    ceiling = max(simulate(FleetConfig(users=50, capacity_blocks=10**7), traffic=small).trace.cached_blocks)
    sizes = [50, 100, 250, 500, 1000, 2000, 3000, 4000, 5000, ceiling]
    sweep = simulate_many([FleetConfig(users=50, capacity_blocks=c) for c in sizes], traffic=small)
    routed = simulate_many(
        [FleetConfig(users=50, capacity_blocks=c, replicas=r, routing=g)
         for c, r, g in ((5000, 1, "round-robin"), (5000, 2, "round-robin"), (5000, 2, "user-hash"),
                         (10000, 2, "round-robin"), (10000, 2, "user-hash"))],
        traffic=small,
    )  # fmt: skip
    lesson_try_it = simulate_many(  # the lesson's Try it 3: 200 users over 4 replicas
        [FleetConfig(replicas=4, routing="round-robin"), FleetConfig(replicas=4, routing="user-hash")],
        traffic=traffic,
    )
    store = simulate_many([FleetConfig(users=50, capacity_blocks=c) for c in (5000, 1250)], traffic=small)
    engine = [simulate(FleetConfig(users=50, capacity_blocks=5000), engine=True, busy_blocks=b, traffic=small)
              for b in (0, 3750)]  # fmt: skip
    engine_quarter = simulate(FleetConfig(capacity_blocks=5000), engine=True, traffic=traffic)
    printed = "\n".join(
        [lf.format_table(table)]
        + lf.turn_lines([stable, quarter, tiny, per_user])
        + lf.working_set_lines(unlimited, stable)
        + lf.sweep_lines(sweep)
        + lf.salt_lines(stable, per_user)
        + lf.routing_lines(routed + lesson_try_it)
        + lf.rate_lines({"a": store[0], "b": store[1], "c": engine[0], "d": engine[1], "e": engine_quarter})
        + lf.rate_lines(
            {"top": top, "before": simulate(FleetConfig(header="before-message"), traffic=traffic)}
        )
    )
    assert stated, "no percentages found in the prose"
    missing = sorted(p for p in stated if p not in printed)
    assert not missing, f"notebook 15 states {missing} but no cell prints them"


def test_the_probe_figure_draws_the_quartiles_the_printed_lines_give():
    """Notebook 15's probe figure: a guess's bar is its IQR from kvlab.core.timing, not its min-max."""
    from types import SimpleNamespace as Record

    from kvlab.core.timing import Timing
    from kvlab.views.probe import probe_timing_figure

    times = (1.0, 2.0, 10.0)  # three repeats, as the notebook times each guess
    spread = Timing(times, times)
    guess = Record(
        name="dana", ttft=Record(wall_ms=times), is_secret=True, classified_hit=True, threshold_ms=4.0
    )
    calibration = Record(hit=Record(wall_ms=(1.0, 2.0)), miss=Record(wall_ms=(20.0, 30.0)))
    run = Record(calibration=calibration, guesses=(guess,), salted=False)
    bars = probe_timing_figure({"shared cache": run}).data[2]
    assert bars.name == "a guess (median, IQR)"
    assert bars.x[0] == pytest.approx(spread.median_ms)
    assert bars.x[0] - bars.error_x.arrayminus[0] == pytest.approx(spread.q1_ms)
    assert bars.x[0] + bars.error_x.array[0] == pytest.approx(spread.q3_ms)
    assert spread.q1_ms > min(times) and spread.q3_ms < max(times)  # not the extremes


def test_the_recorded_fleet_run_names_each_live_row_and_gives_no_rate():
    """Notebook 15's recorded table: three live rows, each naming its policy and router; no req/s column."""
    from kvlab.lessons.fleet_live import format_comparison, recorded_comparison

    table = format_comparison(recorded_comparison())
    live = [line for line in table.splitlines() if line.startswith("live ")]
    assert [line[len("live") :].strip().split("  ")[0] for line in live] == [
        "round_robin on sglang-router 0.3.2",
        "cache_aware on sglang-router 0.3.2",
        "cache_aware on kvlab's router",
    ]
    assert "req/s" not in table and "three live rows" in table
