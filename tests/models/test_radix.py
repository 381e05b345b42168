"""kvlab.models.radix: SGLang's RadixCache behaviour, lesson example 8, invariants, bad input."""

from __future__ import annotations

from collections import Counter

import pytest
from hostile import hostile_values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlab.core.snapshots import RadixNodeState, RadixState
from kvlab.errors import InvalidArgumentError, KvlabError
from kvlab.lessons.ex08 import example_8
from kvlab.models.radix import RadixNode, RadixTree
from kvlab.views.text import caption, captions
from kvlab.views.text.radix import format_tree

# ---------------------------------------------------------------------- helpers


def shape(state_or_tree: RadixState | RadixTree) -> list:
    """The tree as nested [key, lock_ref, children] lists, children in stored order."""
    state = state_or_tree.snapshot() if isinstance(state_or_tree, RadixTree) else state_or_tree

    def conv(node: RadixNodeState) -> list:
        return [list(node.key), node.lock_ref, [conv(c) for c in node.children]]

    return [conv(c) for c in state.root.children]


def find(tree: RadixTree, key: tuple[int, ...]) -> RadixNode:
    matches = [n for n in tree.nodes() if n.key == key]
    assert len(matches) == 1, key
    return matches[0]


def oracle_prefix(state: RadixState, tokens: list[int], extra_key: str | None) -> int:
    """Longest whole-page prefix of ``tokens`` that some root path in the namespace spells (brute force)."""
    page = state.page_size
    aligned = tokens[: len(tokens) // page * page]
    best = 0
    stack = [(c, c.key) for c in state.root.children if c.extra_key == extra_key]
    while stack:
        node, path = stack.pop()
        common = 0
        while common < min(len(path), len(aligned)) and path[common] == aligned[common]:
            common += 1
        best = max(best, common - common % page)
        stack.extend((c, path + c.key) for c in node.children)
    return best


def oracle_evict(state: RadixState, num_tokens: int) -> list[tuple[int, ...]]:
    """Evict from a copy of the snapshot by full scans: min last access among unlocked leaves."""
    nodes: dict[int, dict] = {}
    stack: list[tuple[RadixNodeState, int | None]] = [(state.root, None)]
    while stack:
        node, parent = stack.pop()
        nodes[node.node_id] = {
            "key": node.key,
            "lock": node.lock_ref,
            "t": node.last_access,
            "parent": parent,
            "kids": {c.node_id for c in node.children},
        }
        stack.extend((c, node.node_id) for c in node.children)
    freed, runs = 0, []
    while freed < num_tokens:
        leaves = [i for i, n in nodes.items() if n["parent"] is not None and not n["kids"] and n["lock"] == 0]
        if not leaves:
            break
        times = sorted(nodes[i]["t"] for i in leaves)
        assert len(times) == 1 or times[0] < times[1], "two evictable leaves share an access time"
        victim = min(leaves, key=lambda i: nodes[i]["t"])
        gone = nodes.pop(victim)
        nodes[gone["parent"]]["kids"].discard(victim)
        runs.append(gone["key"])
        freed += len(gone["key"])
    return runs


def unchanged_probe(tree: RadixTree) -> tuple:
    return (
        tree.snapshot(),
        tree.clock,
        tree.num_nodes,
        frozenset(tree.allocator.in_use),
        tree.allocator.allocated_total,
        tree.allocator.freed_total,
    )


# ---------------------------------------------------------------------- lesson example 8


def test_example_8_tree_after_three_inserts():
    ex = example_8()
    assert shape(ex.tree_after_inserts) == [
        [
            [1, 2, 3, 4, 5, 6],
            0,
            [
                [[10, 11], 0, [[[30, 31], 0, []]]],
                [[20, 21, 22], 0, []],
            ],
        ],
    ]
    assert ex.token_entries == 13 and ex.prompt_tokens == 27


def test_example_8_match_lock_evict():
    ex = example_8()
    assert ex.matched_len == 9
    assert ex.evicted_runs == ((30, 31),)
    assert ex.evicted_tokens == 2  # asked for 1: a whole leaf goes
    assert (ex.evictable_size, ex.protected_size) == (2, 9)
    assert shape(ex.tree_after_evict) == [
        [[1, 2, 3, 4, 5, 6], 1, [[[10, 11], 0, []], [[20, 21, 22], 1, []]]],
    ]
    assert ex.tree_after_evict.evicted_runs == ((30, 31),)
    assert len(ex.history) == 7 and ex.history[0].state.root.children == ()
    # the lesson's access order: [20, 21, 22] older than the [30, 31] leaf, both older than the match
    lines = format_tree(ex.tree_after_inserts).splitlines()
    assert lines[0].startswith("[1, 2, 3, 4, 5, 6] t=") and lines[2].startswith("    [30, 31] t=")
    t = {n.key: n.last_access for _, n in ex.tree_after_inserts.root.walk()}
    assert t[(20, 21, 22)] < t[(30, 31)]
    assert "locked" in format_tree(ex.tree_after_evict).splitlines()[0]


def test_example_8_by_hand_through_the_api():
    tree = RadixTree()
    assert [
        tree.insert(p)
        for p in (
            [1, 2, 3, 4, 5, 6, 10, 11],
            [1, 2, 3, 4, 5, 6, 20, 21, 22],
            [1, 2, 3, 4, 5, 6, 10, 11, 30, 31],
        )
    ] == [0, 6, 8]
    hit = tree.match([1, 2, 3, 4, 5, 6, 20, 21, 22, 40])
    assert hit.matched_len == 9 and hit.node.key == (20, 21, 22) and len(hit.values) == 9
    assert tree.lock(hit.node) == -9
    assert tree.evict(1) == [(30, 31)]
    assert (tree.evictable_size, tree.protected_size) == (2, 9)


def test_example_8_captions_and_events():
    ex = example_8()
    assert captions(ex.history) == [
        "empty tree",
        "insert [1, 2, 3, 4, 5, 6, 10, 11]: 0 tokens already present",
        "insert [1, 2, 3, 4, 5, 6, 20, 21, 22]: 6 tokens already present",
        "insert [1, 2, 3, 4, 5, 6, 10, 11, 30, 31]: 8 tokens already present",
        "match [1, 2, 3, 4, 5, 6, 20, 21, 22, 40]: 9 tokens cached",
        "lock node #3 (9 tokens to the root)",
        "evict 1: freed 2 tokens in 1 leaf",
    ]
    kinds = [step.event.kind for step in ex.history]
    assert kinds == ["radix.create"] + ["radix.insert"] * 3 + ["radix.match", "radix.lock", "radix.evict"]
    assert ex.history[-1].event["evicted"] == ((30, 31),)


def test_long_prompts_and_extra_keys_in_captions():
    tree = RadixTree(page_size=2, record=True)
    tree.insert(list(range(30)), "lora")
    hit = tree.match([0, 1, 2, 3, 9])
    tree.lock(hit.node)
    tree.unlock(hit.node)
    tree.evict(3)
    assert captions(tree.history) == [
        "empty tree",
        "insert [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (30 tokens)] (extra_key 'lora'): 0 tokens already present",
        "match [0, 1, 2, 3]: 0 tokens cached",
        "lock node #0 (0 tokens to the root)",
        "unlock node #0 (0 tokens to the root)",
        "evict 3: freed 30 tokens in 1 leaf",
    ]


def test_not_recording_builds_no_events():
    tree = RadixTree()
    tree.insert([1, 2, 3])
    tree.lock(tree.match([1, 2]).node)
    assert tree.history is None


# ---------------------------------------------------------------------- match and insert


def test_match_that_ends_inside_a_run_splits_it():
    tree = RadixTree(record=True)
    tree.insert([1, 2, 3, 4, 5, 6, 7, 8])
    old = find(tree, (1, 2, 3, 4, 5, 6, 7, 8))
    result = tree.match([1, 2, 3, 9])
    assert result.matched_len == 3
    assert shape(tree) == [[[1, 2, 3], 0, [[[4, 5, 6, 7, 8], 0, []]]]]
    assert result.node.key == (1, 2, 3) and result.node is not old
    assert old.key == (4, 5, 6, 7, 8) and old.parent is result.node  # the old object keeps the lower part
    state = tree.snapshot()
    assert state.split_nodes == (result.node.node_id,) and state.matched_node == result.node.node_id
    # the split node is created after the walk's time stamp: the upper part is newer than the lower
    assert result.node.last_access > old.last_access
    assert tree.history is not None and "3 tokens cached" in caption(tree.history[-1])


def test_match_on_a_boundary_does_not_split_and_values_follow_the_path():
    tree = RadixTree()
    tree.insert([1, 2, 3])
    tree.insert([1, 2, 3, 4, 5])
    before = shape(tree)
    result = tree.match([1, 2, 3, 7])
    assert result.matched_len == 3 and result.node.key == (1, 2, 3)
    assert shape(tree) == before and tree.snapshot().split_nodes == ()
    full = tree.match([1, 2, 3, 4, 5, 6])
    assert full.matched_len == 5 and full.values[:3] == result.values
    miss = tree.match([9, 9])
    assert miss.matched_len == 0 and miss.node is tree.root and miss.values == ()


def test_insert_returns_tokens_already_present():
    tree = RadixTree()
    assert tree.insert([1, 2, 3]) == 0
    assert tree.insert([1, 2, 3]) == 3
    assert tree.insert([1, 2, 4]) == 2  # splits [1, 2, 3] at 2, adds leaf [4]
    assert tree.insert([1]) == 1  # splits [1, 2] at 1, adds nothing
    assert tree.insert([1, 2, 4, 5]) == 3
    assert shape(tree) == [[[1], 0, [[[2], 0, [[[3], 0, []], [[4], 0, [[[5], 0, []]]]]]]]]
    assert tree.total_tokens == 5 and len(tree.allocator.in_use) == 5  # slots only for new tokens


def test_children_keep_their_position_through_splits_and_go_last_when_reinserted():
    tree = RadixTree()
    for p in ([1, 2, 3], [5, 6], [7]):
        tree.insert(p)
    tree.match([1, 2, 9])  # split [1, 2] | [3] stays first
    assert [c.key for c in tree.root.children.values()] == [(1, 2), (5, 6), (7,)]
    tree.lock(tree.match([1, 2, 3]).node)
    tree.lock(tree.match([7]).node)
    assert tree.evict(100) == [(5, 6)]
    tree.insert([5, 6])
    assert [c.key for c in tree.root.children.values()] == [(1, 2), (7,), (5, 6)]


def test_clock_ticks_exactly_where_sglang_reads_time_monotonic():
    tree = RadixTree(page_size=2)
    assert tree.clock == 2  # the root's TreeNode.__init__: last_access_time, creation_time
    tree.insert([1, 2, 3, 4])
    assert tree.clock == 5  # the walk, then the new leaf's two readings
    tree.insert([1, 2, 5, 6])
    assert tree.clock == 10  # walk, split node, leaf
    tree.match([1, 2, 3, 4])
    assert tree.clock == 11  # walk only
    tree.match([1, 2, 3, 4, 8, 8])
    assert tree.clock == 12
    tree.match([1])  # empty after page truncation: root returned, no clock reading
    assert tree.clock == 12
    tree.insert([1])  # SGLang's _insert_helper still stamps the root
    assert tree.clock == 13
    node = tree.match([1, 2, 3, 4]).node
    tree.lock(node)
    tree.unlock(node)
    tree.evict(100)
    assert tree.clock == 14


# ---------------------------------------------------------------------- eviction


def test_eviction_is_lru_and_parents_left_childless_join_at_once():
    tree = RadixTree()
    tree.insert([1, 2, 3])
    tree.insert([1, 2, 4])  # [1, 2] split node (newer) over [3] (stamped by the walk) and leaf [4]
    tree.insert([5, 6])  # newest
    # [3] and [4] go; [1, 2], now a leaf, is older than [5, 6], so it goes before it
    assert tree.evict(100) == [(3,), (4,), (1, 2), (5, 6)]
    assert tree.total_tokens == 0 and tree.allocator.in_use == set()


def test_match_refreshes_access_time():
    tree = RadixTree()
    tree.insert([1, 2])
    tree.insert([3, 4])
    tree.match([1, 2, 7])
    assert tree.evict(1) == [(3, 4)]
    tree.insert([3, 4])
    assert tree.evict(1) == [(1, 2)]


def test_eviction_may_free_more_than_asked_and_stops_when_nothing_is_left():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    tree.insert([5, 6])
    assert tree.evict(0) == []
    assert tree.evict(1) == [(1, 2, 3, 4)]  # a whole leaf, 4 tokens for 1
    assert tree.evict(50) == [(5, 6)]
    assert tree.evict(5) == [] and tree.snapshot().evicted_runs == ()


def test_locked_nodes_are_never_evicted_and_locks_move_tokens_on_0_1_transitions_only():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    tree.insert([1, 2, 5])
    a = tree.match([1, 2, 3, 4]).node
    b = tree.match([1, 2, 5]).node
    assert tree.lock(a) == -4  # [3, 4] and [1, 2]
    assert tree.lock(b) == -1  # only [5]: [1, 2] goes 1 -> 2
    assert tree.lock(a) == 0
    assert (tree.evictable_size, tree.protected_size) == (0, 5)
    assert find(tree, (1, 2)).lock_ref == 3 and a.lock_ref == 2 and b.lock_ref == 1
    assert tree.evict(100) == []
    assert tree.unlock(a) == 0
    assert tree.unlock(a) == 2
    assert tree.evict(100) == [(3, 4)]
    assert tree.unlock(b) == 3
    assert tree.evict(100) == [(5,), (1, 2)]


def test_unbalanced_unlocks_drive_a_count_below_zero_and_such_a_node_waits_one_eviction():
    # Regression (tools/conformance/fuzz_sglang.py): expected values written by hand from SGLang
    # 0.5.23's real RadixCache on this scenario. "mid" is never locked itself, but its node is
    # locked through "deep", so unlocking both walks [1, 2] from 1 to 0 to -1, as dec_lock_ref does.
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    deep = tree.match([1, 2, 3, 4]).node
    mid = tree.match([1, 2]).node  # splits: [1, 2] -> [3, 4]
    assert tree.lock(deep) == -4
    assert tree.unlock(mid) == 2 and (tree.evictable_size, tree.protected_size) == (2, 2)
    assert tree.unlock(deep) == 2 and (tree.evictable_size, tree.protected_size) == (4, 0)
    assert mid.lock_ref == -1 and deep.lock_ref == 0
    with pytest.raises(InvalidArgumentError, match="not locked"):
        tree.unlock(mid)  # a count at or below 0 is not locked
    # SGLang pushes a parent left childless during a call only when its count is exactly 0, so the
    # call frees 2 of the 3 tokens asked; the parent is an evictable leaf (count <= 0) next call.
    assert tree.evict(3) == [(3, 4)]
    assert shape(tree) == [[[1, 2], -1, []]] and tree.evictable_size == 2
    assert tree.evict(1) == [(1, 2)]
    assert (tree.evictable_size, tree.protected_size, shape(tree)) == (0, 0, [])


def test_a_handle_survives_a_split_as_the_lower_part():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    handle = tree.match([1, 2, 3, 4]).node
    tree.lock(handle)
    tree.match([1, 2, 9])  # splits the locked node: both halves keep the lock count
    assert handle.key == (3, 4) and handle.parent.key == (1, 2) and handle.parent.lock_ref == 1
    assert handle.prefix() == (1, 2, 3, 4) and tree.protected_size == 4
    tree.unlock(handle)
    assert (tree.evictable_size, tree.protected_size) == (4, 0)


# ---------------------------------------------------------------------- pages and namespaces


def test_page_size_2_truncates_and_splits_on_page_boundaries():
    tree = RadixTree(page_size=2)
    assert tree.insert([1, 2, 3, 4, 5]) == 0
    assert shape(tree) == [[[1, 2, 3, 4], 0, []]]  # the partial page is not cached
    assert tree.insert([1, 2, 3, 5]) == 2  # [3, 5] differs from [3, 4] inside the page
    assert shape(tree) == [[[1, 2], 0, [[[3, 4], 0, []], [[3, 5], 0, []]]]]
    assert tree.match([1, 2, 3, 9]).matched_len == 2
    assert tree.match([1, 2, 3]).matched_len == 2
    assert tree.insert([1, 3]) == 0  # first page (1, 3) is a different child key than (1, 2)
    assert [k for k in tree.root.children] == [(1, 2), (1, 3)]
    assert tree.evict(1) == [(3, 4)]


def test_page_size_16():
    tree = RadixTree(page_size=16)
    assert tree.insert(list(range(40))) == 0
    assert tree.total_tokens == 32
    result = tree.match(list(range(20)) + [99] * 20)
    assert result.matched_len == 16
    assert shape(tree) == [[list(range(16)), 0, [[list(range(16, 32)), 0, []]]]]
    clock, before = tree.clock, tree.snapshot()
    assert tree.match(list(range(15))).matched_len == 0  # less than a page: nothing to look up
    assert tree.clock == clock and shape(tree) == shape(before)
    assert tree.insert([0] * 15 + [7]) == 0  # differs inside the first page: no sharing at all
    assert len(tree.root.children) == 2 and tree.total_tokens == 48


def test_extra_keys_never_share_nodes():
    tree = RadixTree()
    assert tree.insert([1, 2, 3], extra_key="tenant-a") == 0
    assert tree.match([1, 2, 3]).matched_len == 0
    assert tree.match([1, 2, 3], extra_key="tenant-b").matched_len == 0
    assert tree.match([1, 2, 3], extra_key="tenant-a").matched_len == 3
    assert tree.insert([1, 2, 3], extra_key="tenant-b") == 0
    assert tree.insert([1, 2, 3]) == 0
    assert list(tree.root.children) == [("tenant-a", 1), ("tenant-b", 1), 1]
    assert tree.total_tokens == 9
    tree.insert([1, 2, 4], extra_key="tenant-b")
    kids = tree.snapshot().root.children
    assert [c.extra_key for c in kids] == ["tenant-a", "tenant-b", None]
    assert [c.extra_key for c in kids[1].children] == ["tenant-b", "tenant-b"]
    tree.lock(tree.match([1, 2, 3], extra_key="tenant-a").node)
    # the unnamespaced [1, 2, 3] is oldest; tenant-b's [1, 2] goes once its children are gone
    assert tree.evict(100) == [(1, 2, 3), (3,), (4,), (1, 2)]
    assert tree.total_tokens == 3 and tree.protected_size == 3


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call",
    [
        lambda t, h: t.insert("123"),
        lambda t, h: t.insert([1, 2.0]),
        lambda t, h: t.insert([1, True]),
        lambda t, h: t.insert([]),
        lambda t, h: t.insert(5),
        lambda t, h: t.insert([1, 2], extra_key=3),
        lambda t, h: t.match([]),
        lambda t, h: t.match([1, None]),
        lambda t, h: t.match([1, 2], extra_key=b"x"),
        lambda t, h: t.lock("node"),
        lambda t, h: t.lock(RadixTree().root),
        lambda t, h: t.lock(h["evicted"]),
        lambda t, h: t.unlock(h["unlocked"]),
        lambda t, h: t.unlock(h["evicted"]),
        lambda t, h: t.evict(-1),
        lambda t, h: t.evict(2.5),
        lambda t, h: t.evict(True),
    ],
)
def test_bad_calls_are_refused_and_change_nothing(call):
    tree = RadixTree(record=True)
    tree.insert([1, 2, 3])
    evicted = tree.match([1, 2, 3]).node
    tree.insert([4, 5])
    tree.evict(1)
    assert not evicted.alive
    tree.insert([7, 8])
    handles = {"evicted": evicted, "unlocked": tree.match([7, 8]).node}
    before, steps = unchanged_probe(tree), len(tree.history)
    with pytest.raises(InvalidArgumentError) as info:
        call(tree, handles)
    assert isinstance(info.value, KvlabError) and str(info.value)
    assert unchanged_probe(tree) == before and len(tree.history) == steps


