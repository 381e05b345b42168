"""Hostile input for the block-pool models: kvlab's own error and an unchanged model, never a crash.

Each constructor and operation of ContiguousPool, BlockPool, PrefixCache, FreeBlockQueue and
utilization gets values from ``tests/hostile.py`` in every argument. A call either works (a numpy
int or an int subclass is a valid integer) or is refused with ``KvlabError`` leaving the model's
snapshot and history exactly as they were. Absurd sizes are refused at once, naming the limit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hostile import AlwaysEqual, BadRepr, hostile_values, kvlab_or_ok, quick_refusal, refused_or_ok
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError, raised_limits
from kvlab.models import utilization
from kvlab.models.contiguous import ContiguousPool
from kvlab.models.free_queue import Block, FreeBlockQueue
from kvlab.models.paged import BlockPool
from kvlab.models.prefix_cache import PrefixCache

FAST = settings(max_examples=40, deadline=None)


# ---------------------------------------------------------------- absurd sizes, refused at once


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: PrefixCache(10**30, 4), "LIMITS.num_blocks"),
        (lambda: PrefixCache(4, 10**30), "LIMITS.block_size"),
        (lambda: BlockPool(10**30), "LIMITS.num_blocks"),
        (lambda: BlockPool(4).allocate("A", 10**30), "LIMITS.tokens"),
        (lambda: BlockPool(4).allocate("A", np.int64(2**40)), "LIMITS.tokens"),
        (lambda: BlockPool(4, free_order=iter(int, 1)), "free_order must list every block id"),
        (lambda: ContiguousPool(10**30), "LIMITS.tokens"),
        (lambda: ContiguousPool(8).reserve("A", 10**30), "LIMITS.tokens"),
        (lambda: utilization.request_lengths(count=10**30), "LIMITS.count"),
        (lambda: utilization.request_lengths(spread=10**30), "LIMITS.tokens"),
        (lambda: utilization.fill_paged([10**30]), "LIMITS.tokens"),
        (lambda: utilization.fill_reserving([1], pool_size=10**30), "LIMITS.tokens"),
        (lambda: PrefixCache(4, 4).allocate("A", iter(int, 1)), "LIMITS.tokens"),
        (lambda: PrefixCache(4, 4, hash_scheme=np.array(["lesson"])), "unknown hash scheme"),
        (lambda: PrefixCache(4, 4, hash_scheme=AlwaysEqual()), "unknown hash scheme"),
        (lambda: BlockPool(4, hash_scheme=AlwaysEqual()), "unknown hash_scheme"),
        (lambda: PrefixCache(4, 4).allocate(BadRepr(), [1]), "must be a non-empty string"),
        (lambda: PrefixCache(4, 4).free(BadRepr()), "must be a string"),
        (lambda: BlockPool(4).free(BadRepr()), "must be a string"),
        (lambda: BlockPool(4, block_size=4.0), "pass an int"),
    ],
)
def test_absurd_arguments_are_refused_at_once(call, match):
    quick_refusal(call, match)


def test_raised_limits_lifts_a_bound_deliberately():
    with raised_limits(num_blocks=8):  # a lowered bound, so the test stays small
        assert PrefixCache(8, 1).num_blocks == 8
        with pytest.raises(KvlabError, match=r"at most 8 \(kvlab's limit LIMITS.num_blocks\)"):
            PrefixCache(9, 1)
    assert PrefixCache(9, 1).num_blocks == 9


# ---------------------------------------------------------------- constructors


@FAST
@given(
    value=hostile_values(),
    which=st.sampled_from(["num_blocks", "block_size", "null_block", "hash_scheme", "record"]),
)
def test_prefix_cache_constructor(value, which):
    args: dict[str, Any] = {"num_blocks": 6, "block_size": 4, which: value}
    kvlab_or_ok(lambda: PrefixCache(**args))


@FAST
@given(
    value=hostile_values(),
    which=st.sampled_from(
        [
            "num_blocks",
            "block_size",
            "free_order",
            "share_prefixes",
            "recompute_last_token",
            "hash_scheme",
            "record",
        ]
    ),
)
def test_block_pool_constructor(value, which):
    args: dict[str, Any] = {"num_blocks": 6, "block_size": 4, which: value}
    kvlab_or_ok(lambda: BlockPool(**args))


@FAST
@given(value=hostile_values(), which=st.sampled_from(["pool_size", "record"]))
def test_contiguous_constructor(value, which):
    args: dict[str, Any] = {"pool_size": 64, which: value}
    kvlab_or_ok(lambda: ContiguousPool(**args))


@FAST
@given(value=hostile_values())
def test_free_queue_refuses_hostile_blocks(value):
    kvlab_or_ok(lambda: FreeBlockQueue(value))
    kvlab_or_ok(lambda: Block(value))
    for call in (
        lambda q: q.popleft_n(value),
        lambda q: q.remove(value),
        lambda q: q.append_n(value),
        lambda q: q.prepend_n([value]),
    ):
        queue = FreeBlockQueue([Block(i) for i in range(4)])
        if not kvlab_or_ok(lambda call=call, queue=queue: call(queue)):
            assert [b.block_id for b in queue] == [0, 1, 2, 3] and len(queue) == 4


# ---------------------------------------------------------------- operations on a model that holds requests


def _prefix_cache() -> PrefixCache:
    cache = PrefixCache(8, 4, record=True)
    cache.allocate("A", list(range(10)))
    cache.allocate("B", list(range(6)), cache_salt="t")
    cache.free("B")
    return cache


def _block_pool() -> BlockPool:
    pool = BlockPool(8, 4, share_prefixes=True, record=True)
    pool.allocate("A", list(range(10)))
    pool.fork("A", "C")
    return pool


@FAST
@given(value=hostile_values(), op=st.integers(0, 9))
def test_prefix_cache_operations_refuse_and_change_nothing(value, op):
    calls = [
        lambda c: c.allocate(value, [1, 2, 3]),
        lambda c: c.allocate("N", value),
        lambda c: c.allocate("N", [1, 2, 3], cache_salt=value),
        lambda c: c.append(value, [1]),
        lambda c: c.append("A", value),
        lambda c: c.free(value),
        lambda c: c.lookup(value),
        lambda c: c.probe([1, 2], cache_salt=value),
        lambda c: c.ref_count(value),
        lambda c: c.block_hash(value),
    ]
    refused_or_ok(_prefix_cache(), calls[op])


@FAST
@given(value=hostile_values(), op=st.integers(0, 10))
def test_block_pool_operations_refuse_and_change_nothing(value, op):
    calls = [
        lambda p: p.allocate(value, [1, 2, 3]),
        lambda p: p.allocate("N", value),
        lambda p: p.append(value, 1),
        lambda p: p.append("A", value),
        lambda p: p.fork(value, "D"),
        lambda p: p.fork("A", value),
        lambda p: p.free(value),
        lambda p: p.ref_count(value),
        lambda p: p.blocks_needed(value),
        lambda p: p.translate("A", value),
        lambda p: p.slot_mapping(value),
    ]
    refused_or_ok(_block_pool(), calls[op])


@FAST
@given(value=hostile_values(), op=st.integers(0, 5))
def test_contiguous_operations_refuse_and_change_nothing(value, op):
    pool = ContiguousPool(64, record=True)
    pool.reserve("A", 16, used=10)
    calls = [
        lambda p: p.reserve(value, 8),
        lambda p: p.reserve("N", value),
        lambda p: p.reserve("N", 8, used=value),
        lambda p: p.release(value),
        lambda p: p.region(value),
        lambda p: p.find_gap(value),
    ]
    refused_or_ok(pool, calls[op])


@FAST
@given(value=hostile_values(), which=st.sampled_from(["seed", "count", "shortest", "spread"]))
def test_request_lengths_refuses_hostile_arguments(value, which):
    args: dict[str, Any] = {"seed": 5, "count": 4, which: value}
    kvlab_or_ok(lambda: utilization.request_lengths(**args))


@FAST
@given(value=hostile_values(), which=st.sampled_from(["lengths", "pool_size", "size", "record"]))
def test_fills_refuse_hostile_arguments(value, which):
    args: dict[str, Any] = {"lengths": [100, 200], "pool_size": 1024, "record": False, which: value}
    size = args.pop("size", None)
    kvlab_or_ok(lambda: utilization.fill_reserving(**args, **({} if size is None else {"max_len": size})))
    kvlab_or_ok(lambda: utilization.fill_paged(**args, **({} if size is None else {"block_size": size})))
    kvlab_or_ok(lambda: utilization.compare_utilization(**args))
