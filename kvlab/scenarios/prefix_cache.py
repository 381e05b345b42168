"""Replay a prefix-cache scenario: ``python -m kvlab replay prefix-cache < scenario.json``.

Config keys: ``block_size`` and ``num_blocks`` (required), ``null_block``
(bool, default false: the lesson's numbering; true: vLLM's reserved block 0),
``hash`` ("lesson" or "vllm", default "lesson").

Ops, one record each:

* ``{"op": "alloc", "req": "A", "tokens": [...], "cache_salt": "t1"}`` -- look
  up the prompt's cached prefix, then allocate the rest (salt optional).
* ``{"op": "append", "req": "A", "tokens": [...]}`` -- decode steps.
* ``{"op": "free", "req": "A"}`` -- the request finished.
* ``{"op": "probe", "tokens": [...], "cache_salt": "t1"}`` -- a lookup that
  allocates nothing.

Record fields: ``op``, ``req`` (null for probe), ``ok``, ``num_cached_tokens``,
``hit_block_ids``, ``new_block_ids``, ``block_table``, ``evicted``,
``free_queue``. ``ok`` is false when the pool cannot serve an alloc or append;
nothing changes then, a refused alloc leaves no request behind, and its
record still reports the hit the lookup found (vLLM looks up before it tries
to allocate). ``block_table`` is the table after the op (for free, the table
the request had; for probe and a refused alloc, empty). ``evicted`` lists the
blocks whose cached content the op dropped, in order. ``free_queue`` runs
from the front (handed out next) to the back and never holds the null block.

A malformed scenario raises ``ScenarioError`` naming the op's index; the op
that is wrong is checked completely before anything of it is applied.
"""

from __future__ import annotations

from typing import Any

from kvlab.core.hashing import SCHEMES
from kvlab.errors import KvlabError, OutOfBlocksError, ScenarioError
from kvlab.models.prefix_cache import MAX_TOKEN_ID, PrefixCache

CONFIG_KEYS = ("block_size", "num_blocks", "null_block", "hash")
MAX_BLOCKS = 2**20  # a replay builds every block up front; a million is more than any scenario needs
OP_FIELDS: dict[str, tuple[set[str], set[str]]] = {  # op -> (required fields, optional fields)
    "alloc": ({"req", "tokens"}, {"cache_salt"}),
    "append": ({"req", "tokens"}, set()),
    "free": ({"req"}, set()),
    "probe": ({"tokens"}, {"cache_salt"}),
}


def replay(config: dict[str, Any], ops: list[Any]) -> list[dict[str, Any]]:
    """Apply ``ops`` to a fresh ``PrefixCache`` built from ``config``; one JSON-ready record per op."""
    cache = _build(config)
    live: set[str] = set()
    freed: set[str] = set()
    records: list[dict[str, Any]] = []
    if not isinstance(ops, list):
        raise ScenarioError("'ops' must be a list of operations")
    for index, op in enumerate(ops):
        _check_op(op, index)
        name = op["op"]
        req = op.get("req")
        if name == "alloc" and req in live:
            raise ScenarioError(f"request {req!r} is already allocated; free it first or use a new id", index)
        if name in ("append", "free") and req not in live:
            if req in freed:
                what = "a double free" if name == "free" else "an append after free"
                raise ScenarioError(f"request {req!r} was already freed ({what})", index)
            raise ScenarioError(f"unknown request {req!r}: allocate it first", index)
        try:
            records.append(_apply(cache, op))
        except KvlabError as exc:  # a check above should have caught it; keep the index anyway
            raise ScenarioError(str(exc), index) from None
        if name == "alloc" and records[-1]["ok"]:
            live.add(req)
            freed.discard(req)
        elif name == "free":
            live.discard(req)
            freed.add(req)
    return records


