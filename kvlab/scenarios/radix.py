"""``python -m kvlab replay radix``: replay a scenario through ``kvlab.models.radix.RadixTree``.

Config: ``{"page_size": 1}`` (optional, default 1). Ops, applied in order:

* ``{"op": "insert", "tokens": [...], "extra_key": "t1"}`` -> ``prefix_len``, the
  tokens already present (SGLang's ``insert(...).prefix_len``).
* ``{"op": "match", "tokens": [...], "as": "r1", "extra_key": "t1"}`` ->
  ``matched_len``; ``"as"`` names the node the match ended at, for a later lock
  or unlock (a name used again is rebound).
* ``{"op": "lock", "node": "r1"}`` / ``{"op": "unlock", "node": "r1"}``:
  SGLang's ``inc_lock_ref`` / ``dec_lock_ref`` on that node.
* ``{"op": "evict", "num_tokens": 5}`` -> ``evicted_tokens`` and ``evicted``,
  the token runs of the removed nodes in the order they went.

``extra_key`` is optional; ``tokens`` must be a non-empty list of integers (with
``page_size > 1`` a list shorter than a page is allowed and is cut to nothing).

Every record has ``op``, the op's own field(s) above, then ``evictable_size``,
``protected_size`` and ``tree``: the whole tree from the root as nested
``{"key": [...], "lock_ref": n, "children": [...]}`` with children in SGLang's
order; a node in a namespace also has ``"extra_key"``. The root has key ``[]``
and ``lock_ref`` 1, as in SGLang.

Handles follow SGLang's node objects. A split keeps the old object as the lower
part, so a handle still names the same prefix and locks the same path after a
split. A handle whose node was evicted is refused by lock and unlock (SGLang
would walk a detached node and corrupt its totals; a real server never does,
since it only evicts unlocked nodes and locks what it just matched). A handle to
the root (a match of 0 tokens) locks and unlocks nothing, as in SGLang.

``replay_changes(config, ops)`` (``python -m kvlab replay radix --changes``)
yields instead one compact record per op, whose size grows with what the op
did, not with the tree: ``op``, the op's own field(s), ``evictable_size``,
``protected_size``, then what changed, by node id (the root is 0):

* ``nodes``: every node the op created or re-hung, in order, as ``{"id",
  "parent", "key", "lock_ref"}`` (and ``"extra_key"`` when set). A new node
  goes last among its parent's children, except a split's upper node: it
  comes first, then ``{"id", "parent", "cut"}`` for the lower part (an old
  id): its first ``cut`` tokens went to its new parent, the upper node, which
  takes its place among the children;
* ``removed``: the ids evict deleted, in the order they went (``evicted``
  lists their runs in the same order);
* ``node``: for match, the node it ended at; for lock and unlock, the node
  whose path to the root gained or lost one lock (every node on it but the
  root, as the full record's ``lock_ref`` values show).

Folding them from the empty tree gives each full record's ``tree``. The last
record is ``{"final": true, "evictable_size": ..., "protected_size": ...,
"num_nodes": ..., "tree": {...}}``, the full tree once.

Limits: ``page_size`` at most ``LIMITS.block_size``, a prompt at most
``LIMITS.tokens`` token ids of 0..MAX_TOKEN_ID, ``num_tokens`` at most
``LIMITS.total_tokens`` (all a tree may hold), the handle names (``as``) and
``extra_key`` exactly strings. A bad scenario raises ``ScenarioError`` naming
the op's index; the bad op is checked completely before anything is applied.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvlab.errors import InvalidArgumentError, KvlabError, ScenarioError, brief, check_bool, check_size
from kvlab.models.radix import RadixNode, RadixTree
from kvlab.scenarios import Outcome
from kvlab.scenarios.checks import (
    _check_string,
    _op_name,
    check_index,
    check_ops,
    check_token_list,
    plain_object,
    replay_ops,
)

NAME = "radix"
CONFIG_KEYS = ("page_size",)
OP_FIELDS = {
    "insert": ("tokens", "extra_key"),
    "match": ("tokens", "as", "extra_key"),
    "lock": ("node",),
    "unlock": ("node",),
    "evict": ("num_tokens",),
}
REQUIRED = {
    "insert": ("tokens",),
    "match": ("tokens",),
    "lock": ("node",),
    "unlock": ("node",),
    "evict": ("num_tokens",),
}


def replay(config: dict[str, Any], ops: list[Any]) -> list[dict[str, Any]]:
    """Apply ``ops`` to a fresh tree built from ``config``; one record per op."""
    return replay_ops(Run(config), ops)


def replay_changes(config: dict[str, Any], ops: list[Any]) -> Iterator[dict[str, Any]]:
    """Apply ``ops`` to a fresh tree, yielding each op's compact change record, then the final tree."""
    run = Run(config, changes=True)
    check_ops(ops)
    for index, op in enumerate(ops):
        yield run.apply(op, index).record
    tree = run.model
    yield {
        "final": True,
        "evictable_size": tree.evictable_size,
        "protected_size": tree.protected_size,
        "num_nodes": tree.num_nodes,
        "tree": tree_dict(tree),
    }


