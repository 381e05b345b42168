"""Example 13's step-by-step view: each turn's prompt, split into cached and processed tokens, per policy.

``kvlab.server.agents.run_agent`` returns per-turn records (``AgentTurn``) rather than
a history, so ``agent_turns_history(runs)`` first lines the runs up turn by
turn: step 0 is before the first turn, step k the state after turn k of every
policy at once (a ``kvlab.core.snapshots.AgentTurnsState``). It stays here, not in
a lesson module, because every entry point of this view takes runs and calls it. The figure has two panels:

* **this turn's prompt**, one bar per policy: the part the cache served (the
  common prefix with the previous prompt) and the part the server had to
  process. A policy that trims the front of its history shows a short cached
  part and a long processed part on every turn;
* **processed so far**, one bar per policy: the running total, on an axis wide
  enough for the largest total, so the gap between policies grows frame by frame.

``agent_turns_animation`` (plain plotly, plays in exported HTML) and
``agent_turns_stepper`` (a live widget) show the steps with the same axes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import plotly.graph_objects as go

from kvlab.core.snapshots import AgentTurnsState, Event, History
from kvlab.errors import InvalidArgumentError, check_int
from kvlab.server.agents import AgentRun
from kvlab.views import theme
from kvlab.views._common import (
    LABEL_WIDTH,
    Spec,
    base_layout,
    check_axis_max,
    check_title,
    read_pairs,
    steps_of,
    text_px,
    title_text,
)
from kvlab.views.animations import DEFAULT_FRAME_MS, animate, check_frames, step_caption
from kvlab.views.live import Stepper
from kvlab.views.text import caption

_ROW_PX = 46
_RIGHT = 30  # px right of the plots, where the longest total's label may run


def _runs(runs: object) -> list[tuple[str, AgentRun]]:
    if isinstance(runs, AgentRun):
        runs = [runs]
    if isinstance(runs, Mapping):
        pairs = [(str(k), v) for k, v in read_pairs("runs", runs)]
    elif isinstance(runs, Sequence) and not isinstance(runs, (str, bytes)):
        pairs = [(getattr(r, "name", f"run {i + 1}"), r) for i, r in enumerate(runs)]
    else:
        raise InvalidArgumentError(
            f"runs must be a kvlab.server.agents.AgentRun, a list of them or a dict name -> AgentRun, got {type(runs).__name__}"
        )
    if not pairs:
        raise InvalidArgumentError(
            "runs is empty: give at least one AgentRun (kvlab.server.agents.run_agent)"
        )
    for name, run in pairs:
        if not isinstance(run, AgentRun):
            raise InvalidArgumentError(
                f"{name!r} is a {type(run).__name__}, not a kvlab.server.agents.AgentRun"
            )
    lengths = {len(run.turns) for _, run in pairs}
    if len(lengths) != 1:
        raise InvalidArgumentError(
            f"the runs have different numbers of turns ({sorted(lengths)}); play the same turns"
        )
    return pairs


def agent_turns_history(
    runs: Mapping[str, AgentRun] | Sequence[AgentRun] | AgentRun,
) -> History[AgentTurnsState]:
    """The runs side by side, one step per turn (step 0: before the first turn)."""
    pairs = _runs(runs)
    names = tuple(n for n, _ in pairs)
    history: History[AgentTurnsState] = History()
    history.add(Event.of("agents.start"), AgentTurnsState(0, names, (None,) * len(names), (0,) * len(names)))
    totals = [0] * len(names)
    for k in range(len(pairs[0][1].turns)):
        current = tuple(run.turns[k] for _, run in pairs)
        totals = [t + c.processed_tokens for t, c in zip(totals, current, strict=True)]
        processed = tuple((n, c.processed_tokens) for n, c in zip(names, current, strict=True))
        history.add(Event.of("agents.turn", turn=k + 1, processed=processed),
                    AgentTurnsState(k + 1, names, current, tuple(totals)))  # fmt: skip
    return history


def _check_state(state: object) -> None:
    if not isinstance(state, AgentTurnsState):
        raise InvalidArgumentError(
            f"state must be an AgentTurnsState, got {type(state).__name__}; build them with agent_turns_history(runs)"
        )


#: Bar labels are 12 px text; a label needs this many px more than its text to sit clear of a bar's ends.
_LABEL_PX = 12
_LABEL_PAD = 8


@dataclass(frozen=True)
class _Bars:
    """The prompt panel's x scale: px per token at the width labels are fitted for, and the axis end."""

    px_per_token: float
    axis_end: float
    prefix: int | None

    def fits(self, text: str, a: float, b: float) -> bool:
        return text_px(text, _LABEL_PX) + _LABEL_PAD <= (b - a) * self.px_per_token

    def pieces(self, a: float, b: float) -> list[tuple[float, float]]:
        """[a, b], or its two sides where the fixed prefix's line crosses it, widest first."""
        p = self.prefix
        parts = [(a, b)] if not p or not a < p < b else [(a, p), (p, b)]
        return sorted(parts, key=lambda ab: ab[0] - ab[1])

    def inside(self, a: float, b: float, texts: Sequence[str]) -> tuple[float, str] | None:
        """(centre, text) of the first text that fits the bar [a, b] on one side of the prefix line."""
        for text in texts:
            for lo, hi in self.pieces(a, b):
                if self.fits(text, lo, hi):
                    return (lo + hi) / 2, text
        return None

    def outside(self, b: float, texts: Sequence[str]) -> tuple[float, str] | None:
        """(start, text) of the first text that fits right of a bar ending at ``b``, clear of the prefix line."""
        start = b + 3 / self.px_per_token
        for text in texts:
            end = start + (text_px(text, _LABEL_PX) + 2) / self.px_per_token
            clear = self.prefix is None or not start - 1 / self.px_per_token <= self.prefix <= end
            if end <= self.axis_end and clear:
                return start, text
        return None


