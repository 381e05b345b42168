"""kvlab.models.prefix_cache: lesson examples 5 and 7, vLLM v1's own block-order expectations, invariants."""

from __future__ import annotations

import enum

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlab.core.hashing import block_hashes, check_token_ids, plain_token_ids
from kvlab.errors import (
    MAX_TOKEN_ID,
    DuplicateRequestError,
    InvalidArgumentError,
    OutOfBlocksError,
    UnknownRequestError,
    check_tokens,
    raised_limits,
)
from kvlab.lessons.ex07 import HashLabels, example_7
from kvlab.models.prefix_cache import PrefixCache
from kvlab.views.text import caption

# ---------------------------------------------------------------------- lesson example 7


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("scheme", ["lesson", "vllm"])
def test_example_7_evictions_and_queues(block_size, scheme):
    ex = example_7(block_size, hash_scheme=scheme)
    assert ex.evictions == ("a3", "b2", "b1")
    assert ex.queues == ((3, 4, 5, 2, 1, 0), (5, 2, 1, 0, 4, 3), (5, 1, 0))
    assert len(ex.history) == 8  # initial state + 7 operations
    after_c = ex.history[5].state
    assert after_c.hit_block_ids == (0, 1) and after_c.new_block_ids == (5,)
    assert after_c.free_queue == (2, 4, 3)  # C touched 0 and 1 out of the queue and took 5 from the front
    after_d = ex.history[6].state
    assert after_d.evicted_block_ids == (2, 4, 3)
    assert [after_d.blocks[b].block_hash for b in (2, 4, 3)] == ["d1", "d2", "d3"]
    final = ex.history[-1].state
    assert final.free_queue == (5, 1, 0)
    assert final.tables == (("D", (2, 4, 3)),)
    assert [final.blocks[b].status for b in (0, 1, 5)] == ["free, cached"] * 3
    assert "evicting a3 from block 2" in caption(ex.history[6])


def test_hash_labels_name_blocks_of_distinct_tokens():
    labels = HashLabels(4)
    a = labels.tokens(["a1", "a2"])
    c = labels.tokens(["a1", "c2"])
    assert a[:4] == c[:4] and a[4:] != c[4:]
    assert [labels[h] for h in block_hashes(a, 4)] == ["a1", "a2"]
    with pytest.raises(InvalidArgumentError, match="different prefix"):
        labels.tokens(["b1", "a2"])  # a2 already names the prefix a1, a2
    assert labels.tokens(["a1", "a2"]) == a  # the failed call changed nothing
    for bad in ("a1", [], ["a1", ""], [3]):
        with pytest.raises(InvalidArgumentError):
            labels.tokens(bad)


# ---------------------------------------------------------------------- lesson example 5


def system_prompt_request(question_len: int, question_start: int) -> list[int]:
    return [1000 + i for i in range(70)] + [question_start + i for i in range(question_len)]


def test_example_5_shared_system_prompt():
    cache = PrefixCache(16, 16)
    r1 = cache.allocate("request 1", system_prompt_request(20, 5000))
    r2 = cache.allocate("request 2", system_prompt_request(33, 6000))
    assert r1.block_table == (0, 1, 2, 3, 4, 5) and r1.num_cached_tokens == 0
    assert r2.block_table == (0, 1, 2, 3, 6, 7, 8)
    assert (r2.num_cached_tokens, r2.num_computed_tokens) == (64, 39)
    counts = {b: cache.ref_count(b) for b in range(16) if cache.ref_count(b)}
    assert counts == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1}
    assert cache.num_free_blocks == 16 - 9


# ---------------------------------------------------------------------- vLLM's rules


def test_last_token_rule_caps_hit_below_whole_prompt():
    cache = PrefixCache(8, 16)
    prompt = list(range(64))
    cache.allocate("first", prompt)
    again = cache.allocate("again", prompt)
    assert again.num_cached_tokens == 48 and again.hit_block_ids == (0, 1, 2)
    assert again.block_table == (0, 1, 2, 4)  # the last block is recomputed into a new block...
    last_hash = cache.block_hash(3)
    assert cache.block_hash(4) == last_hash  # ...and cached too: vLLM does not de-duplicate
    assert cache.cached_blocks()[last_hash] == (3, 4)
    assert cache.probe(prompt + [7]).num_cached_tokens == 64  # one more token: all 4 blocks can hit
    assert cache.probe(prompt).num_cached_tokens == 48
    assert cache.probe(prompt[:1]).num_cached_tokens == 0


