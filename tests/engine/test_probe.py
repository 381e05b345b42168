"""The timing side channel's logic (kvlab.engine.probe) and its figure (kvlab.views.probe).

What is tested is what the verdicts rest on, never how long a request takes: the threshold and
verdict rules on given samples, the counters of every request the prober sends (the right guess
reuses the victim's blocks only without a salt; a guess sent twice is a miss both times, since
the cache is restored before each request), and that a restored cache still gives exact results.
How often the verdicts are right on a loaded machine is measured by benchmarks/probe.py.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from hostile import hostile_values, kvlab_or_ok  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvlab.core.timing import Timing  # noqa: E402
from kvlab.engine import Engine  # noqa: E402
from kvlab.engine.probe import (  # noqa: E402
    KNOWN_HIT,
    KNOWN_MISS,
    Calibration,
    Prober,
    ProbeRow,
    ProbeRun,
    paired_verdict,
    tenant_probe,
    threshold_ms,
    verdict,
)
from kvlab.errors import InvalidArgumentError  # noqa: E402
from kvlab.views.probe import probe_timing_figure  # noqa: E402

FAST = settings(max_examples=30, deadline=None)


def timing(*wall: float) -> Timing:
    return Timing(tuple(wall), tuple(wall))


def row(name: str, secret: bool, *wall: float, threshold: float = 10.0) -> ProbeRow:
    t = timing(*wall)
    return ProbeRow(name, secret, 100, 96 if secret else 0, t, threshold, verdict(t, threshold))


# ---------------------------------------------------------------- the decision rule


def test_threshold_is_halfway_on_a_log_scale():
    assert threshold_ms(timing(4, 5, 6), timing(20, 20, 20)) == pytest.approx(10.0)
    cal = Calibration(timing(1, 2, 3), timing(7, 8, 9))
    assert cal.threshold_ms == pytest.approx(4.0) and cal.separated
    assert not Calibration(timing(1, 5, 9), timing(2, 6, 10)).separated


def test_verdict_uses_the_median_so_one_slow_repeat_changes_nothing():
    assert verdict(timing(3, 4, 500), 10.0)  # a hit whose last repeat lost the core
    assert not verdict(timing(0.5, 30, 31), 10.0)  # a miss with one lucky repeat
    assert not verdict(timing(10), 10.0)  # "below" the threshold, strictly


def test_the_paired_verdict_follows_the_load_that_slows_all_three():
    hit, miss = timing(5, 15, 5, 5, 15), timing(20, 60, 20, 20, 60)  # repeats 2 and 5 ran 3x slower
    assert paired_verdict(timing(6, 18, 6, 6, 18), hit, miss)  # a hit, slowed with its neighbours
    assert not paired_verdict(timing(19, 57, 19, 19, 57), hit, miss)
    # a fixed threshold from the quiet repeats (10 ms) calls the slowed hit a miss twice; the median still holds
    assert verdict(timing(6, 18, 6, 6, 18), 10.0)
    assert not paired_verdict(timing(6, 40, 40, 40, 6), hit, miss)  # most repeats above their threshold
    with pytest.raises(InvalidArgumentError, match="one sample each"):
        paired_verdict(timing(1, 2), hit, miss)
    with pytest.raises(InvalidArgumentError, match="Timing"):
        paired_verdict(timing(1), 5.0, miss)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="positive"):
        paired_verdict(timing(1), timing(0), timing(1))


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "10", None])
def test_verdict_and_threshold_refuse_bad_input(bad):
    with pytest.raises(InvalidArgumentError):
        verdict(timing(1), bad)
    with pytest.raises(InvalidArgumentError):
        threshold_ms(timing(1), bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="positive"):
        threshold_ms(timing(0), timing(1))


def test_accuracy_found_and_leaked_follow_the_verdicts():
    cal = Calibration(timing(4, 5, 6), timing(20, 21, 22))
    open_channel = ProbeRun(False, "dana", 0, cal, (row("alice", False, 21), row("dana", True, 5)))
    assert open_channel.found == ("dana",) and open_channel.leaked and open_channel.accuracy == 1.0
    assert open_channel.ttft_ratio() == pytest.approx(21 / 5)
    closed = ProbeRun(True, "dana", 0, cal, (row("alice", False, 21), row("dana", True, 21)))
    assert closed.found == () and not closed.leaked and closed.accuracy == 0.5  # always "miss": chance
    assert closed.ttft_ratio() == pytest.approx(1.0)


# ---------------------------------------------------------------- the prober's requests


def test_the_right_guess_reuses_the_victims_blocks_only_without_a_salt():
    for salted in (False, True):
        prober = Prober(salted=salted, form_tokens=48)
        prober.plant("dana")
        _, _, prompt_tokens, right = prober.request("dana")
        _, _, _, wrong = prober.request("alice")
        _, _, _, own = prober.request(KNOWN_HIT)  # the prober's own earlier prompt hits either way
        _, _, _, miss = prober.request(KNOWN_MISS)
        assert own == (prompt_tokens - 1) // 16 * 16 and miss == 0 and wrong == 0
        # with a salt the right guess is computed exactly like a known miss: nothing tells it apart
        assert right == (0 if salted else (prompt_tokens - 1) // 16 * 16)


def test_every_request_starts_from_the_planted_state():
    prober = Prober(salted=False, form_tokens=48)
    prober.plant("dana")
    assert [prober.request("alice")[3] for _ in range(3)] == [0, 0, 0]  # no self-made hits
    assert len({prober.request("dana")[3] for _ in range(3)}) == 1
    prober.plant("chen")  # a new victim request replaces the old one
    assert prober.request("dana")[3] == 0 and prober.request("chen")[3] > 0


def test_a_restored_cache_gives_the_same_tokens_as_computing_everything():
    prober = Prober(salted=False, form_tokens=48)
    prober.plant("dana")
    for _ in range(3):
        prober.request("alice")  # each writes K/V into blocks the planted state holds free
    prober.restore()
    hit = prober.engine.generate(prober.prompt("dana"), max_tokens=3)
    cold = Engine(cache="off", block_size=16, max_model_len=prober.engine.max_model_len)
    full = cold.generate(prober.prompt("dana"), max_tokens=3)
    assert hit.cache_n > 0 and hit.output_tokens == full.output_tokens


def test_probe_times_each_guess_repeats_times_and_tops_up_the_calibration():
    prober = Prober(salted=False, form_tokens=32, calibration=2)
    prober.plant("dana")
    cal = prober.calibrate()
    assert cal.hit.repeats == cal.miss.repeats == 2
    r = prober.probe("dana", repeats=3, secret="dana")
    assert r.ttft.repeats == 3 and r.is_secret and r.cache_hit
    assert prober.calibration().hit.repeats == 2 + 3 and prober.calibration(latest=True).hit.repeats == 2
    assert r.threshold_ms > 0


def test_tenant_probe_returns_every_guess_with_its_calibration():
    run = tenant_probe(salted=True, candidates=("alice", "dana"), form_tokens=32, repeats=2, calibration=2)
    assert [g.name for g in run.guesses] == ["alice", "dana"]
    assert run.calibration.hit.repeats == 2 + 2 * 2  # the first two, then one beside each repeat
    assert all(not g.cache_hit for g in run.guesses)


def test_bad_arguments_are_refused_before_anything_runs():
    with pytest.raises(InvalidArgumentError, match="plant"):
        Prober(salted=False, form_tokens=16).request("alice")
    with pytest.raises(InvalidArgumentError, match="calibrate"):
        Prober(salted=False, form_tokens=16).calibration()
    for kwargs, match in [
        ({"secret": "two words"}, "secret"),
        ({"secret": "nobody"}, "known-miss"),
        ({"candidates": ("alice", "alice")}, "repeat"),
        ({"candidates": "alice"}, "list"),
        ({"candidates": ()}, "non-empty"),
        ({"repeats": 0}, "repeats"),
        ({"form_tokens": 0}, "form_tokens"),
        ({"form_tokens": 10**9}, "form_tokens"),
        ({"calibration": 0}, "calibration"),
        ({"salted": "yes"}, "salted"),
    ]:
        args = {"salted": False, **kwargs}
        with pytest.raises(InvalidArgumentError, match=match):
            tenant_probe(**args)  # type: ignore[arg-type]


@FAST
@given(value=hostile_values(), which=st.sampled_from(["secret", "candidates", "repeats", "form_tokens"]))
def test_hostile_values_are_refused_by_kvlab(value, which):
    args = {
        "salted": False,
        "candidates": ("alice", "dana"),
        "form_tokens": 16,
        "repeats": 1,
        "calibration": 1,
    }
    args[which] = value
    if which == "form_tokens" and isinstance(value, int) and 1 <= value <= 4096 and value > 64:
        return  # valid, but slow to build: the bounds are tested above
    if which == "repeats" and isinstance(value, int) and value > 3:
        return
    kvlab_or_ok(lambda: tenant_probe(**args))  # type: ignore[arg-type]


# ---------------------------------------------------------------- the figure


def test_the_figure_shows_calibration_threshold_and_every_guess():
    runs = {
        "shared cache": ProbeRun(
            False, "dana", 0, Calibration(timing(4, 5, 6), timing(20, 21, 22)),
            (row("alice", False, 21, 22, 23), row("dana", True, 5, 5, 6)),
        ),
    }  # fmt: skip
    fig = probe_timing_figure(runs, title="probe")
    names = [t.name for t in fig.data]
    assert names == ["known hit", "known miss", "a guess (median, IQR)"]
    assert fig.layout.shapes[0].x0 == pytest.approx(math.sqrt(5 * 21))
    assert list(fig.data[2].y) == ["guess alice: miss", "guess dana (the secret): hit"]
    real = tenant_probe(salted=False, candidates=("dana",), form_tokens=16, repeats=1, calibration=1)
    assert len(probe_timing_figure({"a": real, "b": real}).data) == 6


@pytest.mark.parametrize("bad", [None, {}, [], {"x": 3}, {"x": object()}, {str(i): 1 for i in range(9)}])
def test_the_figure_refuses_what_is_not_a_probe_run(bad):
    with pytest.raises(InvalidArgumentError):
        probe_timing_figure(bad)
    with pytest.raises(InvalidArgumentError):
        probe_timing_figure({"x": ProbeRun(False, "a", 0, Calibration(timing(1), timing(2)), ())}, title=3)