class Run:
    """A ``RadixTree`` built from a scenario's config, and the node handles its matches named.

    ``changes=True``: each record is the compact change record of ``replay_changes``.
    """

    def __init__(self, config: Any, *, record: bool = False, changes: bool = False) -> None:
        page_size = _page_size(config)
        check_bool("changes", changes)
        self.model = RadixTree(page_size=page_size, record=True) if record else RadixTree(page_size=page_size)
        self.handles: dict[str, RadixNode] = {}
        self._changes = _Changes(self.model) if changes else None

    def apply(self, op: Any, index: int) -> Outcome:
        """Apply one op; a bad op raises ScenarioError naming ``index``, having changed nothing."""
        index = check_index(index)
        if isinstance(op, dict):
            op = plain_object(op, "the op", index)
        name = _op_name(op, index, OP_FIELDS, '{"op": "insert", "tokens": [1, 2]}')
        try:
            return Outcome(_apply(self.model, self.handles, name, op, index, self._changes))
        except KvlabError as exc:
            if isinstance(exc, ScenarioError):
                raise
            raise ScenarioError(str(exc), index) from None


def _page_size(config: object) -> int:
    if not isinstance(config, dict):
        raise ScenarioError('the radix config must be a JSON object such as {"page_size": 1}')
    config = plain_object(config, "the radix config")
    unknown = sorted(set(config) - set(CONFIG_KEYS), key=str)
    if unknown:
        raise ScenarioError(f"unknown radix config key(s) {brief(unknown)}: the only key is 'page_size'")
    value = config.get("page_size", 1)
    if type(value) is not int:
        raise ScenarioError(
            f"config: page_size must be an integer, got {brief(value)} ({type(value).__name__})"
        )
    try:  # bounded by LIMITS.block_size, as a block pool's block_size: SGLang's pages are 1 to 64 tokens
        return check_size("page_size", value, "block_size", minimum=1)
    except InvalidArgumentError as exc:
        raise ScenarioError(f"config: {exc}") from None