def _build(config: Any) -> PrefixCache:
    if not isinstance(config, dict):
        raise ScenarioError("'config' must be an object")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ScenarioError(f"unknown config key(s) {unknown}: prefix-cache takes {', '.join(CONFIG_KEYS)}")
    for key in ("block_size", "num_blocks"):
        if key not in config:
            raise ScenarioError(f"config needs '{key}' (an integer >= 1)")
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScenarioError(f"config '{key}' must be an integer >= 1, got {_brief(value)}")
    if config["num_blocks"] > MAX_BLOCKS:
        raise ScenarioError(
            f"config 'num_blocks' = {config['num_blocks']} is too large: use at most {MAX_BLOCKS}"
        )
    null_block = config.get("null_block", False)
    if not isinstance(null_block, bool):
        raise ScenarioError(f"config 'null_block' must be true or false, got {_brief(null_block)}")
    scheme = config.get("hash", "lesson")
    if scheme not in SCHEMES:
        raise ScenarioError(
            f"config 'hash' must be one of {', '.join(map(repr, SCHEMES))}, got {_brief(scheme)}"
        )
    return PrefixCache(config["num_blocks"], config["block_size"], null_block=null_block, hash_scheme=scheme)


def _check_op(op: Any, index: int) -> None:
    """Reject a malformed op with a message that says what to write instead."""
    if not isinstance(op, dict):
        raise ScenarioError(f'each op must be an object like {{"op": "alloc", ...}}, got {_brief(op)}', index)
    name = op.get("op")
    if not isinstance(name, str) or name not in OP_FIELDS:
        raise ScenarioError(f"unknown op {_brief(name)}: use one of {', '.join(OP_FIELDS)}", index)
    required, optional = OP_FIELDS[name]
    missing = sorted(required - set(op))
    if missing:
        raise ScenarioError(f"{name} needs field(s) {missing}", index)
    extra = sorted(set(op) - required - optional - {"op"})
    if extra:
        allowed = ", ".join(sorted(required | optional))
        raise ScenarioError(f"{name} does not take field(s) {extra}; it takes {allowed}", index)
    if "req" in op and (not isinstance(op["req"], str) or not op["req"]):
        raise ScenarioError(f"'req' must be a non-empty string, got {_brief(op['req'])}", index)
    if "tokens" in op:
        tokens = op["tokens"]
        if not isinstance(tokens, list):
            raise ScenarioError(f"'tokens' must be a list of integer token ids, got {_brief(tokens)}", index)
        if not tokens:
            what = "a prompt" if name in ("alloc", "probe") else "an append"
            raise ScenarioError(f"'tokens' is empty: {what} needs at least one token", index)
        for i, t in enumerate(tokens):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_TOKEN_ID:
                raise ScenarioError(
                    f"tokens[{i}] = {_brief(t)} is not a token id (an integer 0..{MAX_TOKEN_ID})", index
                )
    if "cache_salt" in op and op["cache_salt"] is not None:
        salt = op["cache_salt"]
        if not isinstance(salt, str) or not salt:
            raise ScenarioError(f"'cache_salt' must be a non-empty string, got {_brief(salt)}", index)


def _apply(cache: PrefixCache, op: dict[str, Any]) -> dict[str, Any]:
    name = op["op"]
    req = op.get("req")
    salt = op.get("cache_salt")
    record: dict[str, Any] = {
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
    if name == "probe":
        found = cache.probe(op["tokens"], salt)
        record.update(num_cached_tokens=found.num_cached_tokens, hit_block_ids=list(found.hit_block_ids))
    elif name == "free":
        record["block_table"] = list(cache.free(req).block_table)
    else:
        try:
            if name == "alloc":
                result = cache.allocate(req, op["tokens"], salt)
            else:
                result = cache.append(req, op["tokens"])
        except OutOfBlocksError:
            record["ok"] = False
            if name == "alloc":
                found = cache.probe(op["tokens"], salt)  # the lookup vLLM did before refusing
                record.update(
                    num_cached_tokens=found.num_cached_tokens, hit_block_ids=list(found.hit_block_ids)
                )
            else:
                record["block_table"] = list(cache.block_table(req))
        else:
            record.update(
                num_cached_tokens=result.num_cached_tokens,
                hit_block_ids=list(result.hit_block_ids),
                new_block_ids=list(result.new_block_ids),
                block_table=list(result.block_table),
                evicted=list(result.evicted),
            )
    record["free_queue"] = cache.free_queue()
    return record


def _brief(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut short so an error stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
