"""kvlab.core.timing: the statistics of a Timing, the order of calls, and refusals of hostile input.

Nothing here asserts how long anything takes: the functions timed count their calls, and the
statistics are checked on samples given by hand.
"""

from __future__ import annotations

import math

import pytest
from hostile import hostile_values, kvlab_or_ok
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.timing import MAX_REPEATS, Timing, measure, measure_once, measure_side_by_side
from kvlab.errors import InvalidArgumentError

FAST = settings(max_examples=40, deadline=None)


def timing(*wall: float) -> Timing:
    return Timing(tuple(wall), tuple(w / 2 for w in wall))


def test_quartiles_median_and_iqr_of_known_samples():
    t = timing(1, 2, 3, 4, 5)
    assert (t.q1_ms, t.median_ms, t.q3_ms, t.iqr_ms) == (2, 3, 4, 2)
    assert t.min_ms == 1 and t.repeats == 5 and t.cpu_median_ms == 1.5
    one = timing(7.5)
    assert (one.q1_ms, one.median_ms, one.q3_ms, one.iqr_ms) == (7.5, 7.5, 7.5, 0)
    assert timing(1, 2).median_ms == 1.5
    assert set(t.as_dict()) == {"median_ms", "q1_ms", "q3_ms", "iqr_ms", "cpu_median_ms", "repeats"}
    assert str(t) == "3.00 ms (IQR 2.00-4.00, CPU 1.50 ms, n=5)"


def test_an_outlier_moves_the_mean_not_the_median():
    steady = timing(10, 10, 10, 10, 10, 10, 10)
    loaded = timing(10, 10, 10, 10, 10, 10, 900)  # one call lost the core
    assert loaded.median_ms == steady.median_ms == 10
    assert loaded.iqr_ms == 0


def test_clearly_faster_needs_the_spreads_apart():
    fast, slow = timing(1, 2, 3, 4, 5), timing(6, 7, 8, 9, 10)
    assert fast.clearly_faster_than(slow) and not slow.clearly_faster_than(fast)
    overlapping = timing(3, 4, 5, 6, 7)
    assert not fast.clearly_faster_than(overlapping)  # fast's q3 (4) is not below its q1 (4)
    assert not fast.clearly_faster_than(fast)


def test_ratios_and_their_spread():
    slow, fast = timing(8, 10, 12), timing(1, 2, 3)
    assert slow.ratio_to(fast) == 5
    low, high = slow.ratio_spread(fast)
    assert low == pytest.approx(9 / 2.5) and high == pytest.approx(11 / 1.5)
    zero = timing(0, 0)
    assert zero.ratio_to(zero) == 1 and fast.ratio_to(zero) == math.inf


def test_ratio_by_round_cancels_load_that_falls_on_both_calls_of_a_round():
    """Rounds 2 and 4 ran under load that slowed both calls alike: round by round the ratio stays 1.1."""
    paged, sdpa = timing(1.1, 2.2, 1.1, 3.3, 1.1), timing(1, 2, 1, 3, 1)
    assert paged.ratio_by_round(sdpa) == pytest.approx((1.1, 1.1, 1.1))
    low, high = paged.ratio_spread(sdpa)
    assert low < 1 and high > 2  # each spread at its worst: the load counted twice
    assert timing(0, 2, 3).ratio_by_round(timing(0, 1, 1)) == (1.5, 2.0, 2.5)  # ratios 1 (0 / 0), 2, 3
    assert timing(1, 1).ratio_by_round(timing(0, 1))[2] == math.inf


@pytest.mark.parametrize("other", [None, 1.0, "x"])
def test_ratio_by_round_refuses_what_is_not_a_timing(other):
    with pytest.raises(InvalidArgumentError, match="needs a Timing"):
        timing(1, 2).ratio_by_round(other)


def test_ratio_by_round_refuses_timings_of_different_lengths():
    with pytest.raises(InvalidArgumentError, match="measure_side_by_side"):
        timing(1, 2, 3).ratio_by_round(timing(1, 2))


def test_samples_are_stored_as_floats_and_lists_are_accepted():
    t = Timing([1, 2], [0, 1])
    assert t.wall_ms == (1.0, 2.0) and t.cpu_ms == (0.0, 1.0)
    assert t == Timing((1.0, 2.0), (0.0, 1.0))