def _apply(
    tree: RadixTree,
    handles: dict[str, RadixNode],
    name: str,
    op: dict[str, Any],
    index: int,
    changes: _Changes | None,
) -> dict[str, Any]:
    _check_fields(name, op, index)
    record: dict[str, Any] = {"op": name}
    if name == "insert":
        tokens, extra_key = _key(op, index)
        record["prefix_len"] = tree.insert(tokens, extra_key)
        if changes is not None:
            changes.after_insert(tokens, extra_key)
    elif name == "match":
        tokens, extra_key = _key(op, index)
        handle = _check_string(op, "as", index, "a non-empty string naming the matched node")
        result = tree.match(tokens, extra_key)
        if handle is not None:
            handles[handle] = result.node
        record["matched_len"] = result.matched_len
        if changes is not None:
            changes.after_match(result.node)
    elif name in ("lock", "unlock"):
        ref = _check_string(op, "node", index, 'the name a match gave with "as"')
        if ref not in handles:
            known = ", ".join(repr(h) for h in list(handles)[:8]) or "none yet"
            more = ", ..." if len(handles) > 8 else ""
            raise ScenarioError(
                f'no node named {brief(ref)} (named so far: {known}{more}); name one with a match\'s "as" first',
                index,
            )
        node = handles[ref]
        (tree.lock if name == "lock" else tree.unlock)(node)
        if changes is not None:
            changes.node = node.node_id
    else:
        num_tokens = op["num_tokens"]
        if type(num_tokens) is not int:
            raise ScenarioError(
                f"num_tokens must be an integer, got {brief(num_tokens)} ({type(num_tokens).__name__})", index
            )
        runs = tree.evict(num_tokens)  # the tree bounds it by LIMITS.total_tokens
        record["evicted_tokens"] = sum(len(run) for run in runs)
        record["evicted"] = [list(run) for run in runs]
        if changes is not None:
            changes.after_evict(runs)
    record["evictable_size"] = tree.evictable_size
    record["protected_size"] = tree.protected_size
    if changes is None:
        record["tree"] = tree_dict(tree)
    else:
        record.update(changes.take())
    return record


def _check_fields(name: str, op: dict[str, Any], index: int) -> None:
    unknown = sorted(set(op) - {"op", *OP_FIELDS[name]}, key=str)
    if unknown:
        raise ScenarioError(
            f"unknown field(s) {brief(unknown)} for {name!r}: it takes {', '.join(OP_FIELDS[name])}", index
        )
    missing = [f for f in REQUIRED[name] if f not in op]
    if missing:
        raise ScenarioError(f"{name!r} needs {', '.join(repr(f) for f in missing)}", index)


def _key(op: dict[str, Any], index: int) -> tuple[list[int], str | None]:
    tokens = check_token_list(op["tokens"], index, "a prompt needs at least one token")
    extra_key = op.get("extra_key")
    if extra_key is not None and type(extra_key) is not str:
        raise ScenarioError(
            f"'extra_key' must be a string or null, got {brief(extra_key)} ({type(extra_key).__name__})",
            index,
        )
    return tokens, extra_key


def tree_dict(tree: RadixTree) -> dict[str, Any]:
    """The tree as nested ``{"key", "lock_ref", "children"}`` dicts (``"extra_key"`` when set); no recursion."""
    if not isinstance(tree, RadixTree):
        raise ScenarioError(f"expected a kvlab RadixTree, got {type(tree).__name__}")
    return _subtree_dict(tree.root)


def _subtree_dict(top: RadixNode) -> dict[str, Any]:
    def own(node: RadixNode) -> dict[str, Any]:
        out: dict[str, Any] = {"key": list(node.key), "lock_ref": node.lock_ref}
        if node.extra_key is not None:
            out["extra_key"] = node.extra_key
        out["children"] = []
        return out

    result = own(top)
    stack = [(top, result)]
    while stack:
        node, out = stack.pop()
        kids = out["children"]
        for child in node.children.values():
            converted = own(child)
            kids.append(converted)
            if child.children:
                stack.append((child, converted))
    return result


