"""What the scenario modules share: replaying a list of ops, and the block pools' checks and records.

Each check raises ``ScenarioError`` with the op's index (or names the config
key) and a message that says what to write instead, before anything of the op
is applied. ``PoolRun`` is the ``Run`` of both block-pool models
(``prefix-cache`` and ``block-pool``): check an op completely, apply it, keep
track of which requests hold blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any, Protocol

from kvlab.core.hashing import SCHEMES
from kvlab.errors import (
    LIMITS,
    MAX_TOKEN_ID,
    InvalidArgumentError,
    KvlabError,
    Limits,
    ScenarioError,
    brief,
    check_bool,
    check_choice,
    check_int,
    check_items,
    check_size,
    check_text,
)
from kvlab.scenarios import Outcome, check_num_ops

LIMIT_NAMES = tuple(Limits.__dataclass_fields__)  # what ``config_size``'s ``limit`` may name
OpFields = dict[str, tuple[set[str], set[str]]]  # op -> (required fields, optional fields)

__all__ = [
    "LIMIT_NAMES",
    "LiveRequests",
    "OpFields",
    "PoolRun",
    "blank_record",
    "build_pool",
    "check_config_keys",
    "check_index",
    "check_op",
    "check_op_fields",
    "check_ops",
    "check_string",
    "check_token_list",
    "config_flag",
    "config_hash",
    "config_size",
    "op_name",
    "plain_list",
    "plain_object",
    "replay_ops",
]


class _Run(Protocol):
    def apply(self, op: Any, index: int) -> Outcome: ...


def replay_ops(run: _Run, ops: Any) -> list[dict[str, Any]]:
    """Every op's record from ``run``, in order (the config was checked first, when ``run`` was built)."""
    if not callable(getattr(type(run), "apply", None)) or not hasattr(run, "model"):
        raise InvalidArgumentError(f"run must be a scenario Run (with .apply and .model), got {brief(run)}")
    ops = check_ops(ops)
    records, numbers = [], 0
    for index, op in enumerate(ops):
        records.append(run.apply(op, index).record)
        numbers += _state_numbers(run.model)
        if numbers > LIMITS.record_numbers:
            raise ScenarioError(
                f"full records would hold more than {LIMITS.record_numbers:,} numbers (each repeats the whole "
                "free queue or tree): replay with --changes, whose output grows with the ops only",
                index,
            )
    return records


def _state_numbers(model: Any) -> int:
    """About how many numbers one full record repeats: the pool's blocks or the tree's nodes."""
    return getattr(model, "num_blocks", None) or getattr(model, "num_nodes", 0)


def check_ops(ops: Any) -> list[Any]:
    """``ops`` must be a list of at most ``LIMITS.ops`` operations; returned as a plain list (``plain_list``)."""
    if not isinstance(ops, list):
        raise ScenarioError("'ops' must be a list of operations")
    check_num_ops(ops)
    return plain_list(ops, "'ops'")


def plain_list(value: Any, what: str, index: int | None = None) -> list[Any]:
    """``value`` as an exact ``list``: parsed JSON as it is, a list subclass copied by ``list`` itself (never its overrides)."""
    if type(value) is list:
        return value
    if not isinstance(value, list):
        raise ScenarioError(
            f"{_text(what)} must be a JSON list, got {brief(value)} ({type(value).__name__})", index
        )
    return list.copy(value)


def _label(what: object) -> str:
    """What a message calls the value: plain text, never an error of its own."""
    return what if type(what) is str else brief(what)


def _text(value: object) -> str:
    """A caller's label or field name as plain text (kvlab's error if it is not a string)."""
    return value if type(value) is str else check_text("a label", value)


def check_op_fields(op_fields: Any) -> OpFields:
    """A model's ``OP_FIELDS``: a dict of op name -> (required fields, optional fields), all plain strings."""
    if type(op_fields) is dict:
        return op_fields  # the scenario modules' own constants: checked once, in their tests
    if not isinstance(op_fields, dict):
        raise InvalidArgumentError(
            f"op_fields must be a dict op -> (required, optional), got {brief(op_fields)}"
        )
    plain: OpFields = {}
    for name, fields in list(dict.items(op_fields)):
        try:
            required, optional = fields
            plain[check_text("an op name", name)] = (
                {check_text("a field", f) for f in check_items("required fields", required)},
                {check_text("a field", f) for f in check_items("optional fields", optional)},
            )
        except KvlabError:
            raise
        except Exception:
            raise InvalidArgumentError(
                f"op_fields[{brief(name)}] must be (required fields, optional fields)"
            ) from None
    return plain


