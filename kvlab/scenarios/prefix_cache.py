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

``replay_changes(config, ops)`` (``python -m kvlab replay prefix-cache
--changes``) yields, instead, one compact record per op with only what the op
changed, so its size and time grow with the ops and not with the pool:
``op``, ``req``, ``ok``, ``num_cached_tokens``, ``hit_block_ids``,
``new_block_ids``, ``evicted``, then the free queue's moves: ``left_free``
(blocks taken out of it: the free blocks the prompt hit, then the new blocks
from the front), ``to_front`` (put at the front, the first of them frontmost),
``to_back`` (appended at the back, in order) and ``num_free``. Folding them
from the starting queue (blocks ``0 .. num_blocks - 1``, without block 0 when
``null_block``) gives every full record's ``free_queue``; a request's table is
its alloc's hits + new blocks, then each append's new blocks. Then comes one
last record, ``{"final": true, "free_queue": [...], "block_tables": {req:
[...]}}``.

A malformed scenario raises ``ScenarioError`` naming the op's index; the op
that is wrong is checked completely before anything of it is applied. The
Playground runs the same ``Run`` with ``record=True``; a refused alloc's lookup
then records no step (``PrefixCache.lookup``), since the pool did not change.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvlab.errors import OutOfBlocksError, ScenarioError, check_bool
from kvlab.models.prefix_cache import PrefixCache
from kvlab.scenarios import Outcome, checks

NAME = "prefix-cache"
CONFIG_KEYS = ("block_size", "num_blocks", "null_block", "hash")
OP_FIELDS: checks.OpFields = {
    "alloc": ({"req", "tokens"}, {"cache_salt"}),
    "append": ({"req", "tokens"}, set()),
    "free": ({"req"}, set()),
    "probe": ({"tokens"}, {"cache_salt"}),
}
FREE_LIST_NAME = "free queue"  # what the model calls its free blocks in order
UNSUPPORTED: dict[str, str] = {}  # Playground options this model lacks, with why (it has them all)


def default_config(
    num_blocks: int, block_size: int, *, null_block: bool = False, hash_scheme: str = "lesson"
) -> dict[str, Any]:
    """The config of a pool of ``num_blocks`` blocks of ``block_size`` tokens, as a scenario writes it."""
    check_bool("null_block", null_block)
    return {"block_size": block_size, "num_blocks": num_blocks, "null_block": null_block, "hash": hash_scheme}


def replay(config: dict[str, Any], ops: list[Any]) -> list[dict[str, Any]]:
    """Apply ``ops`` to a fresh ``PrefixCache`` built from ``config``; one JSON-ready record per op."""
    return checks.replay_ops(Run(config), ops)


def replay_changes(config: dict[str, Any], ops: list[Any]) -> Iterator[dict[str, Any]]:
    """Apply ``ops`` to a fresh ``PrefixCache``, yielding each op's compact change record, then the final state."""
    run = Run(config, changes=True)
    checks.check_ops(ops)
    for index, op in enumerate(ops):
        yield run.apply(op, index).record
    cache = run.model
    tables = {rid: list(cache.block_table(rid)) for rid in cache.requests}
    yield {"final": True, "free_queue": cache.free_queue(), "block_tables": tables}


class Run(checks.PoolRun):
    """A ``PrefixCache`` built from a scenario's config, taking its ops one at a time.

    ``changes=True``: each record is the compact change record of ``replay_changes``.
    """

    def __init__(self, config: Any, *, record: bool = False, changes: bool = False) -> None:
        check_bool("changes", changes)
        step = _apply_changes if changes else _apply
        super().__init__(_build(config, record=record), OP_FIELDS, step)


def _build(config: Any, *, record: bool) -> PrefixCache:
    config = checks.check_config_keys(config, NAME, CONFIG_KEYS)
    for key in ("block_size", "num_blocks"):  # bounded by LIMITS.block_size / LIMITS.num_blocks
        if key not in config:
            raise ScenarioError(f"config needs '{key}' (an integer >= 1)")
        checks.config_size(config, key)
    null_block = checks.config_flag(config, "null_block", False)
    scheme = checks.config_hash(config)
    return checks.build_pool(PrefixCache, config, null_block=null_block, hash_scheme=scheme, record=record)


def _apply(cache: PrefixCache, op: dict[str, Any]) -> Outcome:
    record, refused, _ = _step(cache, op, tables=True)
    record["free_queue"] = cache.free_queue()
    return Outcome(record, refused)


def _apply_changes(cache: PrefixCache, op: dict[str, Any]) -> Outcome:
    """The op's record without ``block_table`` and ``free_queue``: what left and joined the free queue instead."""
    record, refused, released = _step(cache, op, tables=False)
    left: list[int] = []
    front: list[int] = []
    back: list[int] = []
    if record["ok"] and op["op"] in ("alloc", "append"):
        # a hit block now held once was free before the op: it left the queue from the middle
        left = [b for b in record["hit_block_ids"] if cache.ref_count(b) == 1] + record["new_block_ids"]
    for block in released:  # free: blocks without a hash go to the front, cached ones to the back
        (front if cache.block_hash(block) is None else back).append(block)
    del record["block_table"], record["free_queue"]
    record.update(left_free=left, to_front=front, to_back=back, num_free=cache.num_free_blocks)
    return Outcome(record, refused)


def _step(
    cache: PrefixCache, op: dict[str, Any], *, tables: bool
) -> tuple[dict[str, Any], str | None, tuple[int, ...]]:
    """Apply ``op``: (its record without the free queue, why the pool refused it or None, blocks a free released)."""
    released: tuple[int, ...] = ()
    name = op["op"]
    req = op.get("req")
    salt = op.get("cache_salt")
    refused = None
    record = checks.blank_record(name, req)
    if name == "probe":
        found = cache.probe(op["tokens"], salt)
        record.update(num_cached_tokens=found.num_cached_tokens, hit_block_ids=list(found.hit_block_ids))
    elif name == "free":
        freed = cache.free(req)
        record["block_table"] = list(freed.block_table)
        released = freed.released
    else:
        try:
            if name == "alloc":
                result = cache.allocate(req, op["tokens"], salt)
            else:
                result = cache.append(req, op["tokens"])
        except OutOfBlocksError as exc:
            record["ok"] = False
            refused = str(exc)
            if name == "alloc":
                found = cache.lookup(op["tokens"], salt)  # the lookup vLLM did before refusing
                record.update(
                    num_cached_tokens=found.num_cached_tokens, hit_block_ids=list(found.hit_block_ids)
                )
            elif tables:
                record["block_table"] = list(cache.block_table(req))
        else:
            record.update(
                num_cached_tokens=result.num_cached_tokens,
                hit_block_ids=list(result.hit_block_ids),
                new_block_ids=list(result.new_block_ids),
                evicted=list(result.evicted),
            )
            if tables:  # --changes records leave the table out: an append then costs what it adds
                record["block_table"] = list(result.block_table)
    return record, refused, released
