"""kvlab.views.slot_files: what it draws for notebook 11's save, restart, restore and reuse, its steps, bad input."""

from __future__ import annotations

import pytest

from kvlab.errors import InvalidArgumentError
from kvlab.lessons.ex11 import save_restore_history
from kvlab.views.slot_files import (
    ROWS,
    SaveRestoreState,
    slot_file_animation,
    slot_file_figure,
    slot_file_spec,
    slot_file_stepper,
)


@pytest.fixture(scope="module")
def history():
    return save_restore_history()


def bars(spec: dict, label_start: str) -> dict[str, tuple[int, int]]:
    """row -> (start, end) of the bar trace whose name starts with ``label_start``."""
    trace = next(t for t in spec["data"] if t["type"] == "bar" and t["name"].startswith(label_start))
    return {y: (b, b + x) for y, b, x in zip(trace["y"], trace["base"], trace["x"], strict=True)}


def test_the_sequence_is_the_models_own_steps(history):
    captions = [str(s.event) for s in history.steps]
    assert captions[0] == "server 1 starts with an empty slot"
    assert "cache_n 0, prompt_n 748" in captions[1]
    assert captions[3].startswith("POST /slots/0?action=save: 748 tokens")
    assert captions[6] == "server 2: slot 0 restored with 748 tokens"
    assert "cache_n 748, prompt_n 5" in captions[7]
    assert all(isinstance(s.state, SaveRestoreState) for s in history.steps)


def test_each_step_draws_what_the_servers_and_the_file_hold(history):
    steps = history.steps
    start = slot_file_spec(steps[0].state)
    assert all(not t["y"] for t in start["data"] if t["type"] == "bar")  # nothing held anywhere yet
    assert [t["name"] for t in start["data"] if t["showlegend"]] == [  # the same legend at every step
        "the saved prefix's tokens", "tokens after the prefix", "reused from the slot (cache_n)",
        "evaluated (prompt_n)"]  # fmt: skip
    saved = slot_file_spec(steps[3].state)
    assert bars(saved, "the saved prefix")["slot file"] == (0, 748)
    assert bars(saved, "the saved prefix")["server 1 · slot 0"] == (0, 748)
    assert bars(saved, "evaluated")["server 1 · last request"] == (0, 748)
    stopped = slot_file_spec(steps[4].state)
    assert "server 1 · slot 0" not in bars(stopped, "the saved prefix") and "server 1: stopped" in str(
        stopped["layout"]["title"]["text"]
    )
    reused = slot_file_spec(steps[-1].state)
    assert bars(reused, "reused")["server 2 · last request"] == (0, 748)
    assert bars(reused, "evaluated")["server 2 · last request"] == (748, 753)
    assert bars(reused, "tokens after")["server 2 · slot 0"] == (748, 753)
    assert reused["layout"]["yaxis"]["categoryarray"] == list(ROWS)


def test_animation_and_stepper_share_the_axes(history):
    fig = slot_file_animation(history, title="Part one")
    assert len(fig.frames) == len(history.steps)
    ranges = {tuple(f.layout.xaxis.range) for f in fig.frames if f.layout.xaxis.range is not None}
    assert len(ranges) <= 1
    stepper = slot_file_stepper(history)
    first, last = stepper.spec(0, 0), stepper.spec(0, -1)
    assert first["layout"]["xaxis"]["range"] == last["layout"]["xaxis"]["range"]
    stepper.go_to(-1)
    assert "slot 0 keeps 753 tokens" in stepper.caption.value
    assert slot_file_figure(history.steps[-1].state).data


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda h: slot_file_spec("state"), "must be a SaveRestoreState"),
        (lambda h: slot_file_spec(h.steps[0].state, x_max=0), "x_max"),
        (lambda h: slot_file_spec(h.steps[0].state, previous=3), "previous must be a SaveRestoreState"),
        (lambda h: slot_file_animation([]), "empty"),
        (lambda h: slot_file_animation(["x"]), "SaveRestoreState"),
        (lambda h: slot_file_stepper(42), "History"),
        (lambda h: save_restore_history(prefix="abc"), "prefix"),
        (lambda h: save_restore_history(new=[-1]), "new"),
    ],
)
def test_bad_input_is_refused_with_kvlab_errors(history, call, words):
    with pytest.raises(InvalidArgumentError, match=words):
        call(history)
