"""Live widgets for a running kernel: a stepper over a recorded history, and a playground.

``Stepper`` puts a slider, back / forward / play buttons and a caption above
one or more plotly ``FigureWidget``s. Moving the slider does not rebuild the
figures: the view's spec for the new snapshot is compared with the one on
screen, and only the trace and layout properties that changed are sent, in one
``batch_update`` per figure. The slider takes the arrow keys once it has focus.

``Playground`` lets a student drive a block pool or a prefix cache by hand
(allocate, append, fork, free), watch the pool, the block tables and the free
queue change, and export what they did as a replay scenario. Bad input shows
as a message in the widget; nothing is raised into the notebook.

Widgets need a kernel; for exported HTML use ``kvlab.views.animations``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
from plotly.basedatatypes import Undefined

from kvlab.core.snapshots import BlockPoolState, ContiguousState, History, RadixState
from kvlab.errors import InvalidArgumentError, KvlabError, OutOfBlocksError, ScenarioError, check_int
from kvlab.views._common import Spec, steps_of, title_lines
from kvlab.views.animations import step_caption
from kvlab.views.figures import VIEW_SPECS, block_pool_spec, free_queue_spec, view_hints
from kvlab.views.text import caption

ViewFn = Callable[[Any, Any], Any]

#: The views a stepper shows by default for each kind of snapshot.
DEFAULT_VIEWS: dict[type, tuple[str, ...]] = {
    ContiguousState: ("contiguous",),
    BlockPoolState: ("block_pool", "free_queue"),
    RadixState: ("radix",),
}

#: ``stepper(history, kind)`` kinds and the views they show.
KINDS: dict[str, tuple[str, ...]] = {
    "contiguous": ("contiguous",),
    "block_pool": ("block_pool",),
    "paged": ("block_pool",),
    "free_queue": ("free_queue",),
    "prefix_cache": ("block_pool", "free_queue"),
    "radix": ("radix",),
}


# ---------------------------------------------------------------------- updating a figure in place


def _as_spec(figure: Any) -> Spec:
    if isinstance(figure, go.Figure):
        return figure.to_plotly_json()
    if isinstance(figure, dict) and "data" in figure:
        return {"data": list(figure["data"]), "layout": dict(figure.get("layout", {}))}
    raise InvalidArgumentError(
        f"a view must return a plotly go.Figure or a {{'data': ..., 'layout': ...}} dict, got {type(figure).__name__}"
    )


def _changed(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``new`` whose values differ from ``old``, and keys ``old`` had that ``new`` lacks (as None)."""
    out = {k: v for k, v in new.items() if old.get(k, _MISSING) != v}
    out.update({k: None for k in old if k not in new})
    return out


_MISSING = object()


def _fast_array(value: Any) -> Any:
    """A 2-D list (a heatmap's z, text or hover text) as a numpy array.

    plotly validates and serialises nested Python lists element by element;
    a numpy array goes through in one piece, which is most of a step's cost
    on a large pool. Gaps (None) become NaN in numbers and "" in text.
    """
    if not (isinstance(value, list) and value):
        return value
    if not isinstance(value[0], list):  # a long 1-D list of numbers with None gaps (outlines, crosses)
        if len(value) > 16 and all(v is None or isinstance(v, (int, float)) for v in value):
            return np.array([np.nan if v is None else v for v in value], dtype=float)
        return value
    flat = [v for row in value for v in row if v is not None]
    if flat and all(isinstance(v, (int, float)) for v in flat):
        return np.array(value, dtype=float)
    if all(isinstance(v, str) for v in flat):
        return np.array([[v if v is not None else "" for v in row] for row in value], dtype=object)
    return value


