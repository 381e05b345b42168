"""BlockPool: block tables, slot mapping, ref counts, copy-on-write, prefix sharing (examples 2, 4, 5)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvlab.core.hashing import block_hashes, short
from kvlab.errors import (
    DuplicateRequestError,
    InvalidArgumentError,
    OutOfBlocksError,
    UnknownRequestError,
)
from kvlab.lessons.ex02 import example_2
from kvlab.lessons.ex04 import example_4, parallel_sampling
from kvlab.lessons.ex05 import example_5, shared_prefix, system_prompt_request
from kvlab.models.paged import UNKNOWN_TOKEN, BlockPool, Copy

# ---------------------------------------------------------------- example 2


def test_example_2_block_tables():
    ex = example_2()
    assert ex.tables == {"A": (7, 2, 9), "B": (4, 0)}
    assert ex.free_queue == (5, 11, 3)


def test_example_2_translations():
    rows = [
        (t.request_id, t.position, t.logical_block, t.offset, t.physical_block, t.slot)
        for t in example_2().translations
    ]
    assert rows == [
        ("A", 0, 0, 0, 7, 112),
        ("A", 15, 0, 15, 7, 127),
        ("A", 16, 1, 0, 2, 32),
        ("A", 36, 2, 4, 9, 148),
        ("B", 19, 1, 3, 0, 3),
    ]


def test_example_2_history_ends_with_the_lesson_state():
    final = example_2().history[-1].state
    assert final.table("A") == (7, 2, 9) and final.table("B") == (4, 0)
    assert final.num_tokens("A") == 37 and final.num_tokens("B") == 20
    assert final.free_queue == (5, 11, 3)


def test_slot_mapping_is_physical_times_block_size_plus_offset():
    pool = BlockPool(12, 16, free_order=[7, 2, 9, 4, 0, 5, 11, 3, 1, 6, 8, 10])
    pool.allocate("A", 37)
    mapping = pool.slot_mapping("A")
    assert len(mapping) == 37
    assert mapping[:16] == list(range(112, 128))
    assert mapping[16:32] == list(range(32, 48))
    assert mapping[32:] == list(range(144, 149))
    assert [pool.translate("A", p).slot for p in range(37)] == mapping


# ---------------------------------------------------------------- example 4


def test_example_4_fork_shares_every_block():
    ex = example_4()
    assert ex.tables_after_fork == ((0, 1, 2),) * 3
    assert ex.ref_counts_after_fork == {0: 3, 1: 3, 2: 3}


def test_example_4_copy_on_write():
    ex = example_4()
    assert [w.copy for w in ex.writes] == [Copy(2, 3, 8), Copy(2, 4, 8), None]  # sample 2 writes in place
    assert ex.tables == ((0, 1, 3), (0, 1, 4), (0, 1, 2))
    assert ex.ref_counts == {0: 3, 1: 3, 2: 1, 3: 1, 4: 1}
    assert (ex.blocks_used, ex.blocks_without_sharing) == (5, 9)


def test_example_4_snapshots_mark_the_copy():
    states = example_4().history.states
    copies = [s.copied_blocks for s in states if s.copied_blocks]
    assert copies == [((2, 3),), ((2, 4),)]
    final = states[-1]
    assert [final.num_tokens(f"sample {i}") for i in range(3)] == [41, 41, 41]
    assert [b.num_tokens for b in final.blocks[:5]] == [16, 16, 9, 9, 9]


def test_parallel_sampling_full_last_block_never_copies():
    ex = parallel_sampling(32, 4, block_size=16)
    assert all(w.copy is None for w in ex.writes)
    assert ex.tables == ((0, 1, 2), (0, 1, 3), (0, 1, 4), (0, 1, 5))


def test_copy_keeps_the_token_ids():
    pool = BlockPool(8, 4)
    pool.allocate("p", [10, 11, 12, 13, 14, 15])
    pool.fork("p", "c")
    result = pool.append("c", [99])
    assert result.copy == Copy(1, 2, 2)
    assert result.slots == (2 * 4 + 2,)
    assert pool.tokens("c") == [10, 11, 12, 13, 14, 15, 99]
    assert pool.tokens("p") == [10, 11, 12, 13, 14, 15]
    assert pool.ref_counts == {0: 2, 1: 1, 2: 1}


# ---------------------------------------------------------------- example 5


def test_example_5_prefix_sharing():
    ex = example_5()
    r1, r2 = ex.requests
    assert (r1.num_tokens, r1.block_table, r1.num_cached_tokens, r1.num_computed_tokens) == (
        90, (0, 1, 2, 3, 4, 5), 0, 90,
    )  # fmt: skip
    assert (r2.num_tokens, r2.block_table, r2.num_cached_tokens, r2.num_computed_tokens) == (
        103, (0, 1, 2, 3, 6, 7, 8), 64, 39,
    )  # fmt: skip
    assert ex.ref_counts == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1}
    assert (ex.blocks_in_use, ex.blocks_without_sharing) == (9, 13)


def test_example_5_only_full_blocks_carry_a_hash():
    final = example_5().history[-1].state
    hashed = [b.block_id for b in final.blocks if b.block_hash is not None]
    assert hashed == [0, 1, 2, 3, 4, 6, 7]  # 5 and 8 are partly filled
    expected = block_hashes(system_prompt_request(70, 20, 5000), 16)
    assert [final.blocks[b].block_hash for b in range(5)] == [short(h) for h in expected]
    assert final.hit_block_ids == (0, 1, 2, 3) and final.new_block_ids == (6, 7, 8)


def test_reuse_stops_at_the_first_miss():
    a = list(range(48))
    b = list(a)
    b[20] = 999  # block 1 differs; block 2 has the same tokens but a different prefix
    ex = shared_prefix([a, b], block_size=16)
    assert ex.requests[1].hit_block_ids == (0,)
    assert ex.requests[1].block_table == (0, 3, 4)


def test_blocks_filled_by_append_become_shareable():
    pool = BlockPool(8, 4, share_prefixes=True)
    pool.allocate("a", [1, 2, 3])
    pool.append("a", [4, 5])
    result = pool.allocate("b", [1, 2, 3, 4, 5, 6])
    assert result.hit_block_ids == (0,) and result.num_cached_tokens == 4


def test_whole_prompt_hit_and_vllm_cap():
    prompt = list(range(64))
    lesson = BlockPool(10, 16, share_prefixes=True)
    lesson.allocate("a", prompt)
    assert lesson.allocate("b", prompt).num_cached_tokens == 64
    vllm = BlockPool(10, 16, share_prefixes=True, recompute_last_token=True)
    vllm.allocate("a", prompt)
    result = vllm.allocate("b", prompt)
    assert result.num_cached_tokens == 48  # the lesson: a 64-token prompt reuses at most 48
    assert result.block_table == (0, 1, 2, 4)


def test_freed_blocks_forget_their_prefix():
    pool = BlockPool(4, 2, share_prefixes=True, record=True)
    pool.allocate("a", [1, 2, 3])
    pool.free("a")
    assert pool.history is not None and pool.history[-1].state.evicted_block_ids == (0,)
    assert pool.allocate("b", [1, 2, 3]).hit_block_ids == ()


def test_counted_tokens_are_never_shared():
    pool = BlockPool(4, 2, share_prefixes=True)
    pool.allocate("a", 4)
    assert pool.tokens("a") == [UNKNOWN_TOKEN] * 4
    assert pool.allocate("b", 4).hit_block_ids == ()
    assert all(b.block_hash is None for b in pool.snapshot().blocks)


def test_free_returns_blocks_to_the_back_in_table_order():
    pool = BlockPool(6, 4, free_order=[5, 4, 3, 2, 1, 0])
    pool.allocate("a", 9)
    assert pool.block_table("a") == (5, 4, 3)
    assert pool.free("a") == (5, 4, 3)
    assert pool.free_queue() == [2, 1, 0, 5, 4, 3]


def test_shared_block_is_freed_only_by_its_last_holder():
    pool = BlockPool(4, 4)
    pool.allocate("a", 5)
    pool.fork("a", "b")
    assert pool.free("a") == ()
    assert pool.ref_counts == {0: 1, 1: 1}
    assert pool.free("b") == (0, 1)


def test_history_records_each_operation():
    pool = BlockPool(4, 4, record=True)
    pool.allocate("a", 3)
    pool.append("a", 2)
    pool.fork("a", "b")
    pool.free("a")
    assert pool.history is not None
    assert len(pool.history) == 5
    assert pool.history[0].state.free_queue == (0, 1, 2, 3)
    assert pool.history[2].state.new_block_ids == (1,)
    assert pool.history[4].state.tables == (("b", (0, 1)),)


def test_utilization_of_a_pool_is_the_lesson_waste():
    pool = BlockPool(4, 16)
    pool.allocate("a", 17)  # 17 tokens: 2 blocks, 15 slots wasted
    assert pool.num_used_blocks * 16 - pool.num_tokens("a") == 15


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_blocks": 0}, "num_blocks must be at least 1"),
        ({"num_blocks": "8"}, "num_blocks must be an integer"),
        ({"block_size": 0}, "block_size must be at least 1"),
        ({"block_size": 16.0}, "block_size must be an integer"),
        ({"free_order": [0, 1, 2]}, r"missing \[3\]"),
        ({"free_order": [0, 1, 2, 2]}, r"missing \[3\], out of range or repeated \[2\]"),
        ({"free_order": [0, 1, 2, 3, 4]}, r"repeated \[4\]"),
        ({"free_order": [0, 1, 2, -3]}, r"free_order\[3\] must be at least 0"),
        ({"free_order": "0123"}, "free_order must be a list of block ids"),
        ({"share_prefixes": 1}, "share_prefixes must be True or False"),
        ({"record": None}, "record must be True or False"),
        ({"hash_scheme": "md5"}, "unknown hash_scheme 'md5'"),
    ],
)
def test_bad_pool_arguments(kwargs, message):
    args = {"num_blocks": 4, "block_size": 4, **kwargs}
    with pytest.raises(InvalidArgumentError, match=message):
        BlockPool(args.pop("num_blocks"), args.pop("block_size"), **args)


def _busy_pool() -> BlockPool:
    pool = BlockPool(6, 4, share_prefixes=True, record=True)
    pool.allocate("a", [1, 2, 3, 4, 5, 6])
    pool.fork("a", "b")
    pool.allocate("c", 3)
    pool.allocate("gone", 1)
    pool.free("gone")
    return pool


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda p: p.allocate("a", 3), DuplicateRequestError, "sequence 'a' already exists"),
        (lambda p: p.allocate("", 3), InvalidArgumentError, "request_id must be a non-empty string"),
        (lambda p: p.allocate(5, 3), InvalidArgumentError, "request_id must be a non-empty string"),
        (lambda p: p.allocate("d", 0), InvalidArgumentError, "tokens must be at least 1"),
        (lambda p: p.allocate("d", -2), InvalidArgumentError, "tokens must be at least 1"),
        (lambda p: p.allocate("d", []), InvalidArgumentError, "tokens is empty"),
        (lambda p: p.allocate("d", "abc"), InvalidArgumentError, "tokens must be a token count or a list"),
        (lambda p: p.allocate("d", 2.0), InvalidArgumentError, "tokens must be a token count or a list"),
        (lambda p: p.allocate("d", True), InvalidArgumentError, "tokens must be a token count or a list"),
        (lambda p: p.allocate("d", [1, 2.5]), InvalidArgumentError, r"tokens\[1\] must be an integer"),
        (lambda p: p.allocate("d", [1, -1]), InvalidArgumentError, r"tokens\[1\] = -1 is not a token id"),
        (lambda p: p.allocate("d", 13), OutOfBlocksError, "needs 4 free blocks, 3 are free"),
        (lambda p: p.append("c", 14), OutOfBlocksError, "needs 4 free blocks, 3 are free"),
        (
            lambda p: p.append("zz", 1),
            UnknownRequestError,
            "unknown sequence 'zz'; live sequences: 'a', 'b', 'c'",
        ),
        (lambda p: p.append("a", 0), InvalidArgumentError, "tokens must be at least 1"),
        (lambda p: p.fork("zz", "d"), UnknownRequestError, "unknown sequence 'zz'"),
        (lambda p: p.fork("a", "b"), DuplicateRequestError, "sequence 'b' already exists"),
        (lambda p: p.fork("a", None), InvalidArgumentError, "child must be a non-empty string"),
        (lambda p: p.free("gone"), UnknownRequestError, "'gone' was already freed"),
        (lambda p: p.free("zz"), UnknownRequestError, "unknown sequence 'zz'"),
        (lambda p: p.free(["a"]), InvalidArgumentError, "sequence id must be a string"),
        (
            lambda p: p.translate("a", 6),
            InvalidArgumentError,
            r"position 6 is past the end .* \(positions 0..5\)",
        ),
        (lambda p: p.translate("a", -1), InvalidArgumentError, "position must be at least 0"),
        (lambda p: p.translate("zz", 0), UnknownRequestError, "unknown sequence"),
        (lambda p: p.slot_mapping("gone"), UnknownRequestError, "already freed"),
        (lambda p: p.ref_count(6), InvalidArgumentError, "block_id 6 is out of range"),
        (lambda p: p.blocks_needed(-1), InvalidArgumentError, "num_tokens must be at least 0"),
    ],
)
def test_bad_calls_change_nothing(call, error, message, refuses):
    refuses(_busy_pool(), call, error, message)


def test_copy_on_write_that_does_not_fit_changes_nothing(refuses):
    pool = BlockPool(2, 4)
    pool.allocate("a", 5)
    pool.fork("a", "b")
    refuses(
        pool, lambda p: p.append("b", 1), OutOfBlocksError, "needs 1 free blocks, 0 are free"
    )  # the copy needs a block


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parallel_sampling(0, 3), "prompt_len must be at least 1"),
        (lambda: parallel_sampling(40, 0), "n must be at least 1"),
        (lambda: shared_prefix([]), "prompts is empty"),
        (lambda: shared_prefix("abc"), "prompts must be a list"),
        (lambda: shared_prefix([[1, 2], []]), r"prompts\[1\] is empty"),
        (lambda: system_prompt_request(-1, 2, 3), "system_len must be at least 0"),
    ],
)
def test_bad_runner_arguments(call, message):
    with pytest.raises(InvalidArgumentError, match=message):
        call()


# ---------------------------------------------------------------- invariants


class BlockPoolMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / free, checked against the pool's own bookkeeping rules."""

    BLOCK_SIZE = 4
    NUM_BLOCKS = 12

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(self.NUM_BLOCKS, self.BLOCK_SIZE, share_prefixes=True)
        self.expected: dict[str, list[int]] = {}  # what each sequence has written
        self.counter = 0

    def _new_id(self) -> str:
        self.counter += 1
        return f"s{self.counter}"

    # few distinct token ids, so prefixes repeat and blocks get shared
    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=14))
    def allocate(self, tokens):
        seq = self._new_id()
        free_before = self.pool.num_free_blocks
        try:
            result = self.pool.allocate(seq, tokens)
        except OutOfBlocksError:
            assert self.pool.num_free_blocks == free_before
            return
        self.expected[seq] = list(tokens)
        assert result.num_cached_tokens == len(result.hit_block_ids) * self.BLOCK_SIZE
        assert free_before - self.pool.num_free_blocks == len(result.new_block_ids)

    def _pick(self, index: int) -> str:
        return list(self.expected)[index % len(self.expected)]

    @precondition(lambda self: self.expected)
    @rule(index=st.integers(0, 63), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=9))
    def append(self, index, tokens):
        seq = self._pick(index)
        old_last = self.pool.block_table(seq)[-1]
        shared_partial = (
            self.pool.ref_count(old_last) > 1 and self.pool.num_tokens(seq) % self.BLOCK_SIZE != 0
        )
        try:
            result = self.pool.append(seq, tokens)
        except OutOfBlocksError:
            return
        if shared_partial:
            assert result.copy is not None and result.copy.source == old_last
        else:
            assert result.copy is None
        self.expected[seq] += tokens
        assert list(result.slots) == self.pool.slot_mapping(seq)[-len(tokens) :]

    @precondition(lambda self: 0 < len(self.expected) < 8)  # forks take no blocks; keep the table count small
    @rule(index=st.integers(0, 63))
    def fork(self, index):
        parent = self._pick(index)
        child = self._new_id()
        self.pool.fork(parent, child)
        self.expected[child] = list(self.expected[parent])

    @precondition(lambda self: self.expected)
    @rule(index=st.integers(0, 63))
    def free(self, index):
        seq = self._pick(index)
        self.pool.free(seq)
        del self.expected[seq]
        with pytest.raises(UnknownRequestError):
            self.pool.free(seq)

    @invariant()
    def bookkeeping_is_consistent(self):
        state = self.pool.snapshot()
        bs = self.BLOCK_SIZE
        # every block is free or referenced, never both, and the free list holds each free block once
        free = set(state.free_queue)
        assert len(free) == len(state.free_queue) == self.pool.num_free_blocks
        referenced = {b for _, table in state.tables for b in table}
        assert free.isdisjoint(referenced)
        assert free | referenced == set(range(self.NUM_BLOCKS))
        assert all(state.blocks[b].num_tokens == 0 and state.blocks[b].block_hash is None for b in free)
        # ref counts equal the number of tables holding the block; no block twice in one table
        holders = Counter(b for _, table in state.tables for b in table)
        assert all(len(set(table)) == len(table) for _, table in state.tables)
        assert state.ref_counts == dict(holders)
        assert len(free) == sum(1 for b in state.blocks if b.ref_count == 0)
        assert [seq for seq, _ in state.tables] == list(self.expected)
        for seq, tokens in self.expected.items():
            table = state.table(seq)
            # each sequence reads back exactly what it wrote, through its table
            assert [t for b in table for t in state.blocks[b].tokens] == tokens
            assert state.num_tokens(seq) == len(tokens)
            assert len(table) == -(-len(tokens) // bs)
            # slot mapping: physical * block_size + offset, one distinct slot per position
            mapping = self.pool.slot_mapping(seq)
            assert mapping == [table[p // bs] * bs + p % bs for p in range(len(tokens))]
            assert len(set(mapping)) == len(mapping)
            last = self.pool.translate(seq, len(tokens) - 1)
            assert (last.logical_block, last.offset, last.slot) == (
                len(table) - 1,
                (len(tokens) - 1) % bs,
                mapping[-1],
            )
            # a cached block's hash names the whole prefix through it
            hashes = block_hashes(tokens, bs)
            for logical, b in enumerate(table[: len(hashes)]):
                label = state.blocks[b].block_hash
                assert label is None or label == short(hashes[logical])
        # a block held by several tables is full, or the common last block of forked twins
        for block in state.blocks:
            if block.ref_count > 1 and block.num_tokens < bs:
                assert all(
                    table[-1] == block.block_id for _, table in state.tables if block.block_id in table
                )


BlockPoolMachine.TestCase.settings = settings(max_examples=10, stateful_step_count=200, deadline=None)
TestBlockPoolMachine = BlockPoolMachine.TestCase
