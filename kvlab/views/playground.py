"""The playground: drive a block pool or a prefix cache by hand in a running kernel.

``Playground`` lets a student allocate, append, fork and free, watch the pool,
the block tables and the free queue change, and export what they did as a
replay scenario. Bad input shows as a message in the widget; nothing is raised
into the notebook. A page without a kernel shows its state as it was when the
cell ran (the pool, the free queue and the operations), under a line saying the
controls need a running kernel.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from kvlab import scenarios
from kvlab.core import jsonio
from kvlab.core.snapshots import BlockPoolState, History
from kvlab.errors import (
    InvalidArgumentError,
    KvlabError,
    ScenarioError,
    brief,
    check_int,
    check_optional_str,
    check_size,
)
from kvlab.views._common import Spec, check_drawn_blocks
from kvlab.views.block_pool import block_pool_spec
from kvlab.views.free_queue import free_queue_spec
from kvlab.views.live import KERNEL_NOTE, LiveFigure, Stepper, StillCopy, still_html
from kvlab.views.text import caption

# ---------------------------------------------------------------------- playground

SHARED_PREFIX_START = 1000  # the shared "system prompt" is tokens 1000, 1001, ...
UNIQUE_START = 100_000  # every other token is fresh: 100000, 100001, ...
MODELS = ("prefix-cache", "block-pool")  # the scenario models whose state is a BlockPoolState


class Playground(StillCopy, widgets.VBox):
    """Drive a block pool or a prefix cache by hand and watch the pool, the tables and the free queue.

    ``model="prefix-cache"`` is ``kvlab.models.prefix_cache.PrefixCache`` (vLLM's
    lazy eviction, free queue, hits); its scenario is exactly the replay CLI's
    JSON (``python -m kvlab replay prefix-cache``). ``model="block-pool"`` is
    ``kvlab.models.paged.BlockPool`` with prefix sharing, fork and copy-on-write. The
    replay CLI has no block-pool model (and no fork), so a block-pool scenario
    says so: it carries ``"model": "block-pool"`` beside ``config`` and
    ``ops``, the CLI refuses it, and it replays here instead
    (``Playground.from_scenario`` or the widget's *replay JSON* button).

    The playground builds no model itself: ``kvlab.scenarios`` builds it from
    the config and applies every op, exactly as the replay CLI does, and what
    a model offers (its ops, its options) comes from its scenario module.

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
        if type(model) is not str or model not in MODELS:  # by exact text, never the value's own __eq__
            raise InvalidArgumentError(f"unknown model {brief(model)}: use one of {', '.join(MODELS)}")
        check_drawn_blocks(num_blocks, minimum=1)  # every block is drawn: at most LIMITS.drawn_blocks
        check_int("block_size", block_size, minimum=1)
        self.model_name = model
        self._scenario = scenarios.module(model)
        self.config: dict[str, Any] = self._scenario.default_config(
            num_blocks, block_size, null_block=null_block, hash_scheme=hash_scheme
        )
        self._run = scenarios.start(model, self.config, record=True)  # validates the config
        self.ops: list[dict[str, Any]] = []
        #: why the pool refused the op at each index of ``ops`` that it refused (recorded, ok: false)
        self.refused: dict[int, str] = {}
        self._next_token = UNIQUE_START
        self._build_widgets()
        self._refresh()

    # -- public API (also what the buttons call)

    @property
    def model(self) -> Any:
        """The model the scenario layer built and drives (read it; change it only through ops)."""
        return self._run.model

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
        num_tokens = check_size("num_tokens", num_tokens, "tokens", minimum=1)
        prefix = check_size("prefix", prefix, "tokens")
        cache_salt = check_optional_str("cache_salt", cache_salt)
        if prefix > num_tokens:
            raise InvalidArgumentError(
                f"the shared prefix ({prefix}) cannot be longer than the request ({num_tokens})"
            )
        if cache_salt is not None and "cache_salt" in self._scenario.UNSUPPORTED:
            raise InvalidArgumentError(self._scenario.UNSUPPORTED["cache_salt"])
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
        num_tokens = check_size("num_tokens", num_tokens, "tokens", minimum=1)
        return self.apply({"op": "append", "req": request, "tokens": self._fresh(num_tokens)})

    def fork(self, parent: str, child: str) -> bool:
        """Start ``child`` sharing all of ``parent``'s blocks (a model whose scenario has a fork op)."""
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
        op = _plain_op(op)  # a copy of plain JSON data: the caller's object is neither trusted nor kept
        reason = self._run.apply(op, len(self.ops)).refused
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
        self._run = scenarios.start(self.model_name, self.config, record=True)
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
        if self.model_name not in scenarios.CLI_MODELS:
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
        fresh = scenarios.start(self.model_name, config, record=True)
        refused = {}
        for i, op in enumerate(ops):
            reason = fresh.apply(op, i).refused
            if reason is not None:
                refused[i] = reason
        self.config = dict(config)
        self._run = fresh
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
        if model is not None and (type(model) is not str or model not in MODELS):
            raise InvalidArgumentError(f"unknown model {brief(model)}: use one of {', '.join(MODELS)}")
        if model is not None and named is not None and model != named:
            raise ScenarioError(f"the scenario is for the {named} model, not {model}")
        model = model or named or "prefix-cache"
        if model not in MODELS:
            raise InvalidArgumentError(f"unknown model {model!r}: use one of {', '.join(MODELS)}")
        scenarios.start(model, config)  # a bad config raises here, naming the key
        pg = cls(model, num_blocks=config["num_blocks"], block_size=config["block_size"])
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

    def still_html(self) -> str:
        """The playground as a page without a kernel shows it: its pool, queue and operations so far."""
        done = f"{len(self.ops)} operation{'s' if len(self.ops) != 1 else ''}"
        note = f"{KERNEL_NOTE} This copy shows the playground after its {done}."
        return still_html([self.pool_figure.spec, self.queue_figure.spec], note, extra=self.log_view.value)

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
                               disabled="cache_salt" in self._scenario.UNSUPPORTED)  # fmt: skip
        for box in (self.new_id_box, self.request_pick, self.tokens_box, self.prefix_box, self.salt_box):
            box.style.description_width = "60px"
        can_fork = "fork" in self._scenario.OP_FIELDS
        fork_help = (
            "start 'new id' sharing all blocks of 'request'"
            if can_fork
            else "fork is a block-pool operation (vLLM's prefix cache shares through hits instead)"
        )
        self.buttons = {
            "allocate": w.Button(description="allocate", button_style="primary",
                                 tooltip="a new request 'new id' of 'tokens' tokens; the first 'shared' come from "
                                         "the shared prompt"),
            "append": w.Button(description="append", tooltip="decode 'tokens' more tokens into 'request'"),
            "fork": w.Button(description="fork", tooltip=fork_help, disabled=not can_fork),
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
        title = self._scenario.FREE_LIST_NAME.capitalize()
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
        name = self.model_name
        if name in scenarios.CLI_MODELS:
            self._say(
                f"exported {len(self.ops)} ops{refused}; replay with: python -m kvlab replay {name}", ok=True
            )
        else:
            self._say(f"exported {len(self.ops)} ops{refused}. This is a {name} scenario (\"model\": "
                      f"\"{name}\"): the replay CLI has no {name} model and no fork, so it will refuse "
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


def _plain_op(op: object) -> dict[str, Any]:
    """``op`` as plain JSON data of its own, written out and read back within kvlab's limits."""
    if not isinstance(op, dict):
        raise ScenarioError(f'an op is a dict such as {{"op": "free", "req": "A"}}, got {brief(op)}')
    try:
        text = jsonio.dumps(op)
    except KvlabError as exc:
        raise ScenarioError(f"the op is not JSON data: {exc}") from None
    return jsonio.read_json(text, "the op")


def _parse_scenario(scenario: object) -> tuple[str | None, dict[str, Any], list[Any]]:
    """(the scenario's "model" field or None, config, ops), parsed by ``kvlab.scenarios``; a playground model."""
    model, config, ops = scenarios.parse_scenario(scenario)
    if model is not None and model not in MODELS:
        raise ScenarioError(f"unknown scenario model {model!r}: use one of {', '.join(MODELS)}")
    return model, config, ops