def plain_object(value: Any, what: str, index: int | None = None) -> dict[str, Any]:
    """``value`` as a plain JSON object: an exact ``dict`` whose keys are exact ``str``.

    Parsed JSON already is one and comes back as it is (the fast path); a dict handed to the Python
    API may be a subclass, read here through ``dict``'s own methods (never its overrides) into a
    copy, with ``str``-subclass keys as plain text. Anything else, or a key that is not a string, is
    refused with a ``ScenarioError`` naming ``what`` (and the op's ``index``).
    """
    if type(value) is dict and all(type(key) is str for key in value):
        return value
    if not isinstance(value, dict):
        raise ScenarioError(
            f"{_label(what)} must be a JSON object, got {brief(value)} ({type(value).__name__})", index
        )
    try:
        items = list(dict.items(value))
        plain = {}
        for key, item in items:
            if not isinstance(key, str):
                raise ScenarioError(f"{_label(what)} has a key {brief(key)} that is not a string", index)
            plain[str.__str__(key)] = item
    except KvlabError:
        raise
    except Exception as exc:  # a key whose __hash__ or __eq__ raises
        raise ScenarioError(
            f"{_label(what)} could not be read as a JSON object ({type(exc).__name__})", index
        ) from None
    return plain


def check_index(index: object) -> int:
    """An op's position in its scenario: an integer >= 0 (it names the op in every error)."""
    try:
        return check_int("index", index, minimum=0)
    except InvalidArgumentError as exc:
        raise ScenarioError(f"an op's index: {exc}") from None


def op_name(op: Any, index: int, op_fields: Container[str], example: str) -> str:
    """The op's name: ``op`` must be an object whose ``"op"`` is one of ``op_fields`` (exact str, any JSON type refused)."""
    op_fields, example = check_op_fields(op_fields), _text(example)
    if isinstance(op, dict):
        op = plain_object(op, "the op", index)
    return _op_name(op, index, op_fields, example)


# The private forms below trust their arguments: a Run's ``apply`` checks them once per op
# (``check_index``, ``plain_object``), then every check of that op reads the plain values fast.


def _op_name(op: Any, index: int, op_fields: Container[str], example: str) -> str:
    if type(op) is not dict:
        raise ScenarioError(f"each op must be a JSON object like {example}, got {brief(op)}", index)
    name = op.get("op")
    if type(name) is not str or name not in op_fields:
        raise ScenarioError(f"unknown op {brief(name)}: use one of {', '.join(op_fields)}", index)  # type: ignore[arg-type]
    return name


def check_string(op: dict[str, Any], key: str, index: int, what: str = "a non-empty string") -> str | None:
    """``op[key]`` (None when absent) must be a non-empty ``str``; the message says what it names."""
    return _check_string(plain_object(op, "the op", index), _text(key), index, _text(what))


def _check_string(op: dict[str, Any], key: str, index: int, what: str = "a non-empty string") -> str | None:
    if key not in op:
        return None
    value = op[key]
    if type(value) is not str or not value:
        raise ScenarioError(f"'{key}' must be {what}, got {brief(value)} ({type(value).__name__})", index)
    return value


def check_token_list(value: Any, index: int, empty: str | None) -> list[int]:
    """A list of at most ``LIMITS.tokens`` token ids 0..MAX_TOKEN_ID; ``empty`` is why an empty one is refused (None: allowed)."""
    if empty is not None and type(empty) is not str:
        empty = _text(empty)
    if type(value) is not list:
        raise ScenarioError(f"'tokens' must be a list of integer token ids, got {brief(value)}", index)
    if not value and empty is not None:
        raise ScenarioError(f"'tokens' is empty: {empty}", index)
    try:
        check_size("len(tokens)", len(value), "tokens")
    except InvalidArgumentError as exc:
        raise ScenarioError(str(exc), index) from None
    if set(map(type, value)) <= {int} and (not value or min(value) >= 0 and max(value) <= MAX_TOKEN_ID):
        return value  # the fast path: plain ints in range
    for i, t in enumerate(value):
        if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:
            raise ScenarioError(
                f"tokens[{i}] = {brief(t)} is not a token id (an integer 0..{MAX_TOKEN_ID})", index
            )
    return value


# ---------------------------------------------------------------- a block pool's config