class LiveFigure:
    """A ``FigureWidget`` plus the spec it shows, updated in place with only what changed.

    ``show`` sends one ``plotly_update`` message holding just the trace
    properties and layout keys that differ from what is on screen. The values
    come from a spec the view builder made the same way as the figure's first
    one, so they skip plotly's per-property validation, which would otherwise
    cost more than drawing the step.
    """

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.widget = go.FigureWidget(spec)
        self.updates = 0  # properties sent by the last show(), for tests and the benchmark

    def show(self, spec: Spec) -> None:
        old = self.spec
        fw = self.widget
        same_shape = len(old["data"]) == len(spec["data"]) and all(
            a.get("type") == b.get("type") for a, b in zip(old["data"], spec["data"], strict=True)
        )
        if not same_shape:  # a different set of traces: start over
            with fw.batch_update():
                fw.data = []
                fw.add_traces(spec["data"])
                fw.layout = spec["layout"]
            self.spec = spec
            self.updates = len(spec["data"]) + len(spec["layout"])
            return
        per_trace = [_changed(before, after) for before, after in zip(old["data"], spec["data"], strict=True)]
        indexes = [i for i, diff in enumerate(per_trace) if diff]
        restyle: dict[str, list[Any]] = {}
        for position, i in enumerate(indexes):
            for key, value in per_trace[i].items():
                column = restyle.setdefault(key, [Undefined] * len(indexes))
                column[position] = _fast_array(value)
        relayout: dict[str, Any] = {}
        for key, value in _changed(old["layout"], spec["layout"]).items():
            before = old["layout"].get(key)
            if isinstance(value, dict) and isinstance(before, dict) and not set(before) - set(value):
                for sub, sub_value in _changed(before, value).items():
                    relayout[f"{key}.{sub}"] = sub_value
            else:
                relayout[key] = value
        if restyle or relayout:
            fw.plotly_update(restyle_data=restyle or None, relayout_data=relayout or None,
                             trace_indexes=indexes or None)  # fmt: skip
        self.spec = spec
        self.updates = sum(len(d) for d in per_trace) + len(relayout)


# ---------------------------------------------------------------------- stepper


