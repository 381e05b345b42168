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

A bad scenario raises ``ScenarioError`` naming the op's index; the bad op is
checked completely before anything is applied.
"""

from __future__ import annotations

from typing import Any

from kvlab.errors import InvalidArgumentError, KvlabError, ScenarioError, check_int, check_tokens
from kvlab.models.radix import RadixNode, RadixTree
from kvlab.scenarios import Outcome
from kvlab.scenarios.checks import replay_ops

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


class Run:
    """A ``RadixTree`` built from a scenario's config, and the node handles its matches named."""

    def __init__(self, config: Any, *, record: bool = False) -> None:
        page_size = _page_size(config)
        self.model = RadixTree(page_size=page_size, record=True) if record else RadixTree(page_size=page_size)
        self.handles: dict[str, RadixNode] = {}

    def apply(self, op: Any, index: int) -> Outcome:
        """Apply one op; a bad op raises ScenarioError naming ``index``, having changed nothing."""
        try:
            return Outcome(_apply(self.model, self.handles, op))
        except KvlabError as exc:
            raise ScenarioError(str(exc), index) from None


def _page_size(config: object) -> int:
    if not isinstance(config, dict):
        raise ScenarioError('the radix config must be a JSON object such as {"page_size": 1}')
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ScenarioError(f"unknown radix config key(s) {unknown}: the only key is 'page_size'")
    try:
        return check_int("page_size", config.get("page_size", 1), minimum=1)
    except InvalidArgumentError as exc:
        raise ScenarioError(f"config: {exc}") from None


def _apply(tree: RadixTree, handles: dict[str, RadixNode], op: object) -> dict[str, Any]:
    name, fields = _check_shape(op)
    record: dict[str, Any] = {"op": name}
    if name == "insert":
        tokens, extra_key = _key(fields)
        record["prefix_len"] = tree.insert(tokens, extra_key)
    elif name == "match":
        tokens, extra_key = _key(fields)
        handle = fields.get("as")
        if handle is not None and (not isinstance(handle, str) or not handle):
            raise InvalidArgumentError(
                f"'as' must be a non-empty string naming the matched node, got {handle!r}"
            )
        result = tree.match(tokens, extra_key)
        if handle is not None:
            handles[handle] = result.node
        record["matched_len"] = result.matched_len
    elif name in ("lock", "unlock"):
        ref = fields["node"]
        if not isinstance(ref, str):
            raise InvalidArgumentError(f"'node' must be the name a match gave with \"as\", got {ref!r}")
        if ref not in handles:
            known = ", ".join(repr(h) for h in handles) or "none yet"
            raise InvalidArgumentError(
                f'no node named {ref!r} (named so far: {known}); name one with a match\'s "as" first'
            )
        (tree.lock if name == "lock" else tree.unlock)(handles[ref])
    else:
        runs = tree.evict(fields["num_tokens"])
        record["evicted_tokens"] = sum(len(run) for run in runs)
        record["evicted"] = [list(run) for run in runs]
    record["evictable_size"] = tree.evictable_size
    record["protected_size"] = tree.protected_size
    record["tree"] = tree_dict(tree)
    return record


def _check_shape(op: object) -> tuple[str, dict[str, Any]]:
    if not isinstance(op, dict):
        raise InvalidArgumentError(
            f'each op must be a JSON object such as {{"op": "insert", "tokens": [1, 2]}}, '
            f"got {type(op).__name__}"
        )
    name = op.get("op")
    if name not in OP_FIELDS:
        raise InvalidArgumentError(f"unknown op {name!r}: use one of {', '.join(OP_FIELDS)}")
    unknown = sorted(set(op) - {"op", *OP_FIELDS[name]})
    if unknown:
        raise InvalidArgumentError(
            f"unknown field(s) {unknown} for {name!r}: it takes {', '.join(OP_FIELDS[name])}"
        )
    missing = [f for f in REQUIRED[name] if f not in op]
    if missing:
        raise InvalidArgumentError(f"{name!r} needs {', '.join(repr(f) for f in missing)}")
    return name, op


def _key(fields: dict[str, Any]) -> tuple[list[int], str | None]:
    tokens = check_tokens("tokens", fields["tokens"])
    extra_key = fields.get("extra_key")
    if extra_key is not None and not isinstance(extra_key, str):
        raise InvalidArgumentError(f"'extra_key' must be a string or null, got {extra_key!r}")
    return tokens, extra_key


def tree_dict(tree: RadixTree) -> dict[str, Any]:
    """The tree as nested ``{"key", "lock_ref", "children"}`` dicts (``"extra_key"`` when set)."""

    def convert(node: RadixNode) -> dict[str, Any]:
        out: dict[str, Any] = {"key": list(node.key), "lock_ref": node.lock_ref}
        if node.extra_key is not None:
            out["extra_key"] = node.extra_key
        out["children"] = [convert(child) for child in node.children.values()]
        return out

    return convert(tree.root)