def test_duplicate_hash_lookup_returns_oldest_cached_block():
    cache = PrefixCache(5, 4)
    prompt = list(range(8))
    cache.allocate("R1", prompt)  # blocks 0, 1
    cache.allocate("R2", prompt)  # hit 0, recompute into 2: blocks 1 and 2 share a hash
    assert cache.probe(prompt + [9]).hit_block_ids == (0, 1)
    cache.free("R1")  # block 1 -> free (0 is still held by R2)
    assert cache.free_queue() == [3, 4, 1]
    evict = cache.allocate("R3", [100 + i for i in range(12)])
    assert evict.new_block_ids == (3, 4, 1) and evict.evicted == (1,)
    assert cache.probe(prompt + [9]).hit_block_ids == (0, 2)  # the other copy still serves the hash


def test_lazy_eviction_keeps_freed_blocks_hittable_until_handed_out():
    cache = PrefixCache(6, 4)
    prompt = list(range(9))  # blocks 0, 1 full and cached, block 2 partial
    cache.allocate("A", prompt)
    cache.free("A")
    assert cache.free_queue() == [2, 3, 4, 5, 1, 0]
    cache.allocate("B", [50, 51, 52, 53, 54])  # takes 2 and 3: no cached content lost
    hit = cache.probe(prompt)
    assert hit.hit_block_ids == (0, 1) and cache.free_queue() == [4, 5, 1, 0]
    taken = cache.allocate("C", [60 + i for i in range(11)])  # takes 4, 5, then 1: a2 is evicted
    assert taken.new_block_ids == (4, 5, 1) and taken.evicted == (1,)
    assert cache.block_hash(1) is None and len(taken.evicted_hashes) == 1
    assert cache.probe(prompt).hit_block_ids == (0,)  # the chain now stops after block 0


def test_freed_hit_block_is_touched_out_of_the_queue():
    cache = PrefixCache(6, 4)
    cache.allocate("A", list(range(8)))
    cache.free("A")
    assert cache.free_queue() == [2, 3, 4, 5, 1, 0]
    b = cache.allocate("B", list(range(8)) + [8])
    assert b.hit_block_ids == (0, 1) and b.new_block_ids == (2,)
    assert cache.free_queue() == [3, 4, 5]
    assert (cache.ref_count(0), cache.ref_count(1)) == (1, 1)


def test_unhashed_partial_blocks_go_to_the_front():
    cache = PrefixCache(8, 4)
    cache.allocate("A", list(range(10)))  # 0, 1 hashed; 2 partial
    cache.allocate("B", [90, 91, 92, 93, 94])  # 3 hashed; 4 partial
    cache.free("A")
    assert cache.free_queue() == [2, 5, 6, 7, 1, 0]
    cache.free("B")
    assert cache.free_queue() == [4, 2, 5, 6, 7, 1, 0, 3]


def test_vllm_test_prefill_block_orders():
    """The block ids vLLM's tests/v1/core/test_prefix_caching.py::test_prefill expects (11 blocks, null block)."""
    cache = PrefixCache(11, 16, null_block=True, hash_scheme="vllm")
    common = [i for i in range(3) for _ in range(16)]
    r0 = cache.allocate("0", common + [3] * 7)
    assert r0.block_table == (1, 2, 3, 4)
    assert [cache.block_hash(b) for b in (1, 2, 3)] == block_hashes(common, 16, scheme="vllm")
    assert cache.block_hash(4) is None
    r1 = cache.allocate("1", common + [3] * 5)
    assert r1.hit_block_ids == (1, 2, 3) and r1.num_cached_tokens == 48 and r1.new_block_ids == (5,)
    assert cache.num_free_blocks == 5
    cache.free("0")
    cache.free("1")
    assert cache.free_queue() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    r2 = cache.allocate("2", common + [3] * 6)
    assert r2.hit_block_ids == (1, 2, 3) and r2.new_block_ids == (5,)
    assert cache.num_free_blocks == 6
    cache.free("2")
    r3 = cache.allocate("3", [99] * 160)
    assert r3.new_block_ids == (5, 4, 6, 7, 8, 9, 10, 3, 2, 1)
    assert r3.evicted == (3, 2, 1)
    assert cache.free_queue() == [] and cache.num_free_blocks == 0


