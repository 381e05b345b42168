"""Block-pool scenarios: ``kvlab.models.paged.BlockPool`` with prefix sharing, fork and copy-on-write.

The Playground's second model. Its scenario carries ``"model": "block-pool"``
beside ``config`` and ``ops``: the replay CLI has no such model (its models are
checked against real engines, and vLLM v1 has no fork), so it refuses the file
and ``Playground.from_scenario`` replays it.

Config keys: ``block_size`` and ``num_blocks`` (required), ``share_prefixes``
(bool, default true), ``hash`` ("lesson" or "vllm", default "lesson").

Ops: ``{"op": "alloc", "req": "A", "tokens": [...]}``, ``{"op": "append",
"req": "A", "tokens": [...]}``, ``{"op": "fork", "req": "A", "child": "B"}``
(B shares all of A's blocks), ``{"op": "free", "req": "A"}``. Records have the
prefix-cache replay's fields (``op``, ``req``, ``ok``, ``num_cached_tokens``,
``hit_block_ids``, ``new_block_ids``, ``block_table``, ``evicted``,
``free_queue``); a fork's also names its ``child``. An alloc or append the pool
cannot serve is refused, changes nothing, and is ``ok: false``.
"""

from __future__ import annotations

from typing import Any

from kvlab.core.hashing import SCHEMES
from kvlab.errors import InvalidArgumentError, KvlabError, OutOfBlocksError, ScenarioError, brief, check_bool
from kvlab.models.paged import BlockPool
from kvlab.scenarios import Outcome
from kvlab.scenarios.checks import LiveRequests, OpFields, check_op

NAME = "block-pool"
CONFIG_KEYS = ("block_size", "num_blocks", "share_prefixes", "hash")
OP_FIELDS: OpFields = {
    "alloc": ({"req", "tokens"}, set()),
    "append": ({"req", "tokens"}, set()),
    "fork": ({"req", "child"}, set()),
    "free": ({"req"}, set()),
}
FREE_LIST_NAME = "free list"  # what the model calls its free blocks in order
UNSUPPORTED = {  # Playground options this model lacks, with why
    "null_block": "null_block is a prefix-cache option (vLLM's reserved block 0)",
    "cache_salt": "cache_salt is a prefix-cache option; the block pool has none",
}


def default_config(
    num_blocks: int, block_size: int, *, null_block: bool = False, hash_scheme: str = "lesson"
) -> dict[str, Any]:
    """The config of a prefix-sharing pool of ``num_blocks`` blocks of ``block_size`` tokens."""
    if check_bool("null_block", null_block):
        raise InvalidArgumentError(UNSUPPORTED["null_block"])
    return {"block_size": block_size, "num_blocks": num_blocks, "share_prefixes": True, "hash": hash_scheme}


def replay(config: dict[str, Any], ops: list[Any]) -> list[dict[str, Any]]:
    """Apply ``ops`` to a fresh ``BlockPool`` built from ``config``; one record per op."""
    run = Run(config)
    if not isinstance(ops, list):
        raise ScenarioError("'ops' must be a list of operations")
    return [run.apply(op, index).record for index, op in enumerate(ops)]


class Run:
    """A ``BlockPool`` built from a scenario's config, taking its ops one at a time."""

    def __init__(self, config: Any, *, record: bool = False) -> None:
        self.model = _build(config, record=record)
        self._requests = LiveRequests()

    def apply(self, op: Any, index: int) -> Outcome:
        """Check ``op`` completely, then apply it; a refused alloc or append is ``ok: false``."""
        check_op(op, index, OP_FIELDS)
        name = op["op"]
        req = op["req"]
        if name == "alloc":
            self._requests.check_new(req, index)
        else:
            self._requests.check_live(name, req, index)
        if name == "fork":
            self._requests.check_new(op["child"], index)
        try:
            outcome = _apply(self.model, op)
        except KvlabError as exc:  # a check above should have caught it; keep the index anyway
            raise ScenarioError(str(exc), index) from None
        if name == "alloc" and outcome.record["ok"]:
            self._requests.added(req)
        elif name == "fork":
            self._requests.added(op["child"])
        elif name == "free":
            self._requests.removed(req)
        return outcome


def _build(config: Any, *, record: bool) -> BlockPool:
    if not isinstance(config, dict):
        raise ScenarioError("'config' must be an object")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ScenarioError(f"unknown config key(s) {unknown}: {NAME} takes {', '.join(sorted(CONFIG_KEYS))}")
    for key in ("block_size", "num_blocks"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScenarioError(f"config '{key}' must be an integer >= 1, got {brief(value)}")
    scheme = config.get("hash", "lesson")
    if scheme not in SCHEMES:
        raise ScenarioError(
            f"config 'hash' must be one of {', '.join(map(repr, SCHEMES))}, got {brief(scheme)}"
        )
    share = config.get("share_prefixes", True)
    if not isinstance(share, bool):
        raise ScenarioError(f"config 'share_prefixes' must be true or false, got {brief(share)}")
    try:
        return BlockPool(
            config["num_blocks"],
            config["block_size"],
            share_prefixes=share,
            hash_scheme=scheme,
            record=record,
        )
    except KvlabError as exc:
        raise ScenarioError(f"config: {exc}") from None


def _apply(pool: BlockPool, op: dict[str, Any]) -> Outcome:
    name = op["op"]
    req = op["req"]
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
    refused = None
    if name == "fork":
        record["child"] = op["child"]
        record["hit_block_ids"] = record["block_table"] = list(pool.fork(req, op["child"]))
    elif name == "free":
        record["block_table"] = list(pool.block_table(req))
        pool.free(req)
    else:
        try:
            if name == "alloc":
                result = pool.allocate(req, op["tokens"])
                record.update(num_cached_tokens=result.num_cached_tokens,
                              hit_block_ids=list(result.hit_block_ids))  # fmt: skip
            else:
                result = pool.append(req, op["tokens"])
        except OutOfBlocksError as exc:
            record["ok"] = False
            refused = str(exc)
            if name == "append":
                record["block_table"] = list(pool.block_table(req))
        else:
            record.update(new_block_ids=list(result.new_block_ids), block_table=list(result.block_table))
    record["free_queue"] = pool.free_queue()
    return Outcome(record, refused)