def test_measure_warms_up_then_times_every_repeat():
    calls = []
    t = measure(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and t.repeats == 5
    assert all(w >= 0 for w in t.wall_ms) and all(c >= 0 for c in t.cpu_ms)


def test_side_by_side_interleaves_shuffled_rounds_the_same_every_run():
    def calls(order: list[str]) -> dict[str, object]:
        return {name: (lambda name=name: order.append(name)) for name in "abc"}

    order: list[str] = []
    result = measure_side_by_side(calls(order), warmup=1, repeats=12)
    assert set(result) == set("abc") and all(t.repeats == 12 for t in result.values())
    rounds = ["".join(order[i : i + 3]) for i in range(0, len(order), 3)]
    # the warm-up in the given order, then each function once a round
    assert rounds[0] == "abc" and all(sorted(r) == list("abc") for r in rounds)
    assert len(set(rounds[1:])) > 1  # not one fixed order
    followed = {(a, b) for a, b in zip(order[3:], order[4:], strict=False)}
    assert {(a, b) for a in "abc" for b in "abc" if a != b} <= followed  # every call after every other
    again: list[str] = []
    measure_side_by_side(calls(again), warmup=1, repeats=12)
    assert again == order


def test_sync_brackets_every_timed_call_and_measure_once_returns_the_value():
    events: list[str] = []
    measure(lambda: events.append("call"), warmup=0, repeats=2, sync=lambda: events.append("sync"))
    assert events == ["sync", "call", "sync"] * 2
    value, t = measure_once(lambda: 42)
    assert value == 42 and t.repeats == 1


def test_an_exception_in_the_timed_function_reaches_the_caller():
    def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        measure(boom, warmup=0, repeats=1)


@pytest.mark.parametrize(
    "wall, cpu, match",
    [
        ((), (), "1 to"),
        ((1.0,), (), "1 to"),
        ((1.0, 2.0), (1.0,), "as many"),
        ((float("nan"),), (0.0,), "finite"),
        ((float("inf"),), (0.0,), "finite"),
        ((-1.0,), (0.0,), "from 0"),
        ((True,), (0.0,), "finite"),
        (("1",), (0.0,), "finite"),
        ("12", "12", "tuple or list"),
        (None, None, "tuple or list"),
        ((1.0,) * (MAX_REPEATS + 1), (1.0,) * (MAX_REPEATS + 1), "1 to"),
    ],
)
def test_timing_refuses_bad_samples(wall, cpu, match):
    with pytest.raises(InvalidArgumentError, match=match):
        Timing(wall, cpu)


def test_measure_refuses_bad_arguments_and_calls_nothing():
    calls = []

    def fn():
        calls.append(1)

    for kwargs, match in [
        ({"warmup": -1}, "warmup"),
        ({"repeats": 0}, "repeats"),
        ({"repeats": 2.0}, "repeats"),
        ({"repeats": MAX_REPEATS + 1}, "repeats"),
        ({"sync": "cuda"}, "sync"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            measure(fn, **kwargs)
    with pytest.raises(InvalidArgumentError, match="function"):
        measure("not a function")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="non-empty mapping"):
        measure_side_by_side({})
    with pytest.raises(InvalidArgumentError, match="non-empty mapping"):
        measure_side_by_side([fn])  # type: ignore[arg-type]
    assert set(measure_side_by_side({16: lambda: None, 64: lambda: None}, warmup=0, repeats=1)) == {16, 64}
    with pytest.raises(InvalidArgumentError, match="function"):
        measure_side_by_side({"a": fn, "b": 3})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match="Timing"):
        timing(1).ratio_to(1.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="Timing"):
        timing(1).clearly_faster_than(None)  # type: ignore[arg-type]
    assert calls == []  # a refused call ran nothing


@FAST
@given(value=hostile_values(), which=st.sampled_from(["warmup", "repeats", "sync", "fn", "wall"]))
def test_hostile_values_are_refused_by_kvlab_or_accepted(value, which):
    calls = []

    def fn():
        calls.append(1)

    if which == "fn":
        kvlab_or_ok(lambda: measure(value, warmup=0, repeats=1))
    elif which == "wall":
        kvlab_or_ok(lambda: Timing(value, value))
    else:
        kwargs = {which: value}
        if which == "sync" and callable(value):
            return
        if kvlab_or_ok(lambda: measure(fn, **kwargs)) is False:
            assert calls == []


@FAST
@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=50))
def test_quartiles_are_ordered_and_inside_the_samples(values):
    t = Timing(tuple(values), tuple(values))
    assert min(values) <= t.q1_ms <= t.median_ms <= t.q3_ms <= max(values)
    assert t.iqr_ms >= 0
    assert not t.clearly_faster_than(t)


@FAST
@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=2, max_size=50))
def test_quartiles_are_statistics_inclusive_quartiles(values):
    import statistics

    t = Timing(tuple(values), tuple(values))
    expected = statistics.quantiles(values, n=4, method="inclusive")
    assert [t.q1_ms, t.median_ms, t.q3_ms] == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_a_ratio_over_zero_times_is_infinite_not_nan():
    """A clock too coarse to see a call gives zeros; the rounds' ratios are then infinite, every quartile."""
    assert timing(1, 2, 3).ratio_by_round(timing(0, 0, 0)) == (math.inf, math.inf, math.inf)
    assert timing(0, 0, 0).ratio_by_round(timing(0, 0, 0)) == (1.0, 1.0, 1.0)


class _LyingFloat(float):
    def __float__(self):
        return math.nan

    def __lt__(self, other):
        raise RuntimeError("a sample's own comparison ran")


class _Unchecked(Timing):
    def __post_init__(self):  # skips the checks
        pass


class _FewerRepeats(Timing):
    repeats = property(lambda self: 1)


def test_samples_are_read_by_their_value_and_bounded():
    assert timing(_LyingFloat(1.0), _LyingFloat(2.0)).wall_ms == (1.0, 2.0)
    for huge in (10**400, 2**1024, 1e13):
        with pytest.raises(InvalidArgumentError, match="finite times from 0"):
            Timing((huge,), (1.0,))


@pytest.mark.parametrize(
    "other",
    [_Unchecked(("a",), ("b",)), _Unchecked(None, None), _FewerRepeats((1.0, 2.0), (1.0, 2.0))],
)
def test_ratio_by_round_reads_the_other_timings_samples_again(other):
    with pytest.raises(InvalidArgumentError, match="wall_ms|as many"):
        timing(1.0).ratio_by_round(other)


def test_ratio_by_round_reads_either_clock_and_refuses_others():
    slow, fast = Timing((4.0, 8.0), (2.0, 2.0)), Timing((2.0, 2.0), (1.0, 1.0))
    assert slow.ratio_by_round(fast)[1] == 3.0
    assert slow.ratio_by_round(fast, clock="cpu") == (2.0, 2.0, 2.0)
    for clock in ("gpu", None, "cpu_ms"):
        with pytest.raises(InvalidArgumentError, match="clock"):
            slow.ratio_by_round(fast, clock=clock)
