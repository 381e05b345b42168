"""swa_decision_figure: the reuse rule drawn for one request, each row's verdict read from the model."""

from __future__ import annotations

import json

import pytest

from kvlab.errors import InvalidArgumentError
from kvlab.lessons import ex12
from kvlab.server.swa import SwaSlot
from kvlab.views._common import text_px
from kvlab.views.swa import (
    _STRIP_TEXT_PX,
    _cell_runs,
    _decision_px_per_position,
    _label_span,
    swa_decision_figure,
    swa_spec,
)


@pytest.fixture(scope="module")
def lesson():
    return ex12.example_12()


def verdicts(fig) -> dict[str, str]:
    """Row -> the verdict written beside it."""
    layout = fig.to_plotly_json()["layout"]
    return {a["y"]: a["text"] for a in layout["annotations"] if a.get("xref") == "paper"}


def band(fig) -> tuple[float, float]:
    (rect,) = [s for s in fig.to_plotly_json()["layout"]["shapes"] if s["type"] == "rect"]
    return rect["x0"], rect["x1"]


def test_the_lessons_request_2_starts_over_and_each_row_says_why(lesson):
    fig = swa_decision_figure(lesson.slots["default"].history, request=2)
    assert band(fig) == (223, 350)  # the token at 350 reads 223..350; its own keys it computes
    assert "no usable copy, start over (cache_n 0)" in fig.layout.title.text
    said = verdicts(fig)
    assert said["SWA cells hold"] == "✗ the oldest is 1,073,<br>not below 222"
    assert said["checkpoint 1"] == "✗ ends at 1,324,<br>after 350"
    assert said["checkpoint 2"] == "✗ ends at 1,836,<br>after 350"
    bars = fig.data[0]
    assert (
        list(bars.y)
        == ["full-attention layers", "SWA cells hold"] + ["checkpoint 1"] * 2 + ["checkpoint 2"] * 2
    )
    # each checkpoint: a faint bar for its label range, a solid one for the data it keeps (its last 128)
    assert list(zip(bars.base, bars.x, strict=True)) == [
        (0, 1841), (1073, 768), (557, 768), (1197, 128), (1069, 768), (1709, 128)
    ]  # fmt: skip
    assert list(bars.marker.opacity) == [1.0, 1.0, 0.3, 1.0, 0.3, 1.0]
    json.loads(fig.to_json())


def test_the_append_only_follow_up_is_served_by_the_cells(lesson):
    fig = swa_decision_figure(lesson.slots["follow_up"].history, request=2)
    said = verdicts(fig)
    assert said["SWA cells hold"].startswith("✓") and said["checkpoint 1"] == "not needed"
    assert band(fig) == (1714, 1841) and "the SWA cells serve, cache_n 1,841" in fig.layout.title.text


def test_swa_full_tests_with_a_window_of_zero(lesson):
    fig = swa_decision_figure(lesson.slots["swa_full"].history, request=2)
    assert band(fig) == (350, 350) and "window of 0" in fig.layout.title.text
    assert "cache_n 350" in fig.layout.title.text


def test_the_chat_run_restores_the_user_message_checkpoint():
    _, _, slot = ex12.example_12_chat()
    fig = swa_decision_figure(slot.history, request=2)
    said = verdicts(fig)
    assert said["checkpoint 1"] == "✓ ends by 350, starts<br>at 0: restored; computes<br>344 to 349 again"
    assert said["checkpoint 3"].startswith("✗ ends at 1,795")
    # the restored checkpoint's data covers what continuing from its last position reads
    bars = fig.data[0]
    row = [(b, b + w) for y, b, w in zip(bars.y, bars.base, bars.x, strict=True) if y == "checkpoint 1"]
    assert row == [(0, 345), (217, 345), (344, 350)]  # label [0, 344], data 217..344, 344..349 again
    (_, (data_from, data_end), _) = row
    assert data_from <= 344 - 127 and data_end == 345


def test_an_older_usable_checkpoint_is_not_checked():
    slot = SwaSlot()
    first = list(range(10_000, 11_800))
    slot.complete(first, max_tokens=1000, user_starts=[345])
    slot.complete(first[:1500] + list(range(90_000, 90_020)), user_starts=[345])
    said = verdicts(swa_decision_figure(slot.history, request=2))
    assert said["checkpoint 1"].startswith("not checked") and said["checkpoint 2"].startswith("✓")