class Stepper(widgets.VBox):
    """Step through a recorded history: slider, back / forward / play, caption, linked figures.

    ``views`` is one view name or a list of them (``contiguous``,
    ``block_pool``, ``free_queue``, ``radix``), or callables
    ``view(state, previous) -> go.Figure``; by default the views that suit the
    history's snapshots. ``highlight=(request_id, position)`` is passed to the
    block-pool view.
    """

    def __init__(
        self,
        history: object,
        views: str | Sequence[str | ViewFn] | None = None,
        *,
        highlight: tuple[str, int] | None = None,
        interval_ms: int = 900,
    ) -> None:
        steps = steps_of(history)
        kinds = {type(s) for _, s in steps}
        if len(kinds) != 1:
            raise InvalidArgumentError(
                f"a history must hold one kind of snapshot, found {', '.join(sorted(k.__name__ for k in kinds))}"
            )
        state_type = kinds.pop()
        check_int("interval_ms", interval_ms, minimum=1)
        self.steps = steps
        self.states = [s for _, s in steps]
        self.captions = [c for c, _ in steps]
        self._views = self._resolve_views(views, state_type, highlight)
        self._cache: dict[tuple[int, int], Spec] = {}
        self.figures = [LiveFigure(self.spec(v, 0)) for v in range(len(self._views))]
        n = len(steps)
        self.slider = widgets.IntSlider(
            value=0, min=0, max=n - 1, step=1, description="step", continuous_update=True,
            readout=True, layout=widgets.Layout(width="420px"),
        )  # fmt: skip
        self.play = widgets.Play(value=0, min=0, max=n - 1, step=1, interval=interval_ms, description="play",
                                 show_repeat=False, layout=widgets.Layout(width="120px"))  # fmt: skip
        widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.back = widgets.Button(
            description="◀ back", tooltip="previous step", layout=widgets.Layout(width="90px")
        )
        self.forward = widgets.Button(description="forward ▶", tooltip="next step",
                                      layout=widgets.Layout(width="100px"))  # fmt: skip
        self.caption = widgets.HTML()
        self.back.on_click(lambda _: self.step(-1))
        self.forward.on_click(lambda _: self.step(+1))
        self.slider.observe(self._on_slider, names="value")
        # the row wraps (slider under the buttons) in a narrow notebook instead of running off the edge
        controls = widgets.HBox(
            [self.back, self.play, self.forward, self.slider], layout=widgets.Layout(flex_flow="row wrap")
        )
        super().__init__([controls, self.caption, *(f.widget for f in self.figures)])
        self._show(0)

    # -- views

    def _resolve_views(
        self, views: object, state_type: type, highlight: object
    ) -> list[tuple[str, ViewFn, dict]]:
        if views is None:
            views = DEFAULT_VIEWS.get(state_type)
            if views is None:
                raise InvalidArgumentError(
                    f"no default view for {state_type.__name__}; pass views= as callables (state, previous) -> figure"
                )
        if isinstance(views, str) or callable(views):
            views = [views]
        if not isinstance(views, Sequence) or not views:
            raise InvalidArgumentError("views must be a view name, a callable, or a non-empty list of them")
        out: list[tuple[str, ViewFn, dict]] = []
        for v in views:
            if callable(v):
                out.append((getattr(v, "__name__", "view"), v, {}))
                continue
            if v not in VIEW_SPECS:
                raise InvalidArgumentError(
                    f"unknown view {v!r}: use one of {', '.join(VIEW_SPECS)}, or a callable"
                )
            wanted, spec_fn = VIEW_SPECS[v]
            if not issubclass(state_type, wanted):
                raise InvalidArgumentError(
                    f"view {v!r} draws {wanted.__name__} snapshots, but this history holds {state_type.__name__}"
                )
            hints = view_hints(v, self.states)
            count = len(self.states)
            hints["head_lines"] = max(
                title_lines(step_caption(i, count, c)) for i, c in enumerate(self.captions)
            )
            hints["sub_lines"] = 2
            if v == "block_pool":
                hints.update(highlight=highlight, strict=False)
                if highlight is not None:
                    hints["sub_lines"] = 3  # the token's translation takes a line of its own
            out.append((v, spec_fn, hints))
        return out

    def spec(self, view: int, index: int) -> Spec:
        """The spec view number ``view`` shows at step ``index`` (what the figure holds after a step)."""
        key = (view, index)
        if key not in self._cache:
            name, fn, hints = self._views[view]
            state = self.states[index]
            previous = self.states[index - 1] if index > 0 else None
            if name in VIEW_SPECS:
                caption = step_caption(index, len(self.states), self.captions[index])
                self._cache[key] = fn(state, previous, caption=caption, **hints)
            else:
                self._cache[key] = _as_spec(fn(state, previous))
        return self._cache[key]

    # -- stepping

    @property
    def index(self) -> int:
        return int(self.slider.value)

    def go_to(self, index: int) -> None:
        """Show step ``index`` (negative counts from the end)."""
        check_int("index", index)
        n = len(self.states)
        if not -n <= index < n:
            raise InvalidArgumentError(f"step {index} does not exist: the history has steps 0..{n - 1}")
        self.slider.value = index % n

    def step(self, delta: int) -> None:
        """Move ``delta`` steps, stopping at either end."""
        self.slider.value = min(max(self.index + delta, 0), len(self.states) - 1)

    def _on_slider(self, change: dict[str, Any]) -> None:
        self._show(int(change["new"]))

    def _show(self, index: int) -> None:
        for v, fig in enumerate(self.figures):
            fig.show(self.spec(v, index))
        self.caption.value = (f"<b>{html.escape(step_caption(index, len(self.states), ''))}</b>"
                              f"{html.escape(self.captions[index])}")  # fmt: skip
        self.back.disabled = index == 0
        self.forward.disabled = index == len(self.states) - 1


def stepper(history: object, kind: str | None = None, **options: Any) -> Stepper:
    """A ``Stepper`` with the views for ``kind`` (``contiguous``, ``block_pool``, ``free_queue``,
    ``prefix_cache``, ``radix``); without ``kind``, the views that suit the snapshots."""
    if kind is None:
        return Stepper(history, **options)
    if kind not in KINDS:
        raise InvalidArgumentError(f"unknown kind {kind!r}: use one of {', '.join(KINDS)}")
    return Stepper(history, KINDS[kind], **options)


# ---------------------------------------------------------------------- playground

SHARED_PREFIX_START = 1000  # the shared "system prompt" is tokens 1000, 1001, ...
UNIQUE_START = 100_000  # every other token is fresh: 100000, 100001, ...
MODELS = ("prefix-cache", "block-pool")


