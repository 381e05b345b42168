"""Words for ``kvlab.models.radix.RadixTree``: its event captions and the lesson's indented tree print.

A prompt longer than 12 tokens is shortened to its first 10 and a count, so a caption stays one line.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.core.snapshots import Event, RadixState
from kvlab.errors import InvalidArgumentError
from kvlab.views.text import describes

#: Levels of indentation ``format_tree`` draws; a deeper node is drawn at this indentation with its depth
#: written out. A tree is as deep as its prompts are long, and indenting every level of a tree 50,000
#: deep would print gigabytes (depth x nodes spaces); 64 levels are past any tree one reads by eye.
MAX_INDENT = 64


def format_tree(state: RadixState) -> str:
    """The tree as indented lines, like the lesson prints it: run, 'locked', access time.

    Two spaces per level, up to ``MAX_INDENT`` levels; a node deeper than that starts with
    ``(depth N)`` at the deepest indentation, so the text stays proportional to the tree's size.
    """
    if not isinstance(state, RadixState):
        raise InvalidArgumentError(
            f"format_tree takes a kvlab.core.snapshots.RadixState, got {type(state).__name__}; "
            "take one with RadixTree.snapshot() or from its history"
        )
    lines = []
    for depth, node in state.root.walk():
        if depth == 0:
            continue
        ns = f" extra_key={node.extra_key!r}" if node.extra_key is not None else ""
        locked = " locked" if node.lock_ref > 0 else ""
        indent = "  " * (depth - 1) if depth <= MAX_INDENT else "  " * MAX_INDENT + f"(depth {depth}) "
        lines.append(f"{indent}{list(node.key)}{ns}{locked} t={node.last_access}")
    return "\n".join(lines)


def _show(tokens: Sequence[int]) -> str:
    if len(tokens) <= 12:
        return str(list(tokens))
    return f"[{', '.join(map(str, tokens[:10]))}, ... ({len(tokens)} tokens)]"


def _ns(extra_key: str | None) -> str:
    return "" if extra_key is None else f" (extra_key {extra_key!r})"


@describes("radix.create")
def _create(e: Event) -> str:
    return "empty tree"


@describes("radix.match")
def _match(e: Event) -> str:
    return f"match {_show(e['tokens'])}{_ns(e['extra_key'])}: {e['matched_len']} tokens cached"


@describes("radix.insert")
def _insert(e: Event) -> str:
    return f"insert {_show(e['tokens'])}{_ns(e['extra_key'])}: {e['present']} tokens already present"


@describes("radix.lock", "radix.unlock")
def _lock(e: Event) -> str:
    return f"{e.op} node #{e['node_id']} ({e['depth_tokens']} tokens to the root)"


@describes("radix.evict")
def _evict(e: Event) -> str:
    leaves = len(e["evicted"])
    return f"evict {e['num_tokens']}: freed {e['freed']} tokens in {leaves} {'leaf' if leaves == 1 else 'leaves'}"
