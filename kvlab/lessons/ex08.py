"""Lesson example 8: three prompts share a system prompt in a radix tree; a match, a lock, an eviction.

The three inserts leave the shared run ``1..6`` in one node with two branches below it; the new
request matches 9 of its 10 tokens (``1..6`` then ``20, 21, 22``) and locks that path; evicting 1
token frees the least recently used unlocked leaf, ``[30, 31]``: 2 tokens, as eviction takes whole
leaves only.

The lesson printed its two trees; ``LESSON_TREE_AFTER_INSERTS`` and ``LESSON_TREE_AFTER_EVICT`` hold
that text. ``node_rows`` lines a tree of kvlab's up against one of them node by node, for
``compare_table``. The access times (``t=``) are left out of those rows and listed as not reproduced
(``ACCESS_TIMES``): kvlab's clock ticks where SGLang 0.5.23 reads its clock, the lesson's once per
operation, and only their order is compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvlab.core.snapshots import History, RadixState
from kvlab.errors import LIMITS, InvalidArgumentError, brief, check_text
from kvlab.models.radix import RadixTree
from kvlab.views.text.radix import format_tree


@dataclass(frozen=True)
class Example8:
    """What example 8 shows, step by step."""

    tree_after_inserts: RadixState
    token_entries: int  # tokens stored in the tree after the three inserts
    prompt_tokens: int  # tokens in the three prompts
    matched_len: int
    evicted_runs: tuple[tuple[int, ...], ...]
    evicted_tokens: int
    evictable_size: int
    protected_size: int
    tree_after_evict: RadixState
    history: History[RadixState]
    least_recent_leaf: tuple[int, ...] = ()  # the run of the leaf used longest ago, after the inserts


EXAMPLE_8_PROMPTS = (
    (1, 2, 3, 4, 5, 6, 10, 11),  # system prompt 1..6 + question A
    (1, 2, 3, 4, 5, 6, 20, 21, 22),  # the same system prompt + question B
    (1, 2, 3, 4, 5, 6, 10, 11, 30, 31),  # turn 2 of conversation A
)
EXAMPLE_8_REQUEST = (1, 2, 3, 4, 5, 6, 20, 21, 22, 40)


def example_8() -> Example8:
    """Three inserts, a match, a lock of its path, and an eviction of 1 token."""
    tree = RadixTree(page_size=1, record=True)
    for prompt in EXAMPLE_8_PROMPTS:
        tree.insert(prompt)
    after_inserts = tree.snapshot()
    leaves = [node for _, node in after_inserts.root.walk() if not node.children]
    oldest = min(leaves, key=lambda node: node.last_access)
    hit = tree.match(EXAMPLE_8_REQUEST)
    tree.lock(hit.node)
    runs = tree.evict(1)
    assert tree.history is not None
    return Example8(
        tree_after_inserts=after_inserts,
        token_entries=after_inserts.total_tokens,
        prompt_tokens=sum(len(p) for p in EXAMPLE_8_PROMPTS),
        matched_len=hit.matched_len,
        evicted_runs=tuple(runs),
        evicted_tokens=sum(len(r) for r in runs),
        evictable_size=tree.evictable_size,
        protected_size=tree.protected_size,
        tree_after_evict=tree.snapshot(),
        history=tree.history,
        least_recent_leaf=tuple(oldest.key),
    )


LESSON_TREE_AFTER_INSERTS = """\
[1, 2, 3, 4, 5, 6] t=3
  [10, 11] t=3
    [30, 31] t=3
  [20, 21, 22] t=2"""
"""The lesson's tree after the three inserts, exactly as it printed it."""

LESSON_TREE_AFTER_EVICT = """\
[1, 2, 3, 4, 5, 6] locked t=4
  [10, 11] t=3
  [20, 21, 22] locked t=4"""
"""The lesson's tree after the match, the lock and the eviction, exactly as it printed it."""

ACCESS_TIMES = (
    "kvlab's clock ticks where SGLang 0.5.23 reads time.monotonic() (once per match or insert walk, "
    "twice per node created), the lesson's once per operation; only their order is compared"
)
"""Why the lesson's ``t=`` values are not reproduced, for ``compare_table(not_reproduced=...)``."""