def _prompt_scale(names: Sequence[str], prompt_max: int, prefix_tokens: int | None) -> tuple[int, _Bars]:
    """The left margin that holds the policy names, and the prompt panel's scale at ``LABEL_WIDTH`` px."""
    left = int(max(text_px(n, 13) for n in names)) + 16
    axis_end = prompt_max * 1.02
    width = LABEL_WIDTH - left - _RIGHT
    return left, _Bars(width / axis_end, axis_end, prefix_tokens)


def _label_trace(
    name: str, labels: list[tuple[float, str, str]], color: str, names: list[str]
) -> dict[str, Any]:
    """One text trace of the prompt panel: a label (x, text, text position) per policy, "" for none."""
    xs, texts, where = (list(column) for column in zip(*labels, strict=True))
    return {
        "type": "scatter", "mode": "text", "name": name, "x": xs, "y": names, "text": texts,
        "textposition": where, "textfont": {"size": _LABEL_PX, "color": color}, "hoverinfo": "skip",
        "showlegend": False, "cliponaxis": False, "xaxis": "x", "yaxis": "y",
    }  # fmt: skip


def _prompt_labels(state: AgentTurnsState, bars: _Bars) -> list[dict[str, Any]]:
    """The cached and processed parts' labels, placed where they can be read.

    Every label is the bare count, in the same form on every bar and frame
    (the legend says which colour is cached and which processed; a unit on
    some bars and not on others reads as two kinds of number). A label goes
    where its bar has room for it, on one side of the fixed prefix's line
    (never across it); a processed part too thin for it is labelled just right
    of the bar when there is room, else not at all (its hover still says it).
    """
    cached: list[tuple[float, str, str]] = []  # (x, text, text position) per policy
    processed: list[tuple[float, str, str]] = []
    for c in state.current:
        got = c.cached_tokens if c else 0
        new = c.processed_tokens if c else 0
        inside = bars.inside(0, got, [f"{got:,}"]) if got else None
        cached.append((*(inside or (0, "")), "middle center"))
        words = [f"{new:,}"]
        inside = bars.inside(got, got + new, words) if new else None
        outside = bars.outside(got + new, words) if new and inside is None else None
        processed.append((*(inside or outside or (0, "")), "middle right" if outside else "middle center"))
    names = list(state.names)
    return [
        _label_trace("cached labels", cached, "white", names),
        _label_trace("processed labels", processed, theme.INK, names),
    ]