def test_vllm_test_evict_block_orders():
    """vLLM's test_evict: the partial block to the front, full blocks to the back in reverse order."""
    cache = PrefixCache(11, 16, null_block=True, hash_scheme="vllm")
    cache.allocate("0", list(range(87)))
    cache.allocate("1", list(range(87, 87 + 48)))
    assert cache.num_free_blocks == 1
    cache.free("0")
    assert cache.free_queue() == [6, 10, 5, 4, 3, 2, 1]
    cache.free("1")
    assert cache.free_queue() == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    r2 = cache.allocate("2", list(range(35)))
    assert r2.hit_block_ids == (1, 2) and r2.num_cached_tokens == 32 and r2.new_block_ids == (6,)
    assert cache.num_free_blocks == 7


def test_vllm_test_decode_caches_blocks_as_they_fill():
    cache = PrefixCache(11, 16, null_block=True, hash_scheme="vllm")
    common = [i for i in range(3) for _ in range(16)]
    cache.allocate("0", common + [3] * 7)
    step = cache.append("0", [8] * 4)
    assert step.new_block_ids == () and cache.block_hash(4) is None
    step = cache.append("0", [7] * 19)  # fills block 4, spills 10 tokens into a new block
    assert step.new_block_ids == (5,)
    assert (step.num_tokens, step.num_new_tokens, step.num_computed_tokens) == (78, 19, 19)
    table = cache.block_table("0")
    assert cache.block_hash(table[-2]) is not None and cache.block_hash(table[-1]) is None
    full = common + [3] * 7 + [8] * 4 + [7] * 19
    assert cache.block_hash(4) == block_hashes(full, 16, scheme="vllm")[3]


