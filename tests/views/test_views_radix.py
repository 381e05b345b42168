"""The radix tree's figure, animation and text on trees deeper than the recursion limit, and hostile input."""

from __future__ import annotations

import sys

import pytest
from hostile import hostile_values
from hypothesis import HealthCheck, given, settings

from kvlab.errors import KvlabError
from kvlab.lessons import ex08
from kvlab.models.radix import RadixTree
from kvlab.views.animations import radix_animation
from kvlab.views.radix import radix_extent, radix_tree_figure
from kvlab.views.text import caption
from kvlab.views.text.radix import MAX_INDENT, format_tree


def deep_tree(depth: int) -> RadixTree:
    """A tree ``depth`` nodes deep, built by inserts (each leaves the top run one token shorter)."""
    tree = RadixTree(record=True)
    tree.insert(list(range(depth + 1)))
    for k in range(depth - 1, -1, -1):
        tree.insert([*range(k), 10**6])
    return tree


@pytest.fixture(scope="module")
def deep() -> RadixTree:
    return deep_tree(5000)


def test_a_tree_5000_deep_draws_prints_and_animates(deep) -> None:
    assert sys.getrecursionlimit() < 5000
    state = deep.snapshot()
    assert radix_extent(state) == (5001, 5000, 0)
    fig = radix_tree_figure(state, title="5,000 deep")
    nodes = next(t for t in fig.data if t.name == "nodes")
    assert len(nodes.text) == deep.num_nodes and max(nodes.x) == 5000  # grows to the right: depth along x
    text = format_tree(state)
    assert len(text.splitlines()) == deep.num_nodes - 1
    assert max(map(len, text.splitlines())) < 2 * MAX_INDENT + 40
    assert deep.history is not None
    anim = radix_animation(deep.history.steps[-3:])
    last_title = anim.frames[-1].layout.title.text.replace("<br>", " ")
    assert len(anim.frames) == 3 and caption(deep.history[-1]) in last_title


def test_format_tree_keeps_the_lesson_s_indentation_up_to_max_indent() -> None:
    tree = deep_tree(MAX_INDENT + 2)
    lines = format_tree(tree.snapshot()).splitlines()
    chain = [line for line in lines if "1000000" not in line]
    for depth, line in enumerate(chain, start=1):
        if depth <= MAX_INDENT:
            assert line.startswith("  " * (depth - 1) + "[") and line.split(" t=")[0].strip().startswith("[")
        else:
            assert line.startswith("  " * MAX_INDENT + f"(depth {depth}) [")
    assert format_tree(ex08.example_8().tree_after_inserts).splitlines()[1].startswith("  [10, 11] t=")


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(value=hostile_values())
def test_hostile_states_and_titles_are_refused(value) -> None:
    state = ex08.example_8().tree_after_evict
    for call in (
        lambda: format_tree(value),
        lambda: radix_tree_figure(value),
        lambda: radix_animation(value),
        lambda: radix_extent(value),
    ):
        with pytest.raises(KvlabError):
            call()
    for call in (
        lambda: radix_tree_figure(state, title=value),
        lambda: radix_animation([state], title=value),
    ):
        try:
            call()
        except KvlabError as exc:
            assert str(exc)