class _Changes:
    """What each op changed in the tree, found from the tree's public node fields, in time proportional to the op.

    New nodes are told apart by id (ids only grow): an insert's new nodes lie on
    its prompt's path, found by walking down the children (keyed by the first
    token or page, ``(extra_key, that)`` in a namespace: the model's documented
    scheme); a match's split node is the node it returned. Evicted nodes are
    found through a mirror of the leaves (each node's child count, and the
    leaves by run), replayed run by run in the order the tree evicted them, so
    an evict costs its own runs, never a walk of the tree. (The one cost beyond
    that: a run shared by many leaves is looked up among all of them; a
    ``RadixTree`` that reported its evicted nodes would make that O(1).)
    """

    def __init__(self, tree: RadixTree) -> None:
        self.tree = tree
        self.next_id = tree.root.node_id + 1
        self.kids: dict[int, int] = {tree.root.node_id: 0}  # node id -> its children, as the mirror has them
        self.leaves: dict[tuple[int, ...], dict[int, RadixNode]] = {}  # run -> leaves with that run, by id
        self.nodes: list[dict[str, Any]] = []
        self.removed: list[int] = []
        self.node: int | None = None

    def take(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodes": self.nodes, "removed": self.removed}
        if self.node is not None:
            out["node"] = self.node
        self.nodes, self.removed, self.node = [], [], None
        return out

    def _describe(self, node: RadixNode) -> None:
        parent = node.parent
        entry: dict[str, Any] = {
            "id": node.node_id,
            "parent": None if parent is None else parent.node_id,
            "key": list(node.key),
            "lock_ref": node.lock_ref,
        }
        if node.extra_key is not None:
            entry["extra_key"] = node.extra_key
        self.nodes.append(entry)

    def _leaf_in(self, node: RadixNode) -> None:
        self.leaves.setdefault(node.key, {})[node.node_id] = node

    def _leaf_out(self, node: RadixNode, key: tuple[int, ...]) -> None:
        holders = self.leaves.get(key)
        if holders is not None and holders.pop(node.node_id, None) is not None and not holders:
            del self.leaves[key]

    def _new(self, node: RadixNode) -> None:
        """``node`` was just created: describe it (and, for a split, the lower part) and mirror it."""
        self._describe(node)
        lower = [c for c in node.children.values() if c.node_id < self.next_id]
        parent = node.parent
        assert parent is not None
        if lower:  # a split: the upper node took the old node's place; the old node is its child
            (child,) = lower
            self._leaf_out(child, node.key + child.key)  # its run before the split
            self.nodes.append({"id": child.node_id, "parent": node.node_id, "cut": len(node.key)})
            if self.kids[child.node_id] == 0:
                self._leaf_in(child)
            self.kids[node.node_id] = 1
        else:  # a new leaf under its parent
            if self.kids[parent.node_id] == 0 and parent.parent is not None:
                self._leaf_out(parent, parent.key)
            self.kids[parent.node_id] += 1
            self.kids[node.node_id] = 0
            self._leaf_in(node)

    def after_match(self, node: RadixNode) -> None:
        self.node = node.node_id
        if node.node_id >= self.next_id:  # the match split a run: node is the new upper part
            self._new(node)
            self.next_id = node.node_id + 1

    def after_insert(self, tokens: list[int], extra_key: str | None) -> None:
        page = self.tree.page_size
        end = len(tokens) // page * page
        key = tuple(tokens[:end])
        node, pos = self.tree.root, 0
        created: list[RadixNode] = []
        while pos < end:
            first: Any = key[pos] if page == 1 else key[pos : pos + page]
            child = node.children.get(first if extra_key is None else (extra_key, first))
            if child is None:
                break
            if child.node_id >= self.next_id:
                created.append(child)
            pos += len(child.key)
            node = child
        created.sort(key=lambda n: n.node_id)  # a split's upper node before the new leaf below it
        for new in created:
            self._new(new)
        if created:
            self.next_id = created[-1].node_id + 1

    def after_evict(self, runs: list[tuple[int, ...]]) -> None:
        for leaf in self.tree.evicted_nodes:  # in the order they went (their runs are ``runs``)
            self._leaf_out(leaf, leaf.key)
            del self.kids[leaf.node_id]
            self.removed.append(leaf.node_id)
            parent = leaf.parent
            assert parent is not None
            self.kids[parent.node_id] -= 1
            if self.kids[parent.node_id] == 0 and parent.parent is not None:
                self._leaf_in(parent)