def _turn_bars(state: AgentTurnsState) -> list[dict[str, Any]]:
    """This turn's prompt per policy (cached | processed), and the tokens processed so far."""
    names = list(state.names)
    cached = [c.cached_tokens if c else 0 for c in state.current]
    processed = [c.processed_tokens if c else 0 for c in state.current]
    return [
        {
            "type": "bar", "orientation": "h", "name": "from the cache (prefix shared with the last prompt)",
            "y": names, "x": cached, "marker": {"color": theme.BLUE, "line": {"color": "white", "width": 1}},
            "hovertemplate": "%{y}: %{x:,} tokens from the cache<extra></extra>", "xaxis": "x", "yaxis": "y",
        },
        {
            "type": "bar", "orientation": "h", "name": "processed this turn", "y": names, "x": processed,
            "marker": {"color": theme.ORANGE, "line": {"color": "white", "width": 1},
                       "pattern": {"shape": "/", "fgcolor": theme.INK, "fgopacity": 0.3, "size": 8}},
            "hovertemplate": "%{y}: %{x:,} tokens processed this turn<extra></extra>", "xaxis": "x", "yaxis": "y",
        },
        {
            "type": "bar", "orientation": "h", "name": "processed so far (all turns)", "y": names,
            "x": list(state.totals), "marker": {"color": theme.VERMILLION, "line": {"color": "white", "width": 1}},
            "text": [f"{t:,}" if t else "" for t in state.totals], "textposition": "auto",
            "textfont": {"color": theme.INK}, "cliponaxis": False,
            "hovertemplate": "%{y}: %{x:,} tokens processed in turns 1..%{meta}<extra></extra>", "meta": state.turn,
            "xaxis": "x2", "yaxis": "y2",
        },
    ]  # fmt: skip


