"""The playground: drive a block pool or a prefix cache by hand in a running kernel.

``Playground`` lets a student allocate, append, fork and free, watch the pool,
the block tables and the free queue change, and export what they did as a
replay scenario. Bad input shows as a message in the widget; nothing is raised
into the notebook.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from kvlab.core.snapshots import BlockPoolState, History
from kvlab.errors import InvalidArgumentError, KvlabError, OutOfBlocksError, ScenarioError, check_int
from kvlab.views._common import Spec
from kvlab.views.figures import block_pool_spec, free_queue_spec
from kvlab.views.live import LiveFigure, Stepper
from kvlab.views.text import caption

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
