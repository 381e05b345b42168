"""A radix tree of cached prefixes, kept the way SGLang's ``RadixCache`` keeps it (lesson example 8's model).

Each edge holds a run of tokens and, for every token, the KV slot that holds its
keys and values. Prompts that share a prefix share the nodes of that prefix. A
running request *locks* the path to the node its prefix ended at, so eviction,
which removes whole unlocked leaves in least-recently-accessed order, can never
take KV that a request still reads.

What follows SGLang (``python/sglang/srt/mem_cache/radix_cache.py``, the
``RadixKey``/``evictable_leaves`` generation of 2025, with the default LRU
eviction policy) and why it matters:

* **A lookup can change the tree.** ``match`` walks down while the next child
  key is present; when the match ends inside a run, the node is split there and
  the new *upper* node is returned. ``insert`` splits the same way, then hangs
  the rest of the prompt below as one new leaf. ``insert`` returns how many
  tokens were already present (SGLang's ``prefix_len``); their slots are not
  allocated again.
* **Children are a dict keyed by the child key** (the first token, or the first
  page as a tuple; ``(extra_key, that)`` inside a namespace). So children keep
  insertion order, and a split keeps the position: the upper node replaces the
  old node under the same key. A leaf removed and inserted again goes last.
* **Access times.** SGLang stamps ``time.monotonic()``; here a logical clock
  ticks at exactly the same call points, in the same order, so every LRU order
  comes out the same. They are: node creation (``TreeNode.__init__`` reads the
  clock twice, for ``last_access_time`` then ``creation_time``; the root is
  created with the tree); the start of every match walk and every insert walk
  (one reading, shared by the root and every node the walk steps onto,
  including a node it is about to split). The upper node a split creates is
  therefore *newer* than the lower part, and an insert's new leaf newer still.
  A match whose key is empty after page truncation returns the root without
  reading the clock; an insert in the same case still reads it once. Locking,
  unlocking and eviction never touch the clock.
* **Eviction** pops unlocked leaves from a heap ordered by last access, frees
  each leaf's slots, counts ``len(value)`` tokens, deletes it, and pushes its
  parent when that parent is left childless and unlocked; it stops once at
  least ``num_tokens`` were freed, so it may free more than asked (whole leaves
  only). SGLang rebuilds the heap from its set of evictable leaves on every
  call; here one heap lives across calls with stale entries skipped, which pops
  the same nodes in the same order (no two evictable leaves can share an access
  time: nodes stamped by one walk lie on one root path) at a cost of
  O(log n) per popped leaf instead of O(leaves) per call.
* **Locks** (``inc_lock_ref``/``dec_lock_ref``) walk from the node up to the
  root; a node's tokens move between the evictable and protected totals only
  when its count goes 0 -> 1 or 1 -> 0. The root always has ``lock_ref`` 1.
  Unbalanced unlocks (a handle unlocked that is locked only through a deeper
  one) can take an ancestor's count below 0, as in SGLang; ``unlock`` and
  ``evict`` say what follows.
* **page_size > 1**: keys are cut to whole pages (SGLang's ``page_aligned``),
  matching compares page by page, the child key is the first page, so splits
  happen only on page boundaries and prompts sharing less than a page share no
  node.
* **extra_key**: runs with different extra keys never share a node, even when
  their tokens are equal (SGLang's ``match_prefix`` docstring: LoRA ids, salts).
  None is a namespace of its own, not a wildcard: a lookup without an extra key
  never sees runs cached under one.

Where the lesson's Java program simplifies: its clock ticks once per operation
(its ``t=`` values are 1, 2, 3...), it evicts exactly one leaf, and its split
does not stamp the new node. The tree, the matched length, which leaf goes and
the sizes of example 8 come out the same; the access times here are the
logical SGLang clock, and ``evict`` is SGLang's (whole leaves until enough).
Eviction strategies other than LRU (lfu, fifo, priority...) are not modelled.

The replay of this tree is checked record by record against SGLang 0.5.23's real
``RadixCache`` on random scenarios by ``tools/conformance/fuzz_sglang.py``.

Names: ``RadixTree`` is SGLang's ``RadixCache``, ``match``/``insert``/``lock``/``unlock``/``evict``
are its ``match_prefix``/``insert``/``inc_lock_ref``/``dec_lock_ref``/``evict``, ``SlotAllocator``
stands for its token-to-KV pool allocator, and a node's ``last_access`` is ``last_access_time``.
A recording tree adds one step per operation with an ``Event`` (``radix.create``, ``radix.match``,
``radix.insert``, ``radix.lock``, ``radix.unlock``, ``radix.evict``); the words, and ``format_tree``
(the lesson's indented print of a tree), are in ``kvlab.views.text.radix``; the lesson's run is
``kvlab.lessons.ex08``. Kept as one module, longer than most: the clock, the split and the eviction
heap must follow SGLang step for step for the conformance check to hold.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Hashable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain

from kvlab.core.hashing import check_token_ids
from kvlab.core.snapshots import Event, History, RadixNodeState, RadixState
from kvlab.errors import (
    LIMITS,
    InvalidArgumentError,
    brief,
    check_bool,
    check_size,
)

__all__ = [
    "MatchResult",
    "RadixNode",
    "RadixTree",
    "SlotAllocator",
]


class SlotAllocator:
    """Hands out one KV slot index per token and takes them back.

    Freed slots are reused first, oldest-freed first, as SGLang's token-to-KV
    pool allocator does (it appends freed slots to its free list and allocates
    from the front). The pool is unbounded: the tree, not the pool, decides
    when to evict.
    """

    def __init__(self) -> None:
        self._next_fresh = 0
        self._free: list[int] = []  # freed slots; the live part starts at _head
        self._head = 0
        self.in_use: set[int] = set()
        self.allocated_total = 0
        self.freed_total = 0

    def alloc(self, n: int) -> tuple[int, ...]:
        take = min(n, len(self._free) - self._head)
        out = self._free[self._head : self._head + take]
        self._head += take
        if self._head > 4096 and 2 * self._head > len(self._free):
            del self._free[: self._head]
            self._head = 0
        fresh = n - take
        if fresh:
            out.extend(range(self._next_fresh, self._next_fresh + fresh))
            self._next_fresh += fresh
        self.in_use.update(out)
        self.allocated_total += n
        return tuple(out)

    def free(self, slots: Sequence[int]) -> None:
        if not self.in_use.issuperset(slots) or len(set(slots)) != len(slots):
            raise RuntimeError(
                f"a slot of {list(slots)[:8]} is freed twice"
            )  # a bug in the tree, not user error
        self.in_use.difference_update(slots)
        self._free.extend(slots)
        self.freed_total += len(slots)


class RadixNode:
    """One node: the run of tokens on the edge into it and their KV slots.

    Nodes are handed out as handles (by ``match``) to pass back to ``lock`` and
    ``unlock``; read their fields, never write them. A split keeps the object
    of the node that was split as the *lower* part, so a handle always stands
    for the same prefix (root to the end of its run). ``alive`` turns false
    when the node is evicted.
    """

    __slots__ = (
        "node_id",
        "key",
        "value",
        "extra_key",
        "parent",
        "children",
        "lock_ref",
        "last_access",
        "creation_time",
        "alive",
        "tree",
        "_state",
    )

    def __init__(
        self,
        tree: RadixTree,
        node_id: int,
        key: tuple[int, ...],
        value: tuple[int, ...],
        extra_key: str | None,
        parent: RadixNode | None,
    ) -> None:
        self.tree = tree
        self.node_id = node_id
        self.key = key
        self.value = value
        self.extra_key = extra_key
        self.parent = parent
        self.children: dict[Hashable, RadixNode] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.creation_time = 0
        self.alive = True
        self._state: RadixNodeState | None = None  # this subtree's snapshot, while nothing in it changed

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def prefix(self) -> tuple[int, ...]:
        """All tokens from the root to the end of this node's run."""
        runs = []
        node: RadixNode | None = self
        while node is not None:
            runs.append(node.key)
            node = node.parent
        return tuple(t for run in reversed(runs) for t in run)

    def __repr__(self) -> str:
        shown = list(self.key[:8])
        more = "..." if len(self.key) > 8 else ""
        ns = f" extra_key={self.extra_key!r}" if self.extra_key is not None else ""
        state = "" if self.alive else " evicted"
        return f"RadixNode(#{self.node_id} {shown}{more}{ns} lock_ref={self.lock_ref}{state})"