def test_decoded_blocks_are_hit_by_the_next_turn():
    cache = PrefixCache(8, 4)
    cache.allocate("turn 1", [1, 2, 3, 4, 5, 6])
    cache.append("turn 1", [7, 8, 9])  # the answer fills block 1 -> cached at once
    nxt = cache.probe([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert nxt.num_cached_tokens == 8 and nxt.hit_block_ids == (0, 1)


def test_refusal_counts_free_hit_blocks_and_changes_nothing(refuses):
    cache = PrefixCache(3, 4, record=True)
    cache.allocate("A", list(range(8)))
    cache.free("A")
    assert cache.free_queue() == [2, 1, 0]
    # 2 free hit blocks + 2 new blocks > 3 free blocks, although 2 new blocks alone would fit
    refuses(
        cache,
        lambda c: c.allocate("B", list(range(16))),
        OutOfBlocksError,
        "2 new blocks plus the 2 free cached blocks",
    )
    assert cache.requests == ()
    ok = cache.allocate("B", list(range(12)))  # 2 hits + 1 new fits exactly
    assert ok.hit_block_ids == (0, 1) and ok.new_block_ids == (2,)
    with pytest.raises(OutOfBlocksError):
        cache.append("B", [1, 2])
    assert cache.block_table("B") == (0, 1, 2) and cache.num_tokens("B") == 12


@pytest.mark.parametrize("scheme", ["lesson", "vllm"])
def test_cache_salt_isolates_tenants(scheme):
    cache = PrefixCache(16, 4, hash_scheme=scheme)
    prompt = list(range(13))
    cache.allocate("t1", prompt, cache_salt="tenant-1")
    assert cache.probe(prompt, cache_salt="tenant-1").num_cached_tokens == 12
    assert cache.probe(prompt, cache_salt="tenant-2").num_cached_tokens == 0
    assert cache.probe(prompt).num_cached_tokens == 0
    cache.allocate("plain", prompt)
    assert cache.probe(prompt).num_cached_tokens == 12
    assert cache.probe(prompt, cache_salt="tenant-2").num_cached_tokens == 0


def test_null_block_is_reserved_as_in_vllm():
    cache = PrefixCache(4, 2, null_block=True, record=True)
    assert cache.null_block == 0 and cache.free_queue() == [1, 2, 3] and cache.num_free_blocks == 3
    assert cache.allocate("A", [1, 2, 3, 4, 5]).block_table == (1, 2, 3)
    with pytest.raises(OutOfBlocksError):
        cache.allocate("B", [9])
    cache.free("A")
    assert cache.free_queue() == [3, 2, 1]
    state = cache.snapshot()
    assert state.null_block == 0 and state.blocks[0].status == "null" and 0 not in state.free_queue
    lesson = PrefixCache(4, 2)
    assert lesson.null_block is None and lesson.free_queue() == [0, 1, 2, 3]


def test_history_records_each_successful_call():
    cache = PrefixCache(4, 2, record=True)
    cache.allocate("A", [1, 2, 3])
    cache.probe([1, 2, 3])
    cache.append("A", [4])
    cache.free("A")
    assert len(cache.history) == 5
    assert cache.history[0].state.free_queue == (0, 1, 2, 3)
    assert cache.history[1].state.new_block_ids == (0, 1)
    assert cache.history[2].state.hit_block_ids == (0,)
    assert cache.history[-1].state.free_queue == (2, 3, 1, 0)
    assert cache.history[1].state.blocks[0].tokens == (1, 2)
    assert cache.history[3].state.blocks[1].tokens == (3, 4)
    assert PrefixCache(4, 2).history is None


# ---------------------------------------------------------------------- bad input


def _state(cache: PrefixCache):
    return cache.snapshot(), cache.cached_blocks(), cache.requests


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.allocate("A", [1, 2]), DuplicateRequestError),
        (lambda c: c.allocate("", [1, 2]), InvalidArgumentError),
        (lambda c: c.allocate(7, [1, 2]), InvalidArgumentError),
        (lambda c: c.allocate("B", []), InvalidArgumentError),
        (lambda c: c.allocate("B", "12"), InvalidArgumentError),
        (lambda c: c.allocate("B", [1, 2.0]), InvalidArgumentError),
        (lambda c: c.allocate("B", [1, True]), InvalidArgumentError),
        (lambda c: c.allocate("B", [1, -3]), InvalidArgumentError),
        (lambda c: c.allocate("B", [2**31]), InvalidArgumentError),
        (lambda c: c.allocate("B", [1, 2], cache_salt=""), InvalidArgumentError),
        (lambda c: c.allocate("B", [1, 2], cache_salt=5), InvalidArgumentError),
        (lambda c: c.allocate("B", list(range(40))), OutOfBlocksError),
        (lambda c: c.append("nobody", [1]), UnknownRequestError),
        (lambda c: c.append("A", []), InvalidArgumentError),
        (lambda c: c.append("A", [None]), InvalidArgumentError),
        (lambda c: c.append("A", list(range(40))), OutOfBlocksError),
        (lambda c: c.free("nobody"), UnknownRequestError),
        (lambda c: c.free(None), InvalidArgumentError),
        (lambda c: c.probe([]), InvalidArgumentError),
        (lambda c: c.probe([1], cache_salt=b"x"), InvalidArgumentError),
        (lambda c: c.block_table("nobody"), UnknownRequestError),
        (lambda c: c.ref_count(99), InvalidArgumentError),
        (lambda c: c.block_hash(-1), InvalidArgumentError),
    ],
)
def test_bad_calls_raise_and_change_nothing(call, error):
    cache = PrefixCache(8, 4, record=True)
    cache.allocate("A", list(range(10)))
    cache.allocate("X", [7, 7, 7, 7, 7])
    cache.free("X")
    before, steps = _state(cache), len(cache.history)
    with pytest.raises(error) as info:
        call(cache)
    assert str(info.value)  # a message that says what was wrong
    assert _state(cache) == before and len(cache.history) == steps


