"""kvlab.views.swa: what it draws for the lesson's SWA runs, its steps, bad input."""

from __future__ import annotations

import json

import pytest

from kvlab.core.snapshots import EMPTY
from kvlab.errors import InvalidArgumentError
from kvlab.lessons.ex12 import example_12, example_12_chat
from kvlab.lessons.ex13 import example_13
from kvlab.views.agents import agent_turns_history
from kvlab.views.swa import swa_animation, swa_figure, swa_hints, swa_spec, swa_stepper
from kvlab.views.text import captions


@pytest.fixture(scope="module")
def ex12():
    return example_12()


@pytest.fixture(scope="module")
def chat():
    return example_12_chat()


@pytest.fixture(scope="module")
def runs():
    return example_13()


def bars(spec: dict, label_start: str) -> list[tuple[str, int, int, str]]:
    """(row, start, end, text) of the bar trace whose name starts with ``label_start``."""
    trace = next(t for t in spec["data"] if t["type"] == "bar" and t["name"].startswith(label_start))
    return [
        (y, b, b + x, s)
        for y, b, x, s in zip(trace["y"], trace["base"], trace["x"], trace["text"], strict=True)
    ]


def opacities(spec: dict, label_start: str) -> list[float]:
    """The marker opacity of each bar of the trace whose name starts with ``label_start``."""
    trace = next(t for t in spec["data"] if t["type"] == "bar" and t["name"].startswith(label_start))
    return list(trace["marker"]["opacity"])


# ---------------------------------------------------------------------- the SWA view


def test_the_slot_after_the_long_prompt(ex12):
    state = ex12.slots["default"].history[5].state
    spec = swa_spec(state)
    strip = spec["data"][0]
    assert strip["type"] == "heatmap" and strip["z"] == [[None if p == EMPTY else p for p in state.cells]]
    assert bars(spec, "positions the SWA cells") == [("SWA cells hold", 1073, 1841, "[1073, 1840]")]
    assert bars(spec, "positions the full-attention") == [("full-attention layers", 0, 1841, "0 … 1840")]
    # each checkpoint twice, as in the decision figure: its label range faint, the last n_swa = 128
    # positions its data keeps solid
    assert bars(spec, "context checkpoint") == [
        ("checkpoint 1", 1197, 1325, ""),
        ("checkpoint 1", 557, 1325, "[557, 1324]"),
        ("checkpoint 2", 1709, 1837, ""),
        ("checkpoint 2", 1069, 1837, "[1069, 1836]"),
    ]  # the data first, so the label bar's text is drawn on top of it
    assert opacities(spec, "context checkpoint") == [1.0, 0.3, 1.0, 0.3]
    labels = next(t for t in spec["data"] if t.get("name") == "cell runs")["text"]
    assert labels == ["1536–1840", "1073–1535"]  # the ring wrapped: cells 0-304 hold the newest positions
    assert spec["layout"]["yaxis"]["categoryarray"][:3] == [
        "full-attention layers",
        "SWA cells hold",
        "batch decoded",
    ]


def test_the_reuse_marks_show_the_needed_band(ex12):
    short = ex12.default[1]
    fig = swa_figure(ex12.slots["default"].history[5].state, reuse=(short.common_prefix, short.threshold))
    lines = sorted(s["x0"] for s in fig.to_plotly_json()["layout"]["shapes"] if s["type"] == "line")
    assert lines == [222, 350]
    band = [s for s in fig.to_plotly_json()["layout"]["shapes"] if s["type"] == "rect" and s["xref"] == "x"]
    assert [(b["x0"], b["x1"]) for b in band] == [(223, 350)]  # the positions the window reads
    texts = [a["text"] for a in fig.to_plotly_json()["layout"]["annotations"]]
    assert "threshold 222" in texts and "continue at 350" in texts
    assert "positions 223..349" in fig.layout.title.text and "threshold is 222" in fig.layout.title.text
    json.loads(fig.to_json())