@pytest.mark.parametrize("page_size", [0, -1, 1.0, "2", None, True])
def test_bad_page_size(page_size):
    with pytest.raises(InvalidArgumentError, match="page_size"):
        RadixTree(page_size=page_size)


def test_locking_the_root_is_a_no_op_like_sglang():
    tree = RadixTree()
    tree.insert([1, 2])
    root = tree.match([9]).node
    assert root is tree.root
    assert tree.lock(root) == 0 and tree.unlock(root) == 0 and tree.unlock(root) == 0
    assert tree.root.lock_ref == 1 and tree.evictable_size == 2


# ---------------------------------------------------------------------- invariants over random operations

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=10)
EXTRA = st.sampled_from([None, None, None, "a"])


class RadixMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 1, 2, 3]))
    def setup(self, page_size):
        self.tree = RadixTree(page_size=page_size)
        self.handles: list[RadixNode] = []
        self.locks: list[RadixNode] = []  # one entry per lock call not yet undone

    @rule(tokens=TOKENS, extra_key=EXTRA)
    def insert(self, tokens, extra_key):
        before = self.tree.snapshot()
        expected = oracle_prefix(before, tokens, extra_key)
        aligned = len(tokens) // self.tree.page_size * self.tree.page_size
        assert self.tree.insert(tokens, extra_key) == expected
        assert self.tree.total_tokens == before.total_tokens + aligned - expected
        assert oracle_prefix(self.tree.snapshot(), tokens, extra_key) == aligned

    @rule(tokens=TOKENS, extra_key=EXTRA, keep=st.booleans())
    def match(self, tokens, extra_key, keep):
        before = self.tree.snapshot()
        result = self.tree.match(tokens, extra_key)
        assert result.matched_len == oracle_prefix(before, tokens, extra_key)
        assert result.node.prefix() == tuple(tokens[: result.matched_len])
        assert len(result.values) == result.matched_len
        assert self.tree.total_tokens == before.total_tokens
        if keep:
            self.handles = [*self.handles[-15:], result.node]

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def lock(self, data):
        node = data.draw(st.sampled_from(self.handles))
        if node.alive:
            self.tree.lock(node)
            if not node.is_root:
                self.locks.append(node)
        else:
            before = unchanged_probe(self.tree)
            with pytest.raises(InvalidArgumentError, match="evicted"):
                self.tree.lock(node)
            assert unchanged_probe(self.tree) == before

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        i = data.draw(st.integers(0, len(self.locks) - 1))
        self.tree.unlock(self.locks.pop(i))

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def unlock_what_is_not_locked(self, data):
        node = data.draw(st.sampled_from(self.handles))
        if node.alive and not node.is_root and node.lock_ref == 0:
            before = unchanged_probe(self.tree)
            with pytest.raises(InvalidArgumentError):
                self.tree.unlock(node)
            assert unchanged_probe(self.tree) == before

    @rule(num_tokens=st.integers(0, 25))
    def evict(self, num_tokens):
        before = self.tree.snapshot()
        expected = oracle_evict(before, num_tokens)
        runs = self.tree.evict(num_tokens)
        assert runs == expected
        assert self.tree.total_tokens == before.total_tokens - sum(map(len, runs))

    @invariant()
    def sizes_locks_values_and_structure_agree(self):
        if not hasattr(self, "tree"):
            return
        tree = self.tree
        page = tree.page_size
        expected_locks: Counter[int] = Counter()
        for node in self.locks:
            assert node.alive, "a locked node was evicted"
            while not node.is_root:
                expected_locks[node.node_id] += 1
                node = node.parent
        evictable = protected = 0
        values: list[int] = []
        for node in tree.nodes():
            if node.is_root:
                assert node.lock_ref == 1 and node.key == ()
                continue
            assert node.alive and node.key and len(node.key) % page == 0 and len(node.value) == len(node.key)
            assert node.lock_ref == expected_locks[node.node_id]
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            values.extend(node.value)
            for key, child in node.children.items():
                assert child.parent is node and child.extra_key == node.extra_key
                plain = child.key[0] if page == 1 else child.key[:page]
                assert key == (plain if child.extra_key is None else (child.extra_key, plain))
        assert (tree.evictable_size, tree.protected_size) == (evictable, protected)
        assert tree.evictable_size + tree.protected_size == tree.snapshot().total_tokens
        # the snapshot, rebuilt only where operations changed the tree, is the whole tree built afresh
        fresh = fresh_root(tree)
        assert tree.snapshot().root == fresh and repr(tree.snapshot().root) == repr(fresh)
        assert hash(tree.snapshot().root) == hash(fresh)
        # every slot is held by exactly one token in the tree, and freed slots were freed once
        assert len(values) == len(set(values)) == tree.total_tokens
        assert set(values) == tree.allocator.in_use
        assert tree.allocator.allocated_total - tree.allocator.freed_total == len(values)


RadixMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRadixMachine = RadixMachine.TestCase


def test_lazy_heap_matches_full_scans_on_a_long_random_trace():
    """Thousands of ops on one tree: every eviction equals the brute-force LRU scan, stale entries pruned."""
    import random

    rng = random.Random(8)
    tree = RadixTree()
    locked: list[RadixNode] = []
    for _ in range(4000):
        r = rng.random()
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        if r < 0.4:
            tree.insert(tokens)
        elif r < 0.7:
            node = tree.match(tokens).node
            if rng.random() < 0.3 and not node.is_root:
                tree.lock(node)
                locked.append(node)
        elif r < 0.8 and locked:
            tree.unlock(locked.pop(rng.randrange(len(locked))))
        else:
            n = rng.randrange(0, 10)
            expected = oracle_evict(tree.snapshot(), n)
            assert tree.evict(n) == expected
        assert len(tree._heap) <= 4 * tree.num_nodes + 1024


# ---------------------------------------------------------------------- deep trees: nothing recurses


def deep_tree(depth: int, record: bool = False) -> RadixTree:
    """A tree ``depth`` nodes deep, built by inserts: each one leaves the run one token higher up."""
    tree = RadixTree(record=record)
    tree.insert(list(range(depth + 1)))
    for k in range(depth - 1, -1, -1):
        tree.insert([*range(k), 10**6])  # splits the top run at k and hangs a leaf there
    return tree