@dataclass(frozen=True)
class PrintedNode:
    """One line of a printed tree: how deep the node is, its run, whether it is locked, its ``t=``."""

    depth: int
    run: str  # "[10, 11]", as printed
    locked: bool
    last_access: int

    def shape(self) -> str:
        """The node without its access time: what kvlab and the lesson must agree on."""
        return f"depth {self.depth}: {self.run}{' locked' if self.locked else ''}"


def printed_nodes(printed_tree: str) -> list[PrintedNode]:
    """The nodes of a tree printed the lesson's way (two spaces per level, ``run [locked] t=N``)."""
    nodes = []
    for line in check_text("printed_tree", printed_tree).splitlines():
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        head, sep, time = body.rpartition(" t=")
        locked = head.endswith(" locked")
        run = head.removesuffix(" locked")
        digits = re.fullmatch(rf"[0-9]{{1,{LIMITS.int_digits}}}", time, re.ASCII)
        if indent % 2 or not sep or digits is None or not (run.startswith("[") and run.endswith("]")):
            raise InvalidArgumentError(
                f"not a line of a printed radix tree: {brief(line)}; each line is two spaces per level, then "
                f"'[tokens] t=N' (or '[tokens] locked t=N') with N in digits 0-9, at most {LIMITS.int_digits} of them"
            )
        nodes.append(PrintedNode(indent // 2 + 1, run, locked, int(time)))
    return nodes


def tree_nodes(state: RadixState) -> list[PrintedNode]:
    """The nodes below the root of one of kvlab's trees, in the order the lesson prints them."""
    if not isinstance(state, RadixState):
        raise InvalidArgumentError(
            f"tree_nodes takes a RadixState (RadixTree.snapshot()), got {type(state).__name__}"
        )
    return [
        PrintedNode(depth, str(list(node.key)), node.lock_ref > 0, node.last_access)
        for depth, node in state.root.walk()
        if depth > 0
    ]


def node_rows(state: RadixState, printed_tree: str, when: str = "") -> list[tuple[str, str, str | None]]:
    """``compare_table`` rows "node 2{when}", ...: kvlab's nodes beside the lesson's printed ones, in print
    order, access times aside. A row is named by kvlab's node id, the number the captions ("lock node
    #3") and the figures use; a line only the lesson prints is named "lesson line N" and shows "(none)"
    on kvlab's side, and a node only kvlab has gets None (shown "—") on the lesson's, so either way the
    row differs."""
    when = check_text("when", when)
    if not isinstance(state, RadixState):
        raise InvalidArgumentError(
            f"node_rows takes a RadixState (RadixTree.snapshot()), got {type(state).__name__}"
        )
    ids = [node.node_id for depth, node in state.root.walk() if depth > 0]
    ours = [n.shape() for n in tree_nodes(state)]
    theirs = [n.shape() for n in printed_nodes(printed_tree)]
    return [
        (
            f"node {ids[i]}{when}" if i < len(ids) else f"lesson line {i + 1}{when}",
            ours[i] if i < len(ours) else "(none)",
            theirs[i] if i < len(theirs) else None,
        )
        for i in range(max(len(ours), len(theirs)))
    ]


def access_times(printed_tree: str) -> str:
    """The ``t=`` values of a printed tree, in print order: "t=3, 3, 3, 2"."""
    return "t=" + ", ".join(str(n.last_access) for n in printed_nodes(printed_tree))


def side_by_side(state: RadixState, printed_tree: str) -> str:
    """kvlab's printed tree and the lesson's, line by line in two columns."""
    ours, theirs = format_tree(state).splitlines(), check_text("printed_tree", printed_tree).splitlines()
    width = max(len("kvlab"), *(len(line) for line in ours)) + 4
    lines = [f"{'kvlab':<{width}}lesson"]
    for i in range(max(len(ours), len(theirs))):
        a = ours[i] if i < len(ours) else ""
        b = theirs[i] if i < len(theirs) else ""
        lines.append(f"{a:<{width}}{b}".rstrip())
    return "\n".join(lines)