def test_swa_full_cells_hold_everything(ex12):
    spec = swa_spec(ex12.slots["swa_full"].history[3].state)
    assert len(spec["data"][0]["z"][0]) == 4096
    assert bars(spec, "positions the SWA cells") == [("SWA cells hold", 0, 1841, "[0, 1840]")]


def test_created_and_restored_checkpoints_are_marked(chat):
    _, _, slot = chat
    steps = slot.history.steps
    taken = swa_spec(steps[3].state)  # batch [345, 1284): the user-message checkpoint was taken before it
    assert bars(taken, "checkpoint taken") == [
        ("checkpoint 1", 217, 345, ""),
        ("checkpoint 1", 0, 345, "[0, 344]"),
    ]
    assert bars(taken, "batch decoded") == [("batch decoded", 345, 1284, "[345, 1284)")]
    restored = swa_spec(steps[7].state)
    assert bars(restored, "checkpoint restored") == [
        ("checkpoint 1", 217, 345, ""),
        ("checkpoint 1", 0, 345, "[0, 344]"),
    ]
    assert opacities(restored, "checkpoint restored") == [1.0, 0.3]
    # the checkpoint says [0, 344], but its data held only the last n_swa positions (llama.cpp's
    # state_write skips masked cells), so after the restore the cells cover [217, 343]
    assert bars(restored, "positions the SWA cells") == [("SWA cells hold", 217, 344, "[217, 343]")]


def test_the_animation_has_one_frame_per_step_on_fixed_axes(ex12):
    history = ex12.slots["default"].history
    fig = swa_animation(history, title="Default server")
    assert len(fig.frames) == len(history)
    assert fig.layout.meta["kvlab_captions"] == captions(history)
    hints = swa_hints(history)
    assert hints["x_max"] == 1841 and hints["checkpoint_rows"] == 2
    assert {len(f.data) for f in fig.frames} == {len(fig.data)}
    assert fig.layout.xaxis.range == (0, 1841)
    assert "Step 3 of 9" in fig.frames[3].layout.title.text
    # the last frame holds request 2's checkpoint [0, 349]: faint label, solid data 222..349
    last = fig.frames[-1].to_plotly_json()
    cp = next(t for t in last["data"] if t.get("name", "").startswith("context checkpoint"))
    assert list(zip(cp["base"], cp["x"], cp["marker"]["opacity"], strict=True)) == [
        (222, 128, 1.0),
        (0, 350, 0.3),
    ]
    json.loads(fig.to_json())


def test_the_stepper_steps_through_the_history(chat):
    _, _, slot = chat
    s = swa_stepper(slot.history)
    assert len(s.states) == len(slot.history)
    s.go_to(7)
    assert s.index == 7 and "restored checkpoint [0, 344]" in s.caption.value
    shown = s.figures[0].spec
    assert bars(shown, "checkpoint restored") == [
        ("checkpoint 1", 217, 345, ""),
        ("checkpoint 1", 0, 345, "[0, 344]"),
    ]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda st: swa_spec("state"), "must be a kvlab.server.swa.SwaState"),
        (lambda st: swa_spec(st, reuse=(350, 400)), "cannot lie after the reuse point"),
        (lambda st: swa_spec(st, reuse=(350,)), "pair (n_past, threshold)"),
        (lambda st: swa_spec(st, checkpoint_rows=1), "holds 2 checkpoints"),
        (lambda st: swa_spec(st, x_max=0), "x_max"),
        (lambda st: swa_spec(st, n_swa=0), "n_swa"),
        (lambda st: swa_figure(st, n_swa=True), "n_swa"),
        (lambda st: swa_figure(st, title=3), "title must be a string"),
    ],
)
def test_swa_view_rejects_bad_input(ex12, call, message):
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(ex12.slots["default"].history[5].state)


def test_swa_animation_rejects_other_snapshots(runs):
    with pytest.raises(InvalidArgumentError, match="needs a SwaState"):
        swa_animation(agent_turns_history(runs))