def check_config_keys(config: Any, name: str, keys: Sequence[str]) -> dict[str, Any]:
    """``config`` must be an object of only these keys; an unknown key's message lists them in this order.

    Returns the config as a plain JSON object (``plain_object``), the one every later check reads.
    """
    config, name = plain_object(config, "'config'"), _text(name)
    keys = [check_text("a config key", key) for key in check_items("keys", keys)]
    unknown = sorted(set(config) - set(keys))
    if unknown:
        raise ScenarioError(f"unknown config key(s) {brief(unknown)}: {name} takes {', '.join(keys)}")
    return config


def _config_value(config: Any, key: object, default: object) -> tuple[str, object]:
    """``(key, config[key])`` from a plain copy of ``config``, ``default`` when absent: the config helpers' one read."""
    try:
        key = check_text("a config key", key, allow_empty=False)
    except InvalidArgumentError as exc:
        raise ScenarioError(str(exc)) from None
    return key, plain_object(config, "'config'").get(key, default)


def config_size(config: dict[str, Any], key: str, limit: str | None = None) -> int:
    """``config[key]``, an integer from 1 to ``LIMITS.<limit>`` (default: the limit named like the key).

    ``num_blocks`` and ``block_size`` are bounded by ``LIMITS.num_blocks`` and
    ``LIMITS.block_size``: a pool builds every block up front, so a config of ten
    million blocks would take a minute and gigabytes before the first op.
    """
    key, value = _config_value(config, key, None)
    try:
        limit = check_choice("limit", key if limit is None else limit, LIMIT_NAMES, what="limit")
    except InvalidArgumentError as exc:
        raise ScenarioError(f"config '{key}': {exc}") from None
    if type(value) is not int or value < 1:
        raise ScenarioError(f"config '{key}' must be an integer >= 1, got {brief(value)}")
    try:
        return check_size(key, value, limit, minimum=1)
    except InvalidArgumentError as exc:
        raise ScenarioError(f"config '{key}' is too large: {exc}") from None


def config_flag(config: dict[str, Any], key: str, default: bool) -> bool:
    """``config[key]`` (``default`` when absent), which must be true or false."""
    if type(default) is not bool:
        raise ScenarioError(f"config_flag's default must be True or False, got {brief(default)}")
    key, value = _config_value(config, key, default)
    if type(value) is not bool:
        raise ScenarioError(f"config '{key}' must be true or false, got {brief(value)}")
    return value


def config_hash(config: dict[str, Any]) -> str:
    """``config["hash"]``: the block-hash scheme, one of ``SCHEMES`` (default "lesson")."""
    _, scheme = _config_value(config, "hash", "lesson")
    if type(scheme) is not str or scheme not in SCHEMES:
        raise ScenarioError(
            f"config 'hash' must be one of {', '.join(map(repr, SCHEMES))}, got {brief(scheme)}"
        )
    return scheme


def build_pool(make: Callable[..., Any], config: dict[str, Any], **options: Any) -> Any:
    """``make(num_blocks, block_size, **options)``; what the model refuses is a ``ScenarioError`` on the config."""
    if not callable(make):
        raise InvalidArgumentError(f"make must be a model class such as PrefixCache, got {brief(make)}")
    config = plain_object(config, "'config'")
    try:
        return make(config.get("num_blocks"), config.get("block_size"), **options)
    except KvlabError as exc:
        raise ScenarioError(f"config: {exc}") from None


# ---------------------------------------------------------------- a block pool's ops


def check_op(op: Any, index: int, op_fields: OpFields) -> None:
    """Reject a malformed op: not an object, an unknown op, a missing or extra field, a bad value."""
    index, op_fields = check_index(index), check_op_fields(op_fields)
    _check_op(plain_object(op, "the op", index) if isinstance(op, dict) else op, index, op_fields)


def _check_op(op: Any, index: int, op_fields: OpFields) -> None:
    name = _op_name(op, index, op_fields, '{"op": "alloc", ...}')
    required, optional = op_fields[name]
    missing = sorted(required - set(op))
    if missing:
        raise ScenarioError(f"{name} needs field(s) {missing}", index)
    extra = sorted(set(op) - required - optional - {"op"}, key=str)
    if extra:
        allowed = ", ".join(sorted(required | optional))
        raise ScenarioError(f"{name} does not take field(s) {brief(extra)}; it takes {allowed}", index)
    for key in ("req", "child"):
        _check_string(op, key, index)
    if "tokens" in op:
        what = "a prompt" if name in ("alloc", "probe") else "an append"
        check_token_list(op["tokens"], index, f"{what} needs at least one token")
    if "cache_salt" in op and op["cache_salt"] is not None:
        _check_string(op, "cache_salt", index)