def test_the_boundary_names_both_numbers():
    fig = swa_decision_figure(ex12.branch_after_long_prompt(1201).history, request=2)
    assert verdicts(fig)["SWA cells hold"] == "✗ the oldest is 1,073,<br>not below 1,073"
    assert "no checkpoint to fall back on" in fig.layout.title.text


def test_bar_labels_stay_clear_of_the_vertical_lines(lesson):
    # "[0, 344]" used to sit across the dashed threshold line at 222
    figures = [
        swa_decision_figure(lesson.slots[name].history, request=2) for name in ("default", "follow_up")
    ] + [swa_decision_figure(ex12.example_12_chat()[2].history, request=2)]
    figures.append(swa_decision_figure(ex12.branch_after_long_prompt(1201).history, request=2))
    for fig in figures:
        layout = fig.to_plotly_json()["layout"]
        lines = [s["x0"] for s in layout["shapes"] if s["type"] == "line"]
        rows = list(layout["yaxis"]["categoryarray"])
        px = _decision_px_per_position(rows, layout["xaxis"]["range"][1])
        labels = [a for a in layout["annotations"] if a["xref"] == "x" and a["y"] in rows]
        assert len(labels) >= len(rows)
        for a in labels:
            low, high = _label_span(a["x"], a["xanchor"], a["text"], px)
            assert not any(low <= x <= high for x in lines), (a["text"], low, high, lines)


def test_cell_labels_fit_their_runs(lesson):
    state = lesson.slots["default"].history[5].state
    spec = swa_spec(state)
    labels = next(t for t in spec["data"] if t.get("name") == "cell runs")
    widths = {(a + b) / 2: (b - a + 1) for a, b, _, _ in _cell_runs(list(state.cells))}
    for x, text in zip(labels["x"], labels["text"], strict=True):
        assert text_px(text, 11) <= widths[x] / len(state.cells) * _STRIP_TEXT_PX, text


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda h: swa_decision_figure([h[0]]), "must be a SwaSlot's history"),
        (lambda h: swa_decision_figure(h, request=0), "request"),
        (lambda h: swa_decision_figure(h, request=3), "holds 2 requests"),
        (lambda h: swa_decision_figure(h, request=1), "shares nothing"),
        (lambda h: swa_decision_figure(h, title=5), "title must be a string"),
        (lambda h: swa_decision_figure(h, n_swa=0), "n_swa"),
        (lambda h: swa_decision_figure(h, n_swa=True), "n_swa"),
    ],
)
def test_bad_input_is_refused(lesson, call, message):
    with pytest.raises(InvalidArgumentError, match=message):
        call(lesson.slots["default"].history)


def test_state_before_finds_the_snapshot_a_request_arrived_at(lesson):
    slot = lesson.slots["default"]
    assert ex12.state_before(slot, 2) == slot.history[5].state  # after request 1's sample step
    assert ex12.state_before(slot, 1) == slot.history[0].state
    for bad, message in ((0, "request"), (3, "served 2 requests"), (True, "request")):
        with pytest.raises(InvalidArgumentError, match=message):
            ex12.state_before(slot, bad)
    with pytest.raises(InvalidArgumentError, match="must be a SwaSlot"):
        ex12.state_before(slot.history, 2)


def test_every_animation_frame_keeps_one_plot_area(lesson):
    # rendered in Chromium: with automargin the frames' bars and ticks came apart, an empty first
    # frame showed 0..4 instead of the row names, and the colour bar moved the plot's right edge
    from kvlab.views.swa import swa_animation

    fig = swa_animation(lesson.slots["default"].history, title="Default server")
    layouts = [fig.layout] + [f.layout for f in fig.frames]
    margins = {(lay.margin.l, lay.margin.r) for lay in layouts if lay.margin.l is not None}
    assert len(margins) == 1, margins
    left, _ = margins.pop()
    assert left >= text_px("full-attention layers", 13)
    assert fig.layout.yaxis.type == "category" and fig.layout.yaxis.automargin is False
    assert fig.data[0].colorbar.x >= 1 and fig.layout.xaxis.domain == (0, 1)