class Playground(widgets.VBox):
    """Drive a block pool or a prefix cache by hand and watch the pool, the tables and the free queue.

    ``model="prefix-cache"`` is ``kvlab.models.prefix_cache.PrefixCache`` (vLLM's
    lazy eviction, free queue, hits); its scenario is exactly the replay CLI's
    JSON (``python -m kvlab replay prefix-cache``). ``model="block-pool"`` is
    ``kvlab.models.paged.BlockPool`` with prefix sharing, fork and copy-on-write. The
    replay CLI has no block-pool model (and no fork), so a block-pool scenario
    says so: it carries ``"model": "block-pool"`` beside ``config`` and
    ``ops``, the CLI refuses it, and it replays here instead
    (``Playground.from_scenario`` or the widget's *replay JSON* button).

    Allocated prompts are the first ``prefix`` tokens of one shared prompt
    (1000, 1001, ...) followed by fresh tokens, so two requests with a prefix
    share exactly that prefix. Every operation the model carries out is
    recorded, and so is one the pool refuses for want of free blocks (an
    ``alloc`` or ``append`` that changes nothing): the replay CLI reports it
    as ``"ok": false``, so the scenario replays exactly as it was played. Bad
    input (an unknown request, a duplicate id) is shown and not recorded.
    """

    def __init__(
        self,
        model: str = "prefix-cache",
        *,
        num_blocks: int = 12,
        block_size: int = 4,
        null_block: bool = False,
        hash_scheme: str = "lesson",
    ) -> None:
        if model not in MODELS:
            raise InvalidArgumentError(f"unknown model {model!r}: use one of {', '.join(MODELS)}")
        check_int("num_blocks", num_blocks, minimum=1)
        check_int("block_size", block_size, minimum=1)
        if not isinstance(null_block, bool):
            raise InvalidArgumentError(f"null_block must be True or False, got {null_block!r}")
        if null_block and model != "prefix-cache":
            raise InvalidArgumentError("null_block is a prefix-cache option (vLLM's reserved block 0)")
        self.model_name = model
        if model == "prefix-cache":
            self.config: dict[str, Any] = {"block_size": block_size, "num_blocks": num_blocks,
                                           "null_block": null_block, "hash": hash_scheme}  # fmt: skip
        else:
            self.config = {"block_size": block_size, "num_blocks": num_blocks, "share_prefixes": True,
                           "hash": hash_scheme}  # fmt: skip
        self.model = _build_model(model, self.config)  # validates the config
        self.ops: list[dict[str, Any]] = []
        #: why the pool refused the op at each index of ``ops`` that it refused (recorded, ok: false)
        self.refused: dict[int, str] = {}
        self._next_token = UNIQUE_START
        self._build_widgets()
        self._refresh()

    # -- public API (also what the buttons call)

    @property
    def history(self) -> History[BlockPoolState]:
        history = self.model.history
        assert history is not None
        return history

    @property
    def state(self) -> BlockPoolState:
        return self.history[-1].state

    def allocate(self, request: str, num_tokens: int, prefix: int = 0, cache_salt: str | None = None) -> bool:
        """A new request of ``num_tokens`` tokens whose first ``prefix`` come from the shared prompt.

        Returns False when the pool refused it (not enough free blocks): the
        refusal is recorded, as the replay CLI's ``"ok": false``, and nothing else changes.
        """
        check_int("num_tokens", num_tokens, minimum=1)
        check_int("prefix", prefix, minimum=0)
        if prefix > num_tokens:
            raise InvalidArgumentError(
                f"the shared prefix ({prefix}) cannot be longer than the request ({num_tokens})"
            )
        if cache_salt is not None and self.model_name != "prefix-cache":
            raise InvalidArgumentError("cache_salt is a prefix-cache option; the block pool has none")
        tokens = list(range(SHARED_PREFIX_START, SHARED_PREFIX_START + prefix)) + self._fresh(
            num_tokens - prefix
        )
        if not tokens:
            raise InvalidArgumentError("a request needs at least one token")
        op: dict[str, Any] = {"op": "alloc", "req": request, "tokens": tokens}
        if cache_salt:
            op["cache_salt"] = cache_salt
        return self.apply(op)

    def append(self, request: str, num_tokens: int) -> bool:
        """Decode ``num_tokens`` fresh tokens into ``request``; False (recorded) when the pool refused."""
        check_int("num_tokens", num_tokens, minimum=1)
        return self.apply({"op": "append", "req": request, "tokens": self._fresh(num_tokens)})

    def fork(self, parent: str, child: str) -> bool:
        """Start ``child`` sharing all of ``parent``'s blocks (block pool only)."""
        return self.apply({"op": "fork", "req": parent, "child": child})

    def free(self, request: str) -> bool:
        """``request`` finished: release its blocks."""
        return self.apply({"op": "free", "req": request})

    def apply(self, op: dict[str, Any]) -> bool:
        """Apply one scenario op to the model and record it; True when the model carried it out.

        An ``alloc`` or ``append`` the pool refuses for want of free blocks
        changes nothing but is recorded (the replay CLI reports it as
        ``"ok": false``) and returns False; its reason is in ``refused``. Any
        other failure raises a KvlabError and records nothing.
        """
        reason = _apply_op(self.model_name, self.model, op, len(self.ops))
        if reason is not None:
            self.refused[len(self.ops)] = reason
        self.ops.append(op)
        if op["op"] in ("alloc", "append", "probe"):
            self._next_token = max(self._next_token, max(op["tokens"]) + 1)
        self._refresh()
        return reason is None

    def undo(self) -> None:
        """Take back the last operation, carried out or refused (the model is rebuilt from the others)."""
        if not self.ops:
            raise InvalidArgumentError("nothing to undo")
        ops = self.ops[:-1]
        self.model = _build_model(self.model_name, self.config)
        self.ops = []
        self.refused = {}
        for op in ops:
            self.apply(op)
        self._refresh()

    def scenario(self) -> dict[str, Any]:
        """What was done, refusals included, as ``{"config": ..., "ops": [...]}``.

        For the prefix cache that is exactly the replay CLI's JSON. A
        block-pool scenario also says ``"model": "block-pool"``: the CLI has no
        such model, so it refuses the file, and ``Playground.from_scenario``
        replays it.
        """
        out: dict[str, Any] = {"config": dict(self.config), "ops": [dict(op) for op in self.ops]}
        if self.model_name != "prefix-cache":
            out = {"model": self.model_name, **out}
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.scenario(), indent=indent)

    def load(self, scenario: dict[str, Any] | str) -> None:
        """Replace what was done by ``scenario`` (a dict or its JSON), replaying its ops; all or nothing.

        Ops the pool refuses are kept as refusals, as the replay CLI does.
        """
        model, config, ops = _parse_scenario(scenario)
        if model is not None and model != self.model_name:
            raise ScenarioError(
                f"this is a {model} scenario and this playground runs the {self.model_name} model: "
                f"replay it with Playground.from_scenario(scenario), which picks the model"
            )
        fresh = _build_model(self.model_name, config)
        refused = {}
        for i, op in enumerate(ops):
            reason = _apply_op(self.model_name, fresh, op, i)
            if reason is not None:
                refused[i] = reason
        self.config = dict(config)
        self.model = fresh
        self.ops = [dict(op) for op in ops]
        self.refused = refused
        tokens = [t for op in ops for t in op.get("tokens", [])]
        self._next_token = max([UNIQUE_START, *(t + 1 for t in tokens)])
        self._refresh()

    @classmethod
    def from_scenario(cls, scenario: dict[str, Any] | str, model: str | None = None) -> Playground:
        """A playground that has replayed ``scenario``.

        ``model`` defaults to the scenario's own ``"model"`` field, and to
        ``"prefix-cache"`` (the replay CLI's JSON) when it has none.
        """
        named, config, _ = _parse_scenario(scenario)
        if model is not None and named is not None and model != named:
            raise ScenarioError(f"the scenario is for the {named} model, not {model}")
        model = model or named or "prefix-cache"
        if model not in MODELS:
            raise InvalidArgumentError(f"unknown model {model!r}: use one of {', '.join(MODELS)}")
        pg = cls(model, num_blocks=_cfg_int(config, "num_blocks"), block_size=_cfg_int(config, "block_size"))
        pg.load(scenario)
        return pg

    def stepper(self) -> Stepper:
        """A stepper over everything done so far (refused ops changed nothing, so they have no step)."""
        return Stepper(self.history)

    def log(self) -> list[str]:
        """One line per recorded op: the model's caption, or why the pool refused it."""
        captions = iter(caption(step) for step in self.history.steps[1:])
        out = []
        for i, op in enumerate(self.ops):
            if i in self.refused:
                what = f"{op['op']} {op.get('req', '')}".strip()
                out.append(f"refused ({what}; replays as ok: false): {self.refused[i]}")
            else:
                out.append(next(captions, op["op"]))
        return out

    # -- widgets

    def _build_widgets(self) -> None:
        w = widgets
        small = w.Layout(width="170px")
        self.new_id_box = w.Text(
            value="A",
            description="new id",
            layout=small,
            tooltip="id of the request that allocate (or fork) creates",
        )
        self.request_pick = w.Dropdown(
            options=[],
            description="request",
            layout=small,
            tooltip="the running request that append, fork and free act on",
        )
        self.tokens_box = w.BoundedIntText(value=2 * self.config["block_size"] + 1, min=1, max=1_000_000,
                                           description="tokens", layout=small)  # fmt: skip
        self.prefix_box = w.BoundedIntText(
            value=0,
            min=0,
            max=1_000_000,
            description="shared",
            layout=small,
            tooltip="how many leading tokens come from the shared prompt",
        )
        self.salt_box = w.Text(value="", description="salt", placeholder="none", layout=small,
                               disabled=self.model_name != "prefix-cache")  # fmt: skip
        for box in (self.new_id_box, self.request_pick, self.tokens_box, self.prefix_box, self.salt_box):
            box.style.description_width = "60px"
        fork_help = (
            "start 'new id' sharing all blocks of 'request'"
            if self.model_name == "block-pool"
            else "fork is a block-pool operation (vLLM's prefix cache shares through hits instead)"
        )
        self.buttons = {
            "allocate": w.Button(description="allocate", button_style="primary",
                                 tooltip="a new request 'new id' of 'tokens' tokens; the first 'shared' come from "
                                         "the shared prompt"),
            "append": w.Button(description="append", tooltip="decode 'tokens' more tokens into 'request'"),
            "fork": w.Button(description="fork", tooltip=fork_help, disabled=self.model_name != "block-pool"),
            "free": w.Button(description="free", tooltip="'request' finished: release its blocks"),
            "undo": w.Button(description="undo", tooltip="take back the last operation"),
        }  # fmt: skip
        for name, button in self.buttons.items():
            button.layout = w.Layout(width="90px")
            button.on_click(lambda _, name=name: self._on_button(name))
        self.message = w.HTML()
        self.log_view = w.HTML()
        self.scenario_box = w.Textarea(placeholder='{"config": {...}, "ops": [...]}',
                                       layout=w.Layout(width="100%", height="110px"))  # fmt: skip
        self.export_button = w.Button(description="export JSON", tooltip="write the scenario into the box")
        self.replay_button = w.Button(
            description="replay JSON", tooltip="replace everything by the box's scenario"
        )
        self.export_button.on_click(lambda _: self._guard(self._export))
        self.replay_button.on_click(lambda _: self._guard(self._replay))
        self.pool_figure = LiveFigure(self._pool_spec())
        self.queue_figure = LiveFigure(self._queue_spec())
        wrap = w.Layout(flex_flow="row wrap")  # rows wrap in a narrow notebook
        fields = w.VBox([w.HBox([self.new_id_box, self.tokens_box, self.prefix_box, self.salt_box], layout=wrap),
                         w.HBox([self.request_pick, *self.buttons.values()], layout=wrap)])  # fmt: skip
        scenario = w.Accordion(
            [w.VBox([self.scenario_box, w.HBox([self.export_button, self.replay_button])])]
        )
        scenario.set_title(0, "scenario (replay JSON)")
        super().__init__([fields, self.message, self.pool_figure.widget, self.queue_figure.widget, self.log_view,
                          scenario])  # fmt: skip

    # two title and two subtitle lines always, so that the plots do not move as captions change length
    def _pool_spec(self) -> Spec:
        return block_pool_spec(self.state, caption=self._caption("Block pool"), head_lines=2, sub_lines=2)

    def _queue_spec(self) -> Spec:
        previous = self.history[-2].state if len(self.history) > 1 else None
        title = "Free queue" if self.model_name == "prefix-cache" else "Free list"
        return free_queue_spec(self.state, previous, caption=self._caption(title), head_lines=2, sub_lines=2)

    def _caption(self, what: str) -> str:
        step = self.history[-1]
        return f"{what} · {caption(step)}" if step.index else what

    def _refresh(self) -> None:
        if not hasattr(self, "pool_figure"):
            return
        self.pool_figure.show(self._pool_spec())
        self.queue_figure.show(self._queue_spec())
        lines = [f"{i + 1}. {html.escape(text)}" for i, text in enumerate(self.log())]
        self.log_view.value = "<b>operations</b><br>" + ("<br>".join(lines) if lines else "none yet")
        live = [rid for rid, _ in self.state.tables]
        current = self.request_pick.value
        self.request_pick.options = live
        last = next(
            (op.get("child", op["req"]) for op in reversed(self.ops) if op["op"] in ("alloc", "fork")), None
        )
        if current in live:
            self.request_pick.value = current
        elif last in live:
            self.request_pick.value = last
        used = {op[k] for op in self.ops for k in ("req", "child") if k in op}
        if self.new_id_box.value.strip() in used or not self.new_id_box.value.strip():
            self.new_id_box.value = _next_id(used)

    def _on_button(self, name: str) -> None:
        def run() -> None:
            new_id = self.new_id_box.value.strip()
            req = self.request_pick.value
            if name in ("append", "fork", "free") and not req:
                raise InvalidArgumentError(f"no running request to {name}: allocate one first")
            if name == "allocate":
                salt = self.salt_box.value.strip() or None
                if self.allocate(new_id, int(self.tokens_box.value), int(self.prefix_box.value), salt):
                    self.request_pick.value = new_id
                    self._say(f"allocated {new_id!r}: {caption(self.history[-1])}", ok=True)
                else:
                    self._say_refused()
            elif name == "append":
                if self.append(req, int(self.tokens_box.value)):
                    self._say(caption(self.history[-1]), ok=True)
                else:
                    self._say_refused()
            elif name == "fork":
                self.fork(req, new_id)
                self._say(caption(self.history[-1]), ok=True)
            elif name == "free":
                self.free(req)
                self._say(caption(self.history[-1]), ok=True)
            else:
                self.undo()
                self._say("took back the last operation", ok=True)

        self._guard(run)

    def _guard(self, action: Callable[[], None]) -> None:
        """Run a button's action; a failure becomes a message in the widget, never a traceback."""
        try:
            action()
        except KvlabError as exc:
            self._say(str(exc), ok=False)
        except Exception as exc:  # noqa: BLE001 - a student's click must never print a traceback
            self._say(f"unexpected {type(exc).__name__}: {exc}", ok=False)

    def _say(self, text: str, *, ok: bool) -> None:
        color = "#0072B2" if ok else "#D55E00"
        icon = "✓" if ok else "✗"
        self.message.value = f"<span style='color:{color}'>{icon} {html.escape(text)}</span>"

    def _say_refused(self) -> None:
        reason = self.refused[len(self.ops) - 1]
        self._say(f"{reason} (recorded: the scenario replays it as ok: false; undo takes it back)", ok=False)

    def _export(self) -> None:
        self.scenario_box.value = self.to_json(indent=1)
        refused = f", {len(self.refused)} refused (ok: false)" if self.refused else ""
        if self.model_name == "prefix-cache":
            self._say(f"exported {len(self.ops)} ops{refused}; replay with: python -m kvlab replay prefix-cache",
                      ok=True)  # fmt: skip
        else:
            self._say(f"exported {len(self.ops)} ops{refused}. This is a block-pool scenario (\"model\": "
                      "\"block-pool\"): the replay CLI has no block-pool model and no fork, so it will refuse "
                      "the file; replay it here with Playground.from_scenario(json) or the replay JSON button",
                      ok=True)  # fmt: skip

    def _replay(self) -> None:
        self.load(self.scenario_box.value)
        self._say(f"replayed {len(self.ops)} ops", ok=True)

    def _fresh(self, n: int) -> list[int]:
        """``n`` token ids no op has used yet (the counter moves only when an op succeeds)."""
        return list(range(self._next_token, self._next_token + n))