def test_double_free_is_an_unknown_request():
    cache = PrefixCache(4, 4)
    cache.allocate("A", [1])
    cache.free("A")
    with pytest.raises(UnknownRequestError, match="already freed"):
        cache.free("A")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_blocks": 0, "block_size": 4},
        {"num_blocks": 4, "block_size": 0},
        {"num_blocks": True, "block_size": 4},
        {"num_blocks": 4, "block_size": 2.0},
        {"num_blocks": 4, "block_size": 4, "null_block": 1},
        {"num_blocks": 4, "block_size": 4, "hash_scheme": "md5"},
        {"num_blocks": 4, "block_size": 4, "record": "yes"},
    ],
)
def test_bad_construction(kwargs):
    with pytest.raises(InvalidArgumentError):
        PrefixCache(**kwargs)


# ---------------------------------------------------------------------- invariants, against a list model


class ListModel:
    """The same rules written the slow, obvious way (list scans), as an independent check."""

    def __init__(self, num_blocks: int, block_size: int, null_block: bool, scheme: str) -> None:
        self.bs, self.scheme = block_size, scheme
        self.queue = list(range(1 if null_block else 0, num_blocks))
        self.ref = [0] * num_blocks
        self.hash: list[bytes | None] = [None] * num_blocks
        self.map: dict[bytes, list[int]] = {}
        self.reqs: dict[str, tuple[list[int], list[int], str | None]] = {}

    def _hashes(self, toks, salt):
        return block_hashes(toks, self.bs, salt=salt, scheme=self.scheme)

    def lookup(self, toks, salt):
        hits = []
        for h in self._hashes(toks, salt)[: (len(toks) - 1) // self.bs]:
            if not self.map.get(h):
                break
            hits.append(self.map[h][0])
        return hits

    def _take(self, n):
        new, evicted = self.queue[:n], []
        del self.queue[:n]
        for b in new:
            if self.hash[b] is not None:
                self.map[self.hash[b]].remove(b)
                if not self.map[self.hash[b]]:
                    del self.map[self.hash[b]]
                self.hash[b] = None
                evicted.append(b)
            self.ref[b] = 1
        return new, evicted

    def _cache(self, toks, table, salt):
        for i, h in enumerate(self._hashes(toks, salt)):
            if self.hash[table[i]] is None:
                self.hash[table[i]] = h
                self.map.setdefault(h, []).append(table[i])

    def alloc(self, rid, toks, salt):
        hits = self.lookup(toks, salt)
        need = -(-len(toks) // self.bs) - len(hits)
        if need + sum(self.ref[b] == 0 for b in hits) > len(self.queue):
            return None
        for b in hits:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1
        new, evicted = self._take(need)
        self.reqs[rid] = (list(toks), hits + new, salt)
        self._cache(toks, hits + new, salt)
        return hits, new, evicted

    def append(self, rid, toks):
        old, table, salt = self.reqs[rid]
        need = -(-(len(old) + len(toks)) // self.bs) - len(table)
        if need > len(self.queue):
            return None
        new, evicted = self._take(need)
        self.reqs[rid] = (old + list(toks), table + new, salt)
        self._cache(old + list(toks), table + new, salt)
        return [], new, evicted

    def free(self, rid):
        _, table, _ = self.reqs.pop(rid)
        for b in table:
            self.ref[b] -= 1
        released = [b for b in reversed(table) if self.ref[b] == 0]
        self.queue = [b for b in released if self.hash[b] is None] + self.queue
        self.queue += [b for b in released if self.hash[b] is not None]


PREFIXES = [list(range(1, 13)), [1, 2, 3, 4, 5, 6, 40, 41, 42, 43, 44, 45], list(range(60, 72))]
prompts = st.builds(
    lambda base, cut, tail: (PREFIXES[base][:cut] + tail) or [0],
    st.integers(0, 2),
    st.integers(0, 12),
    st.lists(st.integers(0, 3), max_size=6),
)


class PrefixCacheMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.integers(1, 4),
        num_blocks=st.integers(2, 16),
        null_block=st.booleans(),
        scheme=st.sampled_from(["lesson", "vllm"]),
    )
    def setup(self, block_size, num_blocks, null_block, scheme):
        self.cache = PrefixCache(num_blocks, block_size, null_block=null_block, hash_scheme=scheme)
        self.model = ListModel(num_blocks, block_size, null_block, scheme)
        self.next_id = 0

    def _same(self, result, expected):
        if expected is None:
            assert result is None
            return
        hits, new, evicted = expected
        assert result.hit_block_ids == tuple(hits)
        assert result.new_block_ids == tuple(new)
        assert result.evicted == tuple(evicted)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except OutOfBlocksError:
            return None

    @rule(tokens=prompts, salt=st.sampled_from([None, None, "s"]))
    def alloc(self, tokens, salt):
        rid = f"r{self.next_id}"
        self.next_id += 1
        before = self.cache.snapshot()
        result = self._call(self.cache.allocate, rid, tokens, salt)
        self._same(result, self.model.alloc(rid, tokens, salt))
        if result is None:
            assert self.cache.snapshot() == before

    @precondition(lambda self: self.cache.requests)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=5))
    def append(self, data, tokens):
        rid = data.draw(st.sampled_from(self.cache.requests))
        self._same(self._call(self.cache.append, rid, tokens), self.model.append(rid, tokens))

    @precondition(lambda self: self.cache.requests)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(self.cache.requests))
        self.cache.free(rid)
        self.model.free(rid)

    @rule(tokens=prompts, salt=st.sampled_from([None, "s"]))
    def probe(self, tokens, salt):
        assert self.cache.probe(tokens, salt).hit_block_ids == tuple(self.model.lookup(tokens, salt))

    @invariant()
    def matches_list_model(self):
        assert self.cache.free_queue() == self.model.queue

    @invariant()
    def blocks_are_free_or_referenced(self):
        state = self.cache.snapshot()
        queue = state.free_queue
        assert len(queue) == len(set(queue)) == self.cache.num_free_blocks
        holders: dict[int, int] = {}
        for _, table in state.tables:
            for b in table:
                holders[b] = holders.get(b, 0) + 1
        for block in state.blocks:
            if block.is_null:
                assert block.block_id not in queue and block.block_id not in holders
                continue
            assert block.ref_count == holders.get(block.block_id, 0)
            assert (block.block_id in queue) == (block.ref_count == 0)
        for rid, table in state.tables:
            assert len(table) == -(-state.num_tokens(rid) // state.block_size)

    @invariant()
    def hash_map_agrees_with_blocks(self):
        mapped = self.cache.cached_blocks()
        for h, ids in mapped.items():
            assert ids and all(self.cache.block_hash(b) == h for b in ids)
        for b in range(self.cache.num_blocks):
            h = self.cache.block_hash(b)
            if h is not None:
                assert b in mapped[h]


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_prefix_cache_invariants = PrefixCacheMachine.TestCase


def test_a_result_keeps_the_table_it_had_while_the_request_grows():
    cache = PrefixCache(16, 4)
    first = cache.allocate("A", [1, 2, 3, 4, 5])
    grown = cache.append("A", [6, 7, 8, 9])
    assert first.block_table == (0, 1) and grown.block_table == (0, 1, 2)
    assert (hash(first.block_table), repr(first.block_table)) == (hash((0, 1)), "(0, 1)")
    assert list(first.block_table) == [0, 1] and first.block_table[-1] == 1
    assert cache.free("A").block_table == (0, 1, 2) and first.block_table == (0, 1)


@pytest.mark.parametrize("scheme", ["lesson", "vllm"])
def test_blocks_hashed_again_from_the_cache_keep_the_digests_of_the_chain(scheme):
    cache = PrefixCache(32, 4, hash_scheme=scheme)
    prompt = [7, 1, 7, 1, 7, 1, 7, 1, 3, 3, 3, 3, 5]
    cache.allocate("A", prompt, cache_salt="t1")
    cache.free("A")
    again = cache.allocate("B", prompt + [9, 9, 9, 9], cache_salt="t1")  # its first blocks hit the cache
    cache.append("B", [2, 2, 2])
    digests = [cache.block_hash(b) for b in cache.block_table("B")]
    assert again.hit_block_ids == (0, 1, 2)
    assert digests == block_hashes(prompt + [9, 9, 9, 9, 2, 2, 2], 4, salt="t1", scheme=scheme)


# ---------------------------------------------------------------------- the token check at the entry


class _Token(enum.IntEnum):
    SEVEN = 7


_ids = st.one_of(
    st.integers(0, 300),
    st.integers(0, MAX_TOKEN_ID),
    st.sampled_from([0, 255, 256, 65535, 65536, MAX_TOKEN_ID]),
)
_odd_ids = st.one_of(
    st.sampled_from(
        [-1, MAX_TOKEN_ID + 1, 2**63, 10**400, True, False, 1.0, _Token.SEVEN, None, "1", [1], (1,)]
    ),
    st.builds(np.int64, st.integers(0, 9)),
    st.builds(np.bool_, st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_ids, _odd_ids), max_size=60), st.booleans())