@dataclass(frozen=True)
class MatchResult:
    """What ``match`` found: how many tokens, the node the match ended at, and their KV slots."""

    matched_len: int
    node: RadixNode
    values: tuple[int, ...]


class RadixTree:
    """SGLang's radix cache: match, insert, lock, unlock, evict (see the module docstring).

    ``page_size`` is the number of tokens per KV page (1: token granularity).
    With ``record=True`` the tree keeps a ``History`` of ``RadixState``
    snapshots, step 0 the empty tree, then one step per operation.

    Inputs are checked before anything changes, so a refused call leaves the
    tree (and its clock) as it was:

    * token ids are ``0..MAX_TOKEN_ID`` (2**31 - 1), kvlab's one range of ids;
      a prompt has at most ``LIMITS.tokens`` ids (4,194,304, past any context
      window) and the tree holds at most ``LIMITS.total_tokens`` (134M: an
      insert is refused when the tokens held plus its length would pass it, a
      bound a Python tree of that size already needs gigabytes for);
    * ``page_size`` is at most ``LIMITS.block_size`` (65,536, far above SGLang's
      page sizes of 1 to 64); ``evict``'s ``num_tokens`` at most
      ``LIMITS.total_tokens``, all a tree can hold;
    * ``extra_key`` is exactly a ``str`` or None (a ``str`` subclass could
      compare or hash as it likes, and children are keyed by it);
    * a handle is a ``RadixNode`` of this tree (exactly that type), still alive.

    A tree is as deep as its prompts are long, far beyond Python's recursion
    limit, so no walk here recurses. Each operation costs what SGLang's does
    (a walk down one path, O(log n) per evicted leaf), recording included:
    ``snapshot`` rebuilds only the nodes an operation touched (one path, each
    with its tuple of children) and shares every other subtree with the
    previous snapshot, never walking the whole tree.
    """

    def __init__(self, page_size: int = 1, record: bool = False) -> None:
        self.page_size = check_size("page_size", page_size, "block_size", minimum=1)
        check_bool("record", record)
        self.allocator = SlotAllocator()
        self._clock = 0
        self._next_id = 0
        self._num_nodes = 0
        self._evictable_size = 0
        self._protected_size = 0
        # entries (last_access, push number, node); stale ones are skipped when popped
        self._heap: list[tuple[int, int, RadixNode]] = []
        self._pushes = 0
        self._evicting = False  # no heap rebuild mid-eviction: it would add next call's candidates
        self._matched_node: int | None = None
        self._split_nodes: list[int] = []
        self._evicted_runs: list[tuple[int, ...]] = []
        self._evicted_nodes: list[RadixNode] = []
        self.root = self._new_node((), (), None, None)
        self.root.lock_ref = 1
        self.history: History[RadixState] | None = History() if record else None
        if self.history is not None:
            self._record(Event.of("radix.create", page_size=self.page_size))

    # ------------------------------------------------------------------ public API

    @property
    def evictable_size(self) -> int:
        """Tokens in unlocked nodes: what eviction could free."""
        return self._evictable_size

    @property
    def protected_size(self) -> int:
        """Tokens in locked nodes: in use by running requests."""
        return self._protected_size

    @property
    def total_tokens(self) -> int:
        return self._evictable_size + self._protected_size

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, the root included."""
        return self._num_nodes

    @property
    def clock(self) -> int:
        """The logical clock: how many times SGLang would have read ``time.monotonic()``."""
        return self._clock

    def match(self, tokens: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """Find the longest cached prefix of ``tokens`` (whole pages); may split a node.

        Returns the matched length, the node the match ended at (the root when
        nothing matched) and the KV slots of the matched tokens. Refreshes the
        access time of every node on the path.
        """
        tokens = self._check_key(tokens, extra_key)
        self._begin_op()
        result = self._match_walk(tokens, extra_key) if tokens else MatchResult(0, self.root, ())
        self._matched_node = result.node.node_id
        if self.history is not None:
            self._record(
                Event.of("radix.match", tokens=tokens, extra_key=extra_key, matched_len=result.matched_len)
            )
        return result

    def insert(self, tokens: Sequence[int], extra_key: str | None = None) -> int:
        """Cache ``tokens`` (cut to whole pages); return how many were already present.

        The new part becomes one leaf with freshly allocated KV slots; a run
        that the prompt leaves part-way is split first.
        """
        tokens = self._check_key(tokens, extra_key)
        bound = LIMITS.total_tokens
        if self.total_tokens + len(tokens) > bound:  # counted before the walk, which already changes the tree
            raise InvalidArgumentError(
                f"insert of {len(tokens):,} tokens refused: the tree holds {self.total_tokens:,} and may hold "
                f"at most {bound:,} (kvlab's limit LIMITS.total_tokens); evict first, or for a deliberately "
                "larger run use kvlab.errors.raised_limits(total_tokens=...)"
            )
        self._begin_op()
        present = self._insert_walk(tokens, extra_key)
        if self.history is not None:
            self._record(Event.of("radix.insert", tokens=tokens, extra_key=extra_key, present=present))
        return present

    def lock(self, node: RadixNode) -> int:
        """A request starts using ``node``'s prefix: add one lock from it up to the root.

        Returns the change of the evictable size (zero or negative), as
        SGLang's ``inc_lock_ref`` does. Locking the root changes nothing.
        """
        self._check_handle(node, "lock")
        self._begin_op()
        self._changed(node)
        handle = node
        delta = depth = 0
        while node.parent is not None:
            depth += len(node.key)
            if node.lock_ref == 0:
                size = len(node.key)
                self._evictable_size -= size
                self._protected_size += size
                delta -= size
            node.lock_ref += 1
            node = node.parent
        if self.history is not None:
            self._record(Event.of("radix.lock", node_id=handle.node_id, depth_tokens=depth))
        return delta

    def unlock(self, node: RadixNode) -> int:
        """A request is done with ``node``'s prefix: remove one lock from it up to the root.

        Returns the change of the evictable size (zero or positive), as
        SGLang's ``dec_lock_ref`` does. Unlocking a node that is not locked
        (count 0 or below) is refused. Unlocking the root changes nothing.

        The walk itself is SGLang's: it decrements every node on the path, so
        unlocking a handle that was never locked itself, but whose node is
        locked through a deeper handle, drives the ancestors' counts below 0
        when that deeper handle is unlocked too. SGLang keeps such counts, and
        so does this tree: a node at -1 holds no protected tokens and is
        evictable once it is a leaf (see ``evict``).
        """
        self._check_handle(node, "unlock")
        if node.parent is not None and node.lock_ref <= 0:
            raise InvalidArgumentError(
                f"cannot unlock {node!r}: it is not locked; unlock only what a lock call locked"
            )
        self._begin_op()
        self._changed(node)
        handle = node
        delta = depth = 0
        while node.parent is not None:
            depth += len(node.key)
            if node.lock_ref == 1:
                size = len(node.key)
                self._evictable_size += size
                self._protected_size -= size
                delta += size
            node.lock_ref -= 1
            if node.lock_ref <= 0 and not node.children:
                self._push(node)
            node = node.parent
        if self.history is not None:
            self._record(Event.of("radix.unlock", node_id=handle.node_id, depth_tokens=depth))
        return delta

    def evict(self, num_tokens: int) -> list[tuple[int, ...]]:
        """Free at least ``num_tokens`` tokens (if that many are evictable); return the removed runs.

        Whole unlocked leaves go, least recently accessed first; a parent left
        without children (and unlocked) becomes a candidate at once. Can free
        more than asked, never part of a leaf.

        "Unlocked" is SGLang's ``lock_ref <= 0`` for the leaves a call starts
        with, but its ``lock_ref == 0`` for a parent left childless during the
        call: a parent whose count went below 0 (unbalanced unlocks, see
        ``unlock``) becomes a candidate only from the next call on (SGLang
        0.5.23 ``RadixCache.evict`` and ``_update_leaf_status``, checked
        against the real code).
        """
        num_tokens = check_size("num_tokens", num_tokens, "total_tokens")
        self._begin_op()
        freed = 0
        deferred: dict[RadixNode, None] = {}  # parents at lock_ref < 0 left childless by this call
        self._evicting = True
        while freed < num_tokens:
            leaf = self._pop_evictable(deferred)
            if leaf is None:
                break
            self.allocator.free(leaf.value)
            freed += len(leaf.value)
            self._delete_leaf(leaf)
            self._evicted_runs.append(leaf.key)
            self._evicted_nodes.append(leaf)
            parent = leaf.parent
            if parent is not None and not parent.children:
                if parent.lock_ref == 0:
                    self._push(parent)
                elif parent.lock_ref < 0:
                    deferred[parent] = None
        self._evicting = False
        for parent in deferred:
            self._push(parent)
        runs = list(self._evicted_runs)
        if self.history is not None:
            self._record(Event.of("radix.evict", num_tokens=num_tokens, freed=freed, evicted=tuple(runs)))
        return runs

    @property
    def evicted_nodes(self) -> tuple[RadixNode, ...]:
        """The nodes the last operation removed, in the order they went (empty unless it was an evict).

        ``evict`` returns their runs; these are the node objects themselves (no longer
        ``alive``, their ``node_id`` and ``parent`` kept), so a caller that mirrors the
        tree (the replay's ``--changes`` records) learns which nodes went in O(1) each,
        where matching runs against the leaves could cost the number of leaves sharing a run.
        """
        return tuple(self._evicted_nodes)

    def nodes(self) -> Iterator[RadixNode]:
        """Every node, root first, depth first, children in stored order."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))

    def snapshot(self) -> RadixState:
        """The whole tree as an immutable ``RadixState``, with what the last operation did."""
        return RadixState(
            root=self._root_state(),
            page_size=self.page_size,
            evictable_size=self._evictable_size,
            protected_size=self._protected_size,
            matched_node=self._matched_node,
            split_nodes=tuple(self._split_nodes),
            evicted_runs=tuple(self._evicted_runs),
        )

    # ------------------------------------------------------------------ validation

    def _check_key(self, tokens: object, extra_key: object) -> tuple[int, ...]:
        tokens = check_token_ids("tokens", tokens)  # plain ints in range at C speed; else says what is wrong
        if extra_key is not None and type(extra_key) is not str:
            raise InvalidArgumentError(
                "extra_key must be a string (a namespace such as a LoRA id or salt) or None, "
                f"got {brief(extra_key)} ({type(extra_key).__name__})"
            )
        aligned = len(tokens) // self.page_size * self.page_size
        return tuple(tokens[:aligned])

    def _check_handle(self, node: object, action: str) -> None:
        if type(node) is not RadixNode:  # exactly: a subclass or a look-alike could lie about its tree
            raise InvalidArgumentError(
                f"{action} takes a node returned by match(...).node, got {type(node).__name__}"
            )
        if node.tree is not self:
            raise InvalidArgumentError(f"cannot {action} {node!r}: it belongs to another RadixTree")
        if not node.alive:
            raise InvalidArgumentError(
                f"cannot {action} {node!r}: it was evicted; match the prefix again to get a live node"
            )

    # ------------------------------------------------------------------ internals

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _new_node(
        self, key: tuple[int, ...], value: tuple[int, ...], extra_key: str | None, parent: RadixNode | None
    ) -> RadixNode:
        node = RadixNode(self, self._next_id, key, value, extra_key, parent)
        self._next_id += 1
        self._num_nodes += 1
        node.last_access = self._tick()  # TreeNode.__init__: last_access_time = time.monotonic()
        node.creation_time = self._tick()  # ... then creation_time = time.monotonic()
        return node

    def _child_key(self, tokens: tuple[int, ...], start: int, extra_key: str | None) -> Hashable:
        plain: Hashable = tokens[start] if self.page_size == 1 else tokens[start : start + self.page_size]
        return plain if extra_key is None else (extra_key, plain)

    def _common_len(self, run: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
        """Tokens of ``run`` that equal ``tokens[start:]``, rounded down to whole pages."""
        size = len(run)
        if tokens[start : start + size] == run:
            return size
        # bisect on slice comparisons (done in C) down to a short stretch, then step: O(limit), as the
        # token-by-token loop SGLang runs, without a Python step per token of a long run
        lo, hi = 0, min(size, len(tokens) - start)  # run[:lo] matches; the first mismatch is at hi or before
        while hi - lo > 16:
            mid = (lo + hi) // 2
            if run[lo:mid] == tokens[start + lo : start + mid]:
                lo = mid
            else:
                hi = mid
        i = lo
        while i < hi and run[i] == tokens[start + i]:
            i += 1
        return i - i % self.page_size

    def _match_walk(self, tokens: tuple[int, ...], extra_key: str | None) -> MatchResult:
        now = self._tick()  # _match_prefix_helper: one time.monotonic() for the whole walk
        node = self.root
        node.last_access = now
        pos, end = 0, len(tokens)
        values: list[tuple[int, ...]] = []
        while pos < end:
            child = node.children.get(self._child_key(tokens, pos, extra_key))
            if child is None:
                break
            child.last_access = now
            self._push_if_evictable(child)
            common = self._common_len(child.key, tokens, pos)
            if common < len(child.key):
                node = self._split(child, common)
                values.append(node.value)
                pos += common
                break
            values.append(child.value)
            node = child
            pos += common
        self._changed(node)  # every node on the path got a new access time
        return MatchResult(pos, node, tuple(chain.from_iterable(values)))

    def _insert_walk(self, tokens: tuple[int, ...], extra_key: str | None) -> int:
        now = self._tick()  # _insert_helper: one time.monotonic() for the whole walk
        node = self.root
        node.last_access = now
        pos, end = 0, len(tokens)
        if end == 0:
            self._changed(node)
            return 0
        child_key = self._child_key(tokens, 0, extra_key)
        while pos < end and child_key in node.children:
            node = node.children[child_key]
            node.last_access = now
            self._push_if_evictable(node)
            common = self._common_len(node.key, tokens, pos)
            pos += common
            if common < len(node.key):
                node = self._split(node, common)
            if pos < end:
                child_key = self._child_key(tokens, pos, extra_key)
        if pos < end:
            leaf = self._new_node(tokens[pos:], self.allocator.alloc(end - pos), extra_key, node)
            node.children[child_key] = leaf
            self._evictable_size += end - pos
            self._push(leaf)
        self._changed(node)  # the path's access times, and maybe a new child
        return pos

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Cut ``child``'s run at ``at``: a new upper node takes the head, ``child`` keeps the tail."""
        parent = child.parent
        assert parent is not None
        self._changed(parent)
        upper = self._new_node(child.key[:at], child.value[:at], child.extra_key, parent)
        upper.lock_ref = child.lock_ref
        upper.children = {self._child_key(child.key, at, child.extra_key): child}
        parent.children[self._child_key(child.key, 0, child.extra_key)] = upper  # same key: same position
        child.key = child.key[at:]
        child.value = child.value[at:]
        child.parent = upper
        child._state = None  # its ancestors' are gone already (parent's above, upper is new)
        self._split_nodes.append(upper.node_id)
        return upper

    def _delete_leaf(self, leaf: RadixNode) -> None:
        parent = leaf.parent
        assert parent is not None
        self._changed(parent)
        leaf._state = None
        del parent.children[self._child_key(leaf.key, 0, leaf.extra_key)]
        leaf.alive = False  # the parent link stays, as in SGLang
        self._evictable_size -= len(leaf.key)
        self._num_nodes -= 1

    def _push(self, node: RadixNode) -> None:
        self._pushes += 1
        heapq.heappush(self._heap, (node.last_access, self._pushes, node))
        if len(self._heap) > 4 * self._num_nodes + 1024 and not self._evicting:
            self._rebuild_heap()

    def _push_if_evictable(self, node: RadixNode) -> None:
        if node.lock_ref <= 0 and not node.children:
            self._push(node)

    def _is_fresh(self, stamp: int, node: RadixNode) -> bool:
        return node.alive and node.lock_ref <= 0 and not node.children and node.last_access == stamp

    def _pop_evictable(self, not_yet: Container[RadixNode] = ()) -> RadixNode | None:
        """The least recently accessed candidate leaf, skipping (and dropping) ``not_yet`` ones."""
        heap = self._heap
        while heap:
            stamp, _, node = heapq.heappop(heap)
            if self._is_fresh(stamp, node) and node not in not_yet:
                return node
        return None

    def _rebuild_heap(self) -> None:
        """Drop stale entries: one entry per evictable leaf (keeps the heap O(nodes))."""
        self._heap = []
        for node in self.nodes():
            if node.parent is not None and node.lock_ref <= 0 and not node.children:
                self._pushes += 1
                self._heap.append((node.last_access, self._pushes, node))
        heapq.heapify(self._heap)

    def _begin_op(self) -> None:
        self._matched_node = None
        self._split_nodes = []
        self._evicted_runs = []
        self._evicted_nodes = []

    def _record(self, event: Event) -> None:
        """Add a step (the caller checked that the tree records, so nothing is built otherwise)."""
        assert self.history is not None
        self.history.add(event, self.snapshot())

    def _changed(self, node: RadixNode) -> None:
        """``node`` is about to change: drop its cached snapshot and its ancestors'.

        A node whose snapshot is gone has every ancestor's gone too, so the walk
        up stops at the first one already dropped: O(1) while nothing was
        snapshotted since, one path at most.
        """
        walk: RadixNode | None = node
        while walk is not None and walk._state is not None:
            walk._state = None
            walk = walk.parent

    def _root_state(self) -> RadixNodeState:
        """The root's ``RadixNodeState``: rebuild the changed nodes bottom up, reuse the rest."""
        if self.root._state is None:
            changed = []  # the changed nodes, parents before children
            stack = [self.root]
            while stack:
                node = stack.pop()
                changed.append(node)
                for child in node.children.values():
                    if child._state is None:
                        stack.append(child)
            for node in reversed(changed):  # children first
                node._state = RadixNodeState(
                    node.node_id,
                    node.key,
                    node.lock_ref,
                    node.last_access,
                    tuple([c._state for c in node.children.values()]),  # type: ignore[misc]
                    node.extra_key,
                )
        assert self.root._state is not None
        return self.root._state