def fresh_root(tree: RadixTree) -> RadixNodeState:
    """The tree's root state built from scratch (no cached subtree), children before parents."""
    order, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    built: dict[int, RadixNodeState] = {}
    for node in reversed(order):
        kids = tuple(built[c.node_id] for c in node.children.values())
        built[node.node_id] = RadixNodeState(
            node.node_id, node.key, node.lock_ref, node.last_access, kids, node.extra_key
        )
    return built[tree.root.node_id]


def test_a_tree_5000_deep_snapshots_compares_hashes_prints_and_copies():
    import copy
    import dataclasses
    import pickle

    tree = deep_tree(5000)
    state = tree.snapshot()
    other = dataclasses.replace(state, root=fresh_root(tree))  # the same tree in objects of its own
    assert max(d for d, _ in state.root.walk()) == 5000 and tree.num_nodes == 10_001
    assert state == other and hash(state) == hash(other) and repr(state) == repr(other)
    assert tree.snapshot().root is state.root  # nothing changed: the same snapshot objects
    lines = format_tree(state).splitlines()
    assert len(lines) == 10_000 and lines[0].startswith("[0] t=") and lines[1].startswith("  [1] t=")
    assert " " * 128 + "(depth 5000) [4999, 5000]" in {line.split(" t=")[0] for line in lines}
    assert max(map(len, lines)) < 160  # indentation stops at MAX_INDENT levels: the text grows with the nodes
    assert copy.deepcopy(state) == state and copy.copy(state.root) is state.root
    restored = pickle.loads(pickle.dumps(state))
    assert restored == state and restored.root is not state.root and repr(restored) == repr(state)
    assert repr(tree.match([0, 1, 2]).node).startswith("RadixNode(#")  # new access times down the path
    assert tree.snapshot() != state and tree.snapshot().root != other.root
    assert tree.snapshot().root == fresh_root(tree)
    assert len(tree.evict(10**6)) == 10_000 and tree.num_nodes == 1 and tree.total_tokens == 0