def test_the_fast_token_check_decides_as_check_tokens_does(tokens, as_tuple):
    """Plain lists take the C-level path; every list gets check_tokens' answer, as plain ints."""
    value = tuple(tokens) if as_tuple else tokens
    try:
        expected = check_tokens("tokens", value)
    except InvalidArgumentError:
        with pytest.raises(InvalidArgumentError):
            check_token_ids("tokens", value)
        assert not plain_token_ids(value)
        return
    got = check_token_ids("tokens", value)
    assert got == expected and all(type(t) is int for t in got)
    assert plain_token_ids(value) == all(type(t) is int for t in tokens)


@pytest.mark.parametrize("size", [1, 24, 25, 1000])
def test_the_fast_token_check_vouches_for_plain_lists_of_every_size(size):
    tokens = [(i * 7919) % (MAX_TOKEN_ID + 1) for i in range(size)] + [MAX_TOKEN_ID]
    assert plain_token_ids(tokens) and plain_token_ids(tuple(tokens))
    for bad in (-1, MAX_TOKEN_ID + 1, True, _Token.SEVEN, np.int64(3), 2.0):
        assert not plain_token_ids(tokens[:-1] + [bad])
    with raised_limits(tokens=size + 1):
        assert plain_token_ids(tokens) and not plain_token_ids(tokens + [0])


