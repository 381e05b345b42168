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

from kvlab.errors import InvalidArgumentError, OutOfBlocksError, check_bool
from kvlab.models.paged import BlockPool
from kvlab.scenarios import Outcome, checks

NAME = "block-pool"
CONFIG_KEYS = ("block_size", "num_blocks", "share_prefixes", "hash")
OP_FIELDS: checks.OpFields = {
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
    return checks.replay_ops(Run(config), ops)


class Run(checks.PoolRun):
    """A ``BlockPool`` built from a scenario's config, taking its ops one at a time."""

    def __init__(self, config: Any, *, record: bool = False) -> None:
        super().__init__(_build(config, record=record), OP_FIELDS, _apply)


def _build(config: Any, *, record: bool) -> BlockPool:
    config = checks.check_config_keys(config, NAME, sorted(CONFIG_KEYS))
    for key in ("block_size", "num_blocks"):
        checks.config_size(config, key)
    scheme = checks.config_hash(config)
    share = checks.config_flag(config, "share_prefixes", True)
    return checks.build_pool(BlockPool, config, share_prefixes=share, hash_scheme=scheme, record=record)


def _apply(pool: BlockPool, op: dict[str, Any]) -> Outcome:
    name = op["op"]
    req = op["req"]
    record = checks.blank_record(name, req)
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