def test_node_state_repr_eq_and_hash_are_a_frozen_dataclass_s():
    """The hand-written (iterative) methods say what the generated ones said."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class RadixNodeState:  # the generated methods, recursive, on a small tree
        node_id: int
        key: tuple[int, ...]
        lock_ref: int
        last_access: int
        children: tuple = ()
        extra_key: str | None = None

    RadixNodeState.__qualname__ = "RadixNodeState"
    tree = RadixTree(page_size=2)
    for tokens, key in [([1, 2, 3, 4], None), ([1, 2, 5, 6], None), ([1, 2], "ns"), ([7, 8, 9, 9, 1], None)]:
        tree.insert(tokens, key)
    tree.lock(tree.match([1, 2, 5, 6]).node)
    tree.match([7, 8])  # splits [7, 8, 9, 9]: a node with one child
    ours = tree.snapshot().root

    def mirror(node):
        return RadixNodeState(
            node.node_id,
            node.key,
            node.lock_ref,
            node.last_access,
            tuple(map(mirror, node.children)),
            node.extra_key,
        )

    assert repr(ours) == repr(mirror(ours))
    one_child = ours.children[2]
    assert len(one_child.children) == 1  # its children print as a tuple of one: "(x,)"
    assert repr(one_child) == repr(mirror(one_child))
    for field in ("node_id", "key", "lock_ref", "last_access", "extra_key"):
        import dataclasses

        leaf = ours.children[0].children[0]
        changed = dataclasses.replace(leaf, **{field: "x"})
        assert changed != leaf and leaf == dataclasses.replace(leaf)
    assert ours != 5 and ours.__eq__(5) is NotImplemented
    assert len({hash(s.root) for s in [tree.snapshot(), RadixTree().snapshot()]}) == 2


def test_snapshots_share_what_an_operation_did_not_touch():
    """Recording costs one path per op, not the whole tree: the other subtrees are the same objects."""
    tree = RadixTree(record=True)
    for k in range(200):
        tree.insert([k, 1000 + k, 2000 + k])
    before = tree.snapshot()
    upper = tree.match([7, 1007]).node  # splits [7, 1007, 2007]
    tree.lock(upper)
    after = tree.snapshot()
    assert after.root == fresh_root(tree)
    olds = {id(n) for _, n in before.root.walk()}
    rebuilt = [n for _, n in after.root.walk() if id(n) not in olds]
    assert sorted(n.node_id for n in rebuilt) == [0, find(tree, (2007,)).node_id, upper.node_id]
    assert tree.history is not None and tree.history[-3].state == before  # history kept its own snapshots
    tree.evict(10**6)
    assert tree.snapshot().root == fresh_root(tree) and tree.history[-4].state == before


# ---------------------------------------------------------------------- hostile input, every public method


HOSTILE = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def a_tree() -> tuple[RadixTree, dict[str, RadixNode]]:
    tree = RadixTree(record=True)
    tree.insert([1, 2, 3])
    gone = tree.match([1, 2, 3]).node
    tree.insert([4, 5])
    tree.evict(1)
    tree.insert([1, 2, 7, 8])
    locked = tree.match([1, 2, 7]).node
    tree.lock(locked)
    return tree, {"gone": gone, "locked": locked, "free": tree.match([4, 5]).node}


def either_refused(refuses, tree: RadixTree, call) -> None:
    """``call`` on a hostile value: accepted (a value that happens to be valid) or refused, changing nothing."""
    probe = unchanged_probe(tree)
    try:
        refuses(tree, call, KvlabError)
    except pytest.fail.Exception:
        return  # it was accepted: the value was a valid one
    assert unchanged_probe(tree) == probe  # the clock and the allocator too


@HOSTILE
@given(value=hostile_values())
def test_hostile_values_in_every_argument(refuses, value):
    tree, handles = a_tree()
    for call in (
        lambda t: t.insert(value),
        lambda t: t.insert([1, 2], extra_key=value),
        lambda t: t.match(value),
        lambda t: t.match([1, 2], extra_key=value),
        lambda t: t.lock(value),
        lambda t: t.unlock(value),
        lambda t: t.evict(value),
    ):
        either_refused(refuses, tree, call)
    for kwargs in ({"page_size": value}, {"record": value}):
        try:
            RadixTree(**kwargs)
        except KvlabError as exc:
            assert str(exc)


class LooksLikeANode:
    """Claims to be a RadixNode (isinstance says yes) and to belong to any tree."""

    __class__ = RadixNode  # type: ignore[assignment]

    def __init__(self, tree: RadixTree) -> None:
        self.tree, self.alive, self.parent, self.key, self.lock_ref = tree, True, None, (), 5


class TokenList(list):
    pass


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda t, h: t.insert([1, -1]), r"tokens\[1\] = -1 is not a token id"),
        (lambda t, h: t.insert([2**31]), "not a token id"),
        (lambda t, h: t.match([10**30, 1]), "not a token id"),
        (lambda t, h: t.match([1, 2], extra_key=type("S", (str,), {})("ns")), "extra_key must be a string"),
        (lambda t, h: t.lock(RadixTree().match([1]).node), "another RadixTree"),
        (lambda t, h: t.unlock(LooksLikeANode(t)), "takes a node returned by match"),
        (lambda t, h: t.lock(h["gone"]), "evicted"),
        (lambda t, h: t.unlock(h["free"]), "not locked"),
        (lambda t, h: t.evict(1 << 27 + 1), "LIMITS.total_tokens"),
        (lambda t, h: t.evict(-3), "at least 0"),
    ],
)
def test_refused_calls_say_why_and_change_nothing(refuses, call, words):
    tree, handles = a_tree()
    probe = unchanged_probe(tree)
    refuses(tree, lambda t: call(t, handles), KvlabError, words)
    assert unchanged_probe(tree) == probe


def test_token_list_subclasses_are_read_as_plain_lists():
    tree = RadixTree()
    assert tree.insert(TokenList([1, 2])) == 0 and tree.match((1, 2)).matched_len == 2


def test_sizes_are_bounded_by_the_limits(refuses):
    from kvlab.errors import LIMITS, raised_limits

    with pytest.raises(InvalidArgumentError, match="LIMITS.block_size"):
        RadixTree(page_size=LIMITS.block_size + 1)
    assert RadixTree(page_size=LIMITS.block_size).page_size == LIMITS.block_size
    tree, _ = a_tree()
    with raised_limits(tokens=4):
        refuses(tree, lambda t: t.insert([1, 2, 3, 4, 5]), KvlabError, "LIMITS.tokens")
        refuses(tree, lambda t: t.match(range(5)), KvlabError, "LIMITS.tokens")
        assert tree.insert([9, 9, 9, 9]) == 0
    with raised_limits(total_tokens=tree.total_tokens + 2):
        refuses(tree, lambda t: t.insert([6, 6, 6]), KvlabError, "LIMITS.total_tokens")
        assert tree.insert([6, 6]) == 0
    with raised_limits(total_tokens=1 << 40):
        assert tree.evict((1 << 27) + 1) and tree.total_tokens == tree.protected_size


def test_evicted_nodes_are_the_removed_nodes_in_the_order_of_their_runs():
    tree = RadixTree()
    for first in range(3):
        tree.insert([first])
        tree.insert([first, 5])  # three leaves with the same run (5,)
    runs = tree.evict(4)
    gone = tree.evicted_nodes
    assert [n.key for n in gone] == runs and all(not n.alive for n in gone)
    tree.match([1])
    assert tree.evicted_nodes == ()