def _next_id(used: set[str]) -> str:
    for i in range(26 * 27):
        name = chr(65 + i % 26) + (str(i // 26) if i >= 26 else "")
        if name not in used:
            return name
    return f"R{len(used)}"


def _cfg_int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScenarioError(f"config '{key}' must be an integer >= 1, got {value!r}")
    return value


def _parse_scenario(scenario: object) -> tuple[str | None, dict[str, Any], list[dict[str, Any]]]:
    """(the scenario's "model" field or None, config, ops); the rest is checked as the replay CLI does."""
    from kvlab.cli.replay import load_scenario

    if isinstance(scenario, dict):
        scenario = json.dumps(scenario)
    elif not isinstance(scenario, str):
        raise ScenarioError(
            f'a scenario is a dict or JSON text {{"config": ..., "ops": [...]}}, got {type(scenario).__name__}'
        )
    model, config, ops = load_scenario(scenario)
    if model is not None and model not in MODELS:
        raise ScenarioError(f"unknown scenario model {model!r}: use one of {', '.join(MODELS)}")
    return model, config, ops


def _build_model(model: str, config: dict[str, Any]) -> Any:
    """A recording model for ``config``; a bad config raises ScenarioError naming the key."""
    from kvlab.core.hashing import SCHEMES

    keys = {"prefix-cache": {"block_size", "num_blocks", "null_block", "hash"},
            "block-pool": {"block_size", "num_blocks", "share_prefixes", "hash"}}[model]  # fmt: skip
    unknown = sorted(set(config) - keys)
    if unknown:
        raise ScenarioError(f"unknown config key(s) {unknown}: {model} takes {', '.join(sorted(keys))}")
    num_blocks, block_size = _cfg_int(config, "num_blocks"), _cfg_int(config, "block_size")
    scheme = config.get("hash", "lesson")
    if scheme not in SCHEMES:
        raise ScenarioError(f"config 'hash' must be one of {', '.join(map(repr, SCHEMES))}, got {scheme!r}")
    for key in keys & {"null_block", "share_prefixes"}:
        if key in config and not isinstance(config[key], bool):
            raise ScenarioError(f"config '{key}' must be true or false, got {config[key]!r}")
    try:
        if model == "prefix-cache":
            from kvlab.models.prefix_cache import PrefixCache

            return PrefixCache(num_blocks, block_size, null_block=config.get("null_block", False),
                               hash_scheme=scheme, record=True)  # fmt: skip
        from kvlab.models.paged import BlockPool

        return BlockPool(num_blocks, block_size, share_prefixes=config.get("share_prefixes", True),
                         hash_scheme=scheme, record=True)  # fmt: skip
    except KvlabError as exc:
        raise ScenarioError(f"config: {exc}") from None


def _apply_op(model_name: str, model: Any, op: object, index: int) -> str | None:
    """Apply one op; None when done, the reason when the pool refused it for want of free blocks.

    A refused ``alloc`` or ``append`` changes nothing, as in the replay CLI,
    which reports it as ``"ok": false``. A bad op raises ScenarioError
    (naming its index) and changes nothing.
    """
    if not isinstance(op, dict):
        raise ScenarioError(f'each op must be an object like {{"op": "alloc", ...}}, got {op!r}', index)
    name = op.get("op")
    ops = {
        "prefix-cache": ("alloc", "append", "free", "probe"),
        "block-pool": ("alloc", "append", "fork", "free"),
    }
    if name not in ops[model_name]:
        raise ScenarioError(
            f"unknown op {name!r} for {model_name}: use one of {', '.join(ops[model_name])}", index
        )
    fields = {"alloc": {"req", "tokens", "cache_salt"}, "append": {"req", "tokens"}, "free": {"req"},
              "probe": {"tokens", "cache_salt"}, "fork": {"req", "child"}}[name]  # fmt: skip
    required = fields - {"cache_salt"}
    missing = sorted(required - set(op))
    extra = sorted(set(op) - fields - {"op"})
    if missing or extra:
        raise ScenarioError(
            f"{name} needs {sorted(required)}" + (f"; it does not take {extra}" if extra else ""), index
        )
    req = op.get("req")
    if "req" in op and (not isinstance(req, str) or not req):
        raise ScenarioError(f"the request id must be a non-empty string, got {req!r}", index)
    try:
        if name == "alloc" and model_name == "prefix-cache":
            model.allocate(req, op["tokens"], op.get("cache_salt"))
        elif name == "alloc":
            model.allocate(req, op["tokens"])
        elif name == "append":
            model.append(req, op["tokens"])
        elif name == "free":
            model.free(req)
        elif name == "probe":
            model.probe(op["tokens"], op.get("cache_salt"))
        else:
            model.fork(req, op["child"])
    except OutOfBlocksError as exc:
        if name in ("alloc", "append"):
            return str(exc)
        raise ScenarioError(str(exc), index) from None
    except KvlabError as exc:
        raise ScenarioError(str(exc), index) from None
    return None