class LiveRequests:
    """Which request ids hold blocks and which were freed, so a bad reference is named precisely."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.freed: set[str] = set()

    def check_new(self, request_id: str, index: int) -> None:
        request_id = _request_id(request_id, index)
        if request_id in self.live:
            raise ScenarioError(
                f"request {request_id!r} is already allocated; free it first or use a new id", index
            )

    def check_live(self, op: str, request_id: str, index: int) -> None:
        op, request_id = _text(op), _request_id(request_id, index)
        if request_id not in self.live:
            if request_id in self.freed:
                what = {"free": "a double free", "append": "an append after free"}.get(
                    op, f"a {op} after free"
                )
                raise ScenarioError(f"request {request_id!r} was already freed ({what})", index)
            raise ScenarioError(f"unknown request {request_id!r}: allocate it first", index)

    def check(self, op: dict[str, Any], index: int) -> None:
        """An alloc's request must be new, any other op's (when it names one) live, a fork's child new."""
        op = plain_object(op, "the op", index)
        _text(op.get("op"))
        self._check(op, check_index(index))

    def _check(self, op: dict[str, Any], index: int) -> None:
        name, req = op["op"], op.get("req")
        if name == "alloc":
            self.check_new(req, index)
        elif req is not None:
            self.check_live(name, req, index)
        if "child" in op:
            self.check_new(op["child"], index)

    def update(self, op: dict[str, Any], ok: bool) -> None:
        """After ``op``: a served alloc's request and a fork's child hold blocks; a freed request holds none."""
        self._update(plain_object(op, "the op"), check_bool("ok", ok))

    def _update(self, op: dict[str, Any], ok: bool) -> None:
        name = op.get("op")
        if name == "alloc" and ok:
            self.added(op["req"])
        elif name == "fork":
            self.added(op["child"])
        elif name == "free":
            self.removed(op["req"])

    def added(self, request_id: str) -> None:
        request_id = _request_id(request_id, None)
        self.live.add(request_id)
        self.freed.discard(request_id)

    def removed(self, request_id: str) -> None:
        request_id = _request_id(request_id, None)
        self.live.discard(request_id)
        self.freed.add(request_id)


def _request_id(request_id: object, index: int | None) -> str:
    if type(request_id) is str and request_id:
        return request_id
    raise ScenarioError(f"a request id must be a non-empty string, got {brief(request_id)}", index)


def blank_record(name: str, req: str | None) -> dict[str, Any]:
    """The record a block pool's op starts from: served, nothing hit, allocated or evicted, empty lists."""
    name = _text(name)
    req = None if req is None else _text(req)
    return {
        "op": name,
        "req": req,
        "ok": True,
        "num_cached_tokens": 0,
        "hit_block_ids": [],
        "new_block_ids": [],
        "block_table": [],
        "evicted": [],
        "free_queue": [],
    }


class PoolRun:
    """A block pool built from a scenario's config, taking its ops one at a time.

    ``apply`` checks an op completely (its shape against ``op_fields``, then
    that the requests it names are live or new), only then hands it to
    ``step(model, op)``, and afterwards notes which requests hold blocks. A
    ``KvlabError`` from the model means a check here missed a case: it is
    raised as a ``ScenarioError`` naming the op's index all the same.
    """

    def __init__(
        self, model: Any, op_fields: OpFields, step: Callable[[Any, dict[str, Any]], Outcome]
    ) -> None:
        if not callable(step):
            raise InvalidArgumentError(f"step must be a callable (model, op) -> Outcome, got {brief(step)}")
        self.model = model
        self._op_fields = check_op_fields(op_fields)
        self._step = step
        self._requests = LiveRequests()

    def apply(self, op: Any, index: int) -> Outcome:
        """Check ``op`` completely, then apply it; a refused alloc or append is ``ok: false``."""
        index = check_index(index)
        if isinstance(op, dict):
            op = plain_object(op, "the op", index)
        _check_op(op, index, self._op_fields)
        self._requests._check(op, index)
        try:
            outcome = self._step(self.model, op)
        except KvlabError as exc:  # a check above should have caught it; keep the index anyway
            raise ScenarioError(str(exc), index) from None
        self._requests._update(op, outcome.record["ok"])
        return outcome
