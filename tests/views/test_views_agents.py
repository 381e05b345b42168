"""kvlab.views.agents: the agent turns lined up step by step, the per-turn bars, bad input."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest

from kvlab.core.snapshots import AgentTurnsState
from kvlab.errors import InvalidArgumentError
from kvlab.lessons.ex13 import example_13
from kvlab.server.agents import KeepLast, run_agent
from kvlab.views.agents import (
    agent_turn_figure,
    agent_turn_spec,
    agent_turns_animation,
    agent_turns_history,
    agent_turns_stepper,
    prompt_split_figure,
)
from kvlab.views.text import caption


@pytest.fixture(scope="module")
def runs():
    return example_13()


def test_the_turns_history_lines_the_runs_up(runs):
    history = agent_turns_history(runs)
    assert len(history) == 21
    last = history[-1].state
    assert isinstance(last, AgentTurnsState) and last.turn == 20
    assert list(last.totals) == [r.total_processed for r in runs.values()] == [10000, 34000, 10300]
    assert "turn 13" in caption(history[13]) and "700 by append-only, one summary at 12" in caption(
        history[13]
    )


def test_a_turn_shows_cached_and_processed_tokens(runs):
    state = agent_turns_history(runs)[13].state
    spec = agent_turn_spec(state, prefix_tokens=2000)
    cached, processed, totals = (t["x"] for t in spec["data"][:3])
    assert cached == [6800, 2000, 2000] and processed == [400, 2000, 700]
    assert totals == [7200, 20000, 7500]
    assert [s["x0"] for s in spec["layout"]["shapes"]] == [2000]


def test_the_agent_animation_and_stepper(runs):
    fig = agent_turns_animation(runs, prefix_tokens=2000)
    assert len(fig.frames) == 21
    assert fig.layout.xaxis.range[1] == pytest.approx(10000 * 1.02)
    assert fig.layout.xaxis2.range[1] == pytest.approx(34000 * 1.1)
    json.loads(fig.to_json())
    s = agent_turns_stepper(runs)
    s.go_to(6)
    assert s.figures[0].spec["data"][1]["x"] == [400, 2000, 400]
    one = agent_turn_figure(runs, 6)
    assert isinstance(one, go.Figure) and list(one.data[1].x) == [400, 2000, 400]


def test_prompt_split_figure_has_one_panel_per_run(runs):
    fig = prompt_split_figure(runs)
    by_axis = {}
    for t in fig.data:
        if t.type == "bar":
            by_axis.setdefault(t.xaxis, {})[t.name] = list(t.y)
    keep = by_axis["x2"]
    assert keep["processed"] == [t.processed_tokens for t in runs["keep only the last 5 tool results"].turns]
    assert keep["from the cache"][5:] == [2000] * 15
    texts = [a.text for a in fig.layout.annotations]
    assert any("processed 34,000 tokens, final prompt 4,000" in t for t in texts)


def test_agent_view_rejects_bad_input(runs):
    with pytest.raises(InvalidArgumentError, match="different numbers of turns"):
        agent_turns_history([run_agent(KeepLast(5)), run_agent(KeepLast(5), turns=3)])
    with pytest.raises(InvalidArgumentError, match="not a kvlab.server.agents.AgentRun"):
        agent_turns_history({"x": [1, 2]})
    with pytest.raises(InvalidArgumentError, match="runs is empty"):
        prompt_split_figure({})
    with pytest.raises(InvalidArgumentError, match="turn 21 does not exist"):
        agent_turn_figure(runs, 21)
    with pytest.raises(InvalidArgumentError, match="AgentTurnsState"):
        agent_turn_spec("turn")


def test_prompt_labels_are_bare_counts_on_every_bar_and_frame(runs):
    # "4,400 cached" on one bar and a bare "2,000" on the next read as two kinds of number
    figure = agent_turns_animation(runs, prefix_tokens=2000)
    texts = [
        text
        for frame in figure.frames
        for trace in frame.data
        if trace.type == "scatter" and trace.name in ("cached labels", "processed labels")
        for text in trace.text
        if text
    ]
    assert "2,000" in texts and "400" in texts
    assert all(text.replace(",", "").isdigit() for text in texts)
