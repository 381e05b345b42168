"""timing_per_turn_figure: medians with their interquartile ranges as error bars, refusing anything but Timings."""

from __future__ import annotations

import pytest

from kvlab.core.timing import Timing
from kvlab.errors import InvalidArgumentError
from kvlab.views import timing_per_turn_figure


def _timing(*wall: float) -> Timing:
    return Timing(tuple(wall), tuple(wall))


def test_each_point_is_the_median_with_its_iqr_as_the_bar() -> None:
    cold, warm = _timing(10, 11, 12, 13, 30), _timing(2, 2, 3, 3, 4)
    fig = timing_per_turn_figure({"slot": [cold, warm]}, y_title="ms", title="TTFT")
    (trace,) = fig.data
    assert list(trace.y) == [cold.median_ms, warm.median_ms] == [12, 3]
    assert list(trace.error_y.array) == pytest.approx([cold.q3_ms - 12, warm.q3_ms - 3])
    assert list(trace.error_y.arrayminus) == pytest.approx([12 - cold.q1_ms, 3 - warm.q1_ms])
    assert trace.error_y.symmetric is False


def test_one_line_per_series_in_order() -> None:
    series = {"slot": [_timing(5, 6, 7)], "blocks": [_timing(4, 5, 6)], "off": [_timing(9, 9, 9)]}
    fig = timing_per_turn_figure(series, y_title="ms", title="TTFT")
    assert [t.name.split(" (")[0] for t in fig.data] == ["slot", "blocks", "off"]
    assert list(fig.data[2].error_y.array) == [0]


@pytest.mark.parametrize(
    "series",
    [
        {"slot": [1.0, 2.0]},  # plain numbers: no spread to draw
        {"slot": "fast"},
        {"slot": [_timing(1, 2), None]},
        {},
        [("slot", [_timing(1, 2)])],
    ],
)
def test_anything_but_timings_is_refused_with_kvlab_s_error(series) -> None:
    with pytest.raises(InvalidArgumentError):
        timing_per_turn_figure(series, y_title="ms", title="TTFT")


def test_an_endless_series_is_refused_before_it_is_read() -> None:
    def endless():
        while True:
            yield _timing(1, 2)

    class Endless(list):
        def __iter__(self):
            return endless()

        def __len__(self):
            return 10**12

    with pytest.raises(InvalidArgumentError):
        timing_per_turn_figure({"slot": Endless()}, y_title="ms", title="TTFT")
