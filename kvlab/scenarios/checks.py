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
    ScenarioError,
    brief,
    check_size,
)
from kvlab.scenarios import Outcome, check_num_ops

OpFields = dict[str, tuple[set[str], set[str]]]  # op -> (required fields, optional fields)


class _Run(Protocol):
    def apply(self, op: Any, index: int) -> Outcome: ...


def replay_ops(run: _Run, ops: Any) -> list[dict[str, Any]]:
    """Every op's record from ``run``, in order (the config was checked first, when ``run`` was built)."""
    check_ops(ops)
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


def check_ops(ops: Any) -> None:
    """``ops`` must be a list of at most ``LIMITS.ops`` operations."""
    if not isinstance(ops, list):
        raise ScenarioError("'ops' must be a list of operations")
    check_num_ops(ops)


def op_name(op: Any, index: int, op_fields: Container[str], example: str) -> str:
    """The op's name: ``op`` must be an object whose ``"op"`` is one of ``op_fields`` (exact str, any JSON type refused)."""
    if not isinstance(op, dict):
        raise ScenarioError(f"each op must be a JSON object like {example}, got {brief(op)}", index)
    name = op.get("op")
    if type(name) is not str or name not in op_fields:
        raise ScenarioError(f"unknown op {brief(name)}: use one of {', '.join(op_fields)}", index)  # type: ignore[arg-type]
    return name


def check_string(op: dict[str, Any], key: str, index: int, what: str = "a non-empty string") -> str | None:
    """``op[key]`` (None when absent) must be a non-empty ``str``; the message says what it names."""
    if key not in op:
        return None
    value = op[key]
    if type(value) is not str or not value:
        raise ScenarioError(f"'{key}' must be {what}, got {brief(value)} ({type(value).__name__})", index)
    return value


def check_token_list(value: Any, index: int, empty: str | None) -> list[int]:
    """A list of at most ``LIMITS.tokens`` token ids 0..MAX_TOKEN_ID; ``empty`` is why an empty one is refused (None: allowed)."""
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


def check_config_keys(config: Any, name: str, keys: Sequence[str]) -> None:
    """``config`` must be an object of only these keys; an unknown key's message lists them in this order."""
    if not isinstance(config, dict):
        raise ScenarioError("'config' must be an object")
    unknown = sorted(set(config) - set(keys))
    if unknown:
        raise ScenarioError(f"unknown config key(s) {unknown}: {name} takes {', '.join(keys)}")


def config_size(config: dict[str, Any], key: str, limit: str | None = None) -> int:
    """``config[key]``, an integer from 1 to ``LIMITS.<limit>`` (default: the limit named like the key).

    ``num_blocks`` and ``block_size`` are bounded by ``LIMITS.num_blocks`` and
    ``LIMITS.block_size``: a pool builds every block up front, so a config of ten
    million blocks would take a minute and gigabytes before the first op.
    """
    value = config.get(key)
    if type(value) is not int or value < 1:
        raise ScenarioError(f"config '{key}' must be an integer >= 1, got {brief(value)}")
    try:
        return check_size(key, value, limit or key, minimum=1)
    except InvalidArgumentError as exc:
        raise ScenarioError(f"config '{key}' is too large: {exc}") from None


def config_flag(config: dict[str, Any], key: str, default: bool) -> bool:
    """``config[key]`` (``default`` when absent), which must be true or false."""
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ScenarioError(f"config '{key}' must be true or false, got {brief(value)}")
    return value


def config_hash(config: dict[str, Any]) -> str:
    """``config["hash"]``: the block-hash scheme, one of ``SCHEMES`` (default "lesson")."""
    scheme = config.get("hash", "lesson")
    if type(scheme) is not str or scheme not in SCHEMES:
        raise ScenarioError(
            f"config 'hash' must be one of {', '.join(map(repr, SCHEMES))}, got {brief(scheme)}"
        )
    return scheme


def build_pool(make: Callable[..., Any], config: dict[str, Any], **options: Any) -> Any:
    """``make(num_blocks, block_size, **options)``; what the model refuses is a ``ScenarioError`` on the config."""
    try:
        return make(config["num_blocks"], config["block_size"], **options)
    except KvlabError as exc:
        raise ScenarioError(f"config: {exc}") from None


# ---------------------------------------------------------------- a block pool's ops


def check_op(op: Any, index: int, op_fields: OpFields) -> None:
    """Reject a malformed op: not an object, an unknown op, a missing or extra field, a bad value."""
    name = op_name(op, index, op_fields, '{"op": "alloc", ...}')
    required, optional = op_fields[name]
    missing = sorted(required - set(op))
    if missing:
        raise ScenarioError(f"{name} needs field(s) {missing}", index)
    extra = sorted(set(op) - required - optional - {"op"}, key=str)
    if extra:
        allowed = ", ".join(sorted(required | optional))
        raise ScenarioError(f"{name} does not take field(s) {brief(extra)}; it takes {allowed}", index)
    for key in ("req", "child"):
        check_string(op, key, index)
    if "tokens" in op:
        what = "a prompt" if name in ("alloc", "probe") else "an append"
        check_token_list(op["tokens"], index, f"{what} needs at least one token")
    if "cache_salt" in op and op["cache_salt"] is not None:
        check_string(op, "cache_salt", index)


class LiveRequests:
    """Which request ids hold blocks and which were freed, so a bad reference is named precisely."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.freed: set[str] = set()

    def check_new(self, request_id: str, index: int) -> None:
        if request_id in self.live:
            raise ScenarioError(
                f"request {request_id!r} is already allocated; free it first or use a new id", index
            )

    def check_live(self, op: str, request_id: str, index: int) -> None:
        if request_id not in self.live:
            if request_id in self.freed:
                what = {"free": "a double free", "append": "an append after free"}.get(
                    op, f"a {op} after free"
                )
                raise ScenarioError(f"request {request_id!r} was already freed ({what})", index)
            raise ScenarioError(f"unknown request {request_id!r}: allocate it first", index)

    def check(self, op: dict[str, Any], index: int) -> None:
        """An alloc's request must be new, any other op's (when it names one) live, a fork's child new."""
        name, req = op["op"], op.get("req")
        if name == "alloc":
            self.check_new(req, index)
        elif req is not None:
            self.check_live(name, req, index)
        if "child" in op:
            self.check_new(op["child"], index)

    def update(self, op: dict[str, Any], ok: bool) -> None:
        """After ``op``: a served alloc's request and a fork's child hold blocks; a freed request holds none."""
        name = op["op"]
        if name == "alloc" and ok:
            self.added(op["req"])
        elif name == "fork":
            self.added(op["child"])
        elif name == "free":
            self.removed(op["req"])

    def added(self, request_id: str) -> None:
        self.live.add(request_id)
        self.freed.discard(request_id)

    def removed(self, request_id: str) -> None:
        self.live.discard(request_id)
        self.freed.add(request_id)


def blank_record(name: str, req: str | None) -> dict[str, Any]:
    """The record a block pool's op starts from: served, nothing hit, allocated or evicted, empty lists."""
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
        self.model = model
        self._op_fields = op_fields
        self._step = step
        self._requests = LiveRequests()

    def apply(self, op: Any, index: int) -> Outcome:
        """Check ``op`` completely, then apply it; a refused alloc or append is ``ok: false``."""
        check_op(op, index, self._op_fields)
        self._requests.check(op, index)
        try:
            outcome = self._step(self.model, op)
        except KvlabError as exc:  # a check above should have caught it; keep the index anyway
            raise ScenarioError(str(exc), index) from None
        self._requests.update(op, outcome.record["ok"])
        return outcome