def _panel_marks(
    state: AgentTurnsState, prefix_tokens: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(shapes, annotations): the two panels' headings and, with ``prefix_tokens``, the fixed prefix's end."""
    shapes = []
    if prefix_tokens:
        shapes.append({"type": "line", "xref": "x", "yref": "y domain", "x0": prefix_tokens, "x1": prefix_tokens,
                       "y0": 0, "y1": 1, "line": {"color": theme.INK, "dash": "dot", "width": 2}})  # fmt: skip
    annotations = [
        {"text": f"<b>turn {state.turn}'s prompt</b>" if state.turn else "<b>the prompt</b>", "xref": "paper",
         "yref": "paper", "x": 0, "y": 1, "yanchor": "bottom", "xanchor": "left", "showarrow": False},
        {"text": "<b>tokens processed so far</b>", "xref": "paper", "yref": "paper", "x": 0, "y": 0.42,
         "yanchor": "bottom", "xanchor": "left", "showarrow": False},
    ]  # fmt: skip
    if prefix_tokens:
        annotations.append({"text": "end of the fixed prefix", "x": prefix_tokens, "xref": "x", "y": 1,
                            "yref": "y domain", "yanchor": "bottom", "xanchor": "left", "showarrow": False,
                            "font": {"size": 11}})  # fmt: skip
    return shapes, annotations


def agent_turn_spec(
    state: AgentTurnsState,
    previous: AgentTurnsState | None = None,
    *,
    title: str | None = None,
    caption: str | None = None,
    prompt_max: int | None = None,
    total_max: int | None = None,
    prefix_tokens: int | None = None,
) -> Spec:
    """One turn of every policy as plain dicts: the prompt (cached | processed) and the running total."""
    _check_state(state)
    title = check_title(title)
    caption = check_title(caption)
    prompts = [c.prompt_tokens if c else 0 for c in state.current]
    if prompt_max is None:
        prompt_max = max(prompts)
    if total_max is None:
        total_max = max(state.totals)
    prompt_max = check_axis_max("prompt_max", prompt_max)
    total_max = check_axis_max("total_max", total_max)
    if prefix_tokens is not None:
        prefix_tokens = check_axis_max("prefix_tokens", prefix_tokens)
    names = list(state.names)
    left, bars = _prompt_scale(names, prompt_max, prefix_tokens)
    data = _turn_bars(state) + _prompt_labels(state, bars)
    shapes, annotations = _panel_marks(state, prefix_tokens)
    sub = "; ".join(f"{n}: prompt {p:,}" for n, p in zip(names, prompts, strict=True)) if state.turn else ""
    ttl = title_text(caption or title or "Agent turns: cached and processed tokens", sub or None)
    head, _, rest = ttl["text"].partition("</b>")
    top = 30 + 21 * (head.count("<br>") + 1) + 17 * rest.count("<br>") + 34
    panel = _ROW_PX * len(names)
    plot_h = int(panel / 0.4)
    layout = base_layout(
        ttl, barmode="stack", height=top + plot_h + 140, showlegend=True, shapes=shapes, annotations=annotations,
        xaxis={"range": [0, prompt_max * 1.02], "title": {"text": "prompt tokens", "standoff": 2},
               "anchor": "y"},
        yaxis={"domain": [0.58, 0.94], "autorange": "reversed", "automargin": True, "fixedrange": True},
        xaxis2={"range": [0, total_max * 1.1], "title": {"text": "tokens processed, turns so far", "standoff": 2},
                "anchor": "y2"},
        yaxis2={"domain": [0, 0.36], "autorange": "reversed", "automargin": True, "fixedrange": True},
        legend={"orientation": "h", "y": -52 / plot_h, "x": 0, "yanchor": "top", "traceorder": "normal"},
        margin={"l": left, "r": _RIGHT, "t": top, "b": 140},
    )  # fmt: skip
    return {"data": data, "layout": layout}


def agent_turns_hints(history: object) -> dict[str, int]:
    """The axes every step of an agent-turns history shares."""
    states = [s for _, s in steps_of(history, AgentTurnsState)]
    return {
        "prompt_max": max(max((c.prompt_tokens for c in s.current if c), default=0) for s in states) or 1,
        "total_max": max(max(s.totals) for s in states) or 1,
    }


def agent_turn_figure(
    runs: Mapping[str, AgentRun] | Sequence[AgentRun] | AgentRun,
    turn: int,
    *,
    prefix_tokens: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """One turn of the runs, on the axes of the whole run (``turn`` counts from 1)."""
    history = agent_turns_history(runs)
    check_int("turn", turn, minimum=1)
    if turn >= len(history):
        raise InvalidArgumentError(f"turn {turn} does not exist: the runs have turns 1..{len(history) - 1}")
    return go.Figure(
        agent_turn_spec(
            history[turn].state,
            title=title,
            caption=title or caption(history[turn]),
            prefix_tokens=prefix_tokens,
            **agent_turns_hints(history),
        )
    )


def agent_turns_animation(
    runs: Mapping[str, AgentRun] | Sequence[AgentRun] | AgentRun,
    *,
    prefix_tokens: int | None = None,
    title: str | None = None,
    frame_ms: int = DEFAULT_FRAME_MS,
) -> go.Figure:
    """The runs turn by turn, with play and a slider; works in exported HTML."""
    title = check_title(title)
    history = agent_turns_history(runs)
    check_frames(len(history.steps))  # before any frame is built
    hints = agent_turns_hints(history)
    steps = steps_of(history, AgentTurnsState)
    specs = []
    for i, (text, state) in enumerate(steps):
        head = step_caption(i, len(steps), text)
        specs.append(
            agent_turn_spec(
                state, caption=f"{title} · {head}" if title else head, prefix_tokens=prefix_tokens, **hints
            )
        )
    return animate(specs, [c for c, _ in steps], frame_ms=frame_ms)


def agent_turns_stepper(
    runs: Mapping[str, AgentRun] | Sequence[AgentRun] | AgentRun,
    *,
    prefix_tokens: int | None = None,
    interval_ms: int = 900,
) -> Stepper:
    """A ``Stepper`` over the runs' turns (needs a running kernel)."""
    history = agent_turns_history(runs)
    view = partial(_stepper_view, prefix_tokens=prefix_tokens, **agent_turns_hints(history))
    return Stepper(history, [view], interval_ms=interval_ms)


def _stepper_view(state: AgentTurnsState, previous: AgentTurnsState | None, **options: Any) -> Spec:
    return agent_turn_spec(state, previous, title="Agent turns: cached and processed tokens", **options)


_SPLIT_SIDES = 90  # px of the prompt-split figure's left and right margins


def _over_bar(count: int, slot_px: float) -> str:
    """The count over a bar: in full where it fits the bar's slot, else in thousands ("2k", "2.4k"), so
    that the labels of neighbouring bars never run into one another ("2,0002,000")."""
    full = f"{count:,}"
    if text_px(full, 10) + 3 <= slot_px or count < 1000:
        return full
    return f"{count / 1000:.1f}".removesuffix(".0") + "k"


def _split_panel(
    i: int, k: int, name: str, run: AgentRun, *, y1: float, height_each: float, ymax: int
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(bars and totals, axes, heading) of run number ``i`` of ``k``, its panel's top at paper ``y1``."""
    ax = "" if i == 0 else str(i + 1)
    turns = [t.turn for t in run.turns]
    slot_px = (LABEL_WIDTH - _SPLIT_SIDES) / (len(turns) + 0.2)  # the x range is [0.4, turns + 0.6]
    cached = [t.cached_tokens for t in run.turns]
    processed = [t.processed_tokens for t in run.turns]
    data: list[dict[str, Any]] = []
    for label, values, color, pattern in (
        ("from the cache", cached, theme.BLUE, ""),
        ("processed", processed, theme.ORANGE, "/"),
    ):
        data.append({
            "type": "bar", "x": turns, "y": values, "name": label, "legendgroup": label, "showlegend": i == 0,
            "marker": {"color": color, "line": {"color": "white", "width": 0.5},
                       "pattern": {"shape": pattern, "fgcolor": theme.INK, "fgopacity": 0.3, "size": 7}},
            "xaxis": f"x{ax}", "yaxis": f"y{ax}",
            "hovertemplate": f"{name}<br>turn %{{x}}: %{{y:,}} tokens {label}<extra></extra>",
        })  # fmt: skip
    data.append({
        "type": "scatter", "mode": "text", "x": turns, "y": [c + p for c, p in zip(cached, processed, strict=True)],
        "text": [_over_bar(p, slot_px) for p in processed], "textposition": "top center", "textfont": {"size": 10},
        "showlegend": False, "hoverinfo": "skip", "xaxis": f"x{ax}", "yaxis": f"y{ax}", "cliponaxis": False,
    })  # fmt: skip
    axes = {
        f"xaxis{ax}": {"anchor": f"y{ax}", "dtick": 1, "range": [0.4, len(turns) + 0.6],
                       "title": {"text": "turn", "standoff": 2} if i == k - 1 else None,
                       "matches": "x" if i else None},
        f"yaxis{ax}": {"domain": [y1 - height_each, y1], "anchor": f"x{ax}", "range": [0, ymax * 1.18],
                       "title": {"text": "prompt tokens"}, "matches": "y" if i else None},
    }  # fmt: skip
    heading = {
        "text": f"<b>{name}</b> · processed {run.total_processed:,} tokens, final prompt {run.final_prompt:,}",
        "xref": "paper", "yref": "paper", "x": 0, "y": y1, "xanchor": "left", "yanchor": "bottom",
        "showarrow": False,
    }  # fmt: skip
    return data, axes, heading


def prompt_split_figure(
    runs: Mapping[str, AgentRun] | Sequence[AgentRun] | AgentRun, *, title: str | None = None
) -> go.Figure:
    """Every turn's prompt split into cached and processed tokens: one panel per run, stacked, same axes.

    The numbers over the bars are the tokens processed on that turn; each
    panel's heading gives the run's total and its final prompt.
    """
    title = check_title(title)
    pairs = _runs(runs)
    k = len(pairs)
    panel_px, gap_px = 200, 60
    plot_h = panel_px * k + gap_px * (k - 1)
    gap, height_each = gap_px / plot_h, panel_px / plot_h
    ymax = max(t.prompt_tokens for _, run in pairs for t in run.turns)
    data: list[dict[str, Any]] = []
    axes: dict[str, Any] = {}
    annotations = []
    for i, (name, run) in enumerate(pairs):
        y1 = 1 - i * (height_each + gap)
        traces, panel_axes, heading = _split_panel(i, k, name, run, y1=y1, height_each=height_each, ymax=ymax)
        data += traces
        axes.update(panel_axes)
        annotations.append(heading)
    layout = base_layout(
        title_text(title or "Each turn's prompt: from the cache and processed",
                   "the number over each bar is what that turn processed"),
        barmode="stack", height=plot_h + 105 + 60, annotations=annotations,
        legend={"orientation": "h", "x": 1, "y": 1 + 30 / plot_h, "yanchor": "bottom", "xanchor": "right"},
        margin={"l": 70, "r": 20, "t": 105, "b": 60}, bargap=0.25, **axes,
    )  # fmt: skip
    return go.Figure({"data": data, "layout": layout})