def test_shared_nested_items_are_refused_without_copying_them():
    big = [0] * 100_000
    with pytest.raises(InvalidArgumentError):
        PrefixCache(8, 4).allocate("A", [1] * 30 + [big] * 1000)  # marshal would copy 10**8 items
    with pytest.raises(InvalidArgumentError):
        PrefixCache(8, 4).allocate("A", [1] * 30 + [10**100_000] * 1000)


class _IndexBytes(bytes):
    """A buffer that says it is the integer 1: struct took it, and marshal copies its bytes."""

    def __index__(self) -> int:
        return 1


def test_a_shared_buffer_that_claims_to_be_an_integer_is_refused_without_copying_it():
    import tracemalloc

    tokens = [1] * 30 + [_IndexBytes(b"x" * 1_000_000)] * 3000  # copied each time: 3 GB
    tracemalloc.start()
    try:
        assert not plain_token_ids(tokens)
        with pytest.raises(InvalidArgumentError, match=r"tokens\[30\] must be an integer"):
            block_hashes(tokens, 16, scheme="vllm")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2**20


def test_full_blocks_keep_their_tokens_once_the_request_is_gone():
    cache = PrefixCache(16, 4, hash_scheme="vllm")
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    cache.allocate("A", prompt)
    cache.append("A", [14, 15, 16, 17])
    cache.free("A")
    assert [b.tokens for b in cache.snapshot().blocks[:4]] == [
        (5, 6, 7, 8),
        (9, 10, 11, 12),
        (13, 14, 15, 16),
        (17,),
    ]
    again = cache.allocate("B", prompt + [14, 15, 16, 99])  # 3 full blocks hit (the cap leaves the last one)
    assert again.hit_block_ids == (0, 1, 2) and cache.block_table("B")[:3] == (0, 1, 2)
    assert cache.cached_blocks() == {cache.block_hash(b): (b,) for b in (0, 1, 2)}


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 8),
    st.integers(1, 60),
    st.integers(0, 10**6),
    st.sampled_from([-1, -(2**40), MAX_TOKEN_ID + 1, 2**32, 2**40, True, 3.0]),
    st.sampled_from(["allocate", "probe", "lookup"]),
)
def test_an_id_past_a_cache_hit_is_refused_and_changes_nothing(prefix_blocks, tail, where, bad, op):
    """A prompt's hit blocks vouch for their ids; every other id still gets the range check, before any change."""
    cache = PrefixCache(64, 4, hash_scheme="vllm", record=True)
    cached = list(range(100, 132))
    cache.allocate("A", cached)
    cache.free("A")  # its blocks stay cached, free: a hit takes them out of the queue
    prompt = cached[: 4 * prefix_blocks] + list(range(500, 500 + tail))
    call = (lambda p: cache.allocate("B", p)) if op == "allocate" else getattr(cache, op)
    expected = call(list(prompt))  # the same prompt with every id in range: the hit is real
    assert len(expected.hit_block_ids) == min(prefix_blocks, (len(prompt) - 1) // 4)
    if op == "allocate":
        cache.free("B")
    before, steps = cache.snapshot(), len(cache.history)
    prompt[where % len(prompt)] = bad
    with pytest.raises(InvalidArgumentError, match=r"tokens\[\d+\]"):
        call(prompt)
    assert cache.snapshot() == before and len(cache.history) == steps


class _BufferInt(int):
    """An int subclass that is also a buffer (Python 3.12+ honours ``__buffer__``): its code must never run."""

    calls = 0

    def __buffer__(self, flags):
        type(self).calls += 1
        return memoryview(b"abcd")


def test_an_int_subclass_that_is_a_buffer_is_never_read_as_a_buffer():
    """The fast check does not vouch for it (no code of its own runs); check_tokens takes it as the plain int it is."""
    tokens = [1] * 30 + [_BufferInt(2)]
    assert not plain_token_ids(tokens)
    cache = PrefixCache(16, 4, hash_scheme="vllm")
    cache.allocate("A", tokens)
    assert (
        cache.snapshot().blocks[7].tokens == (1, 1, 2) and type(cache.snapshot().blocks[7].tokens[2]) is int
    )
    assert block_hashes(tokens, 4, scheme="vllm") == block_hashes([1] * 30 + [2], 4, scheme="vllm")
    assert _BufferInt.calls == 0


class _Yes(type):
    """A metaclass whose classes claim to equal every other class: ``type(t) == int`` is True for them."""

    def __eq__(cls, other):
        _Yes.calls += 1
        return True

    __hash__ = type.__hash__
    calls = 0


class _LyingInt(int, metaclass=_Yes):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class _LyingObject(metaclass=_Yes):
    pass


def test_a_metaclass_that_claims_to_be_int_is_never_asked():
    """The type check compares by identity: a type that says it equals int is neither asked nor believed."""
    cache = PrefixCache(16, 4, record=True)
    cache.allocate("A", [0] * 32)
    before, steps = cache.snapshot(), len(cache.history)
    liars = [_LyingInt(2**40)] * 28 + [0] * 4  # would "hit" A's blocks and skip the range check
    for tokens in (liars, [_LyingObject()] * 30):
        assert not plain_token_ids(tokens)
        for call in (lambda t: cache.allocate("B", t), cache.probe, cache.lookup):
            with pytest.raises(InvalidArgumentError):
                call(tokens)
        with pytest.raises(InvalidArgumentError):
            block_hashes(tokens, 4, scheme="vllm")
    assert _Yes.calls == 0
    assert cache.snapshot() == before and len(cache.history) == steps
