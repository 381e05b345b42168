"""The lesson helpers notebooks 06 to 09 call instead of defining their own (what they return, what they
refuse), and the start page's promises that the README and the instructors' page must agree with."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import all_hostile_values, kvlab_or_ok
from hypothesis import given, settings

from kvlab.core.hashing import short
from kvlab.errors import InvalidArgumentError
from kvlab.lessons.compare import compare_table
from kvlab.lessons.course import total_minutes
from kvlab.lessons.ex06 import LESSON_CHAINS, changed_blocks, example_6, example_6_links, example_6_variants
from kvlab.lessons.ex07 import example_7
from kvlab.lessons.ex08 import (
    LESSON_TREE_AFTER_EVICT,
    LESSON_TREE_AFTER_INSERTS,
    access_times,
    example_8,
    node_rows,
    printed_nodes,
    side_by_side,
    tree_nodes,
)
from kvlab.lessons.ex09 import example_9, turn_table
from kvlab.models.radix import RadixTree

ROOT = Path(__file__).resolve().parents[2]


def test_example_6_reproduces_the_lessons_chains_and_which_blocks_change():
    chains = example_6()
    assert {name: tuple(short(d) for d in chain) for name, chain in chains.items()} == LESSON_CHAINS
    assert {name: list(link.digests) for name, link in example_6_links().items()} == chains
    for scheme in ("lesson", "vllm"):
        ours = example_6(scheme)
        assert [changed_blocks(ours[n], ours["base"]) for n in ("late edit", "early edit", "cache salt")] == [
            [2],
            [0, 1, 2],
            [0, 1, 2],
        ]
    assert list(example_6_variants()) == ["base", "late edit", "early edit"]


@pytest.mark.parametrize(
    ("chain", "reference"),
    [([b"a"], [b"a", b"b"]), (["a"], ["a"]), ("ab", "ab"), (None, []), ([1], [1])],
)
def test_changed_blocks_refuses_what_is_not_two_chains_of_one_length(chain, reference):
    with pytest.raises(InvalidArgumentError):
        changed_blocks(chain, reference)


def test_example_7_keeps_each_requests_table_and_hits():
    lesson = example_7()
    assert lesson.tables == {"A": (0, 1, 2), "B": (3, 4), "C": (0, 1, 5), "D": (2, 4, 3)}
    assert lesson.hits == {"A": (), "B": (), "C": (0, 1), "D": ()}


def test_the_lessons_printed_trees_match_kvlabs_node_for_node_access_times_aside():
    lesson = example_8()
    for state, printed, times in (
        (lesson.tree_after_inserts, LESSON_TREE_AFTER_INSERTS, "t=3, 3, 3, 2"),
        (lesson.tree_after_evict, LESSON_TREE_AFTER_EVICT, "t=4, 3, 4"),
    ):
        assert [n.shape() for n in tree_nodes(state)] == [n.shape() for n in printed_nodes(printed)]
        assert all(ours == theirs for _, ours, theirs in node_rows(state, printed))
        assert access_times(printed) == times
        assert [n.last_access for n in tree_nodes(state)] != [n.last_access for n in printed_nodes(printed)]
        table = side_by_side(state, printed).splitlines()
        assert table[0].split() == ["kvlab", "lesson"] and len(table) == 1 + len(printed.splitlines())
    assert lesson.least_recent_leaf == (20, 21, 22)
    assert (
        printed_nodes(LESSON_TREE_AFTER_EVICT)[0].locked
        and not printed_nodes(LESSON_TREE_AFTER_EVICT)[1].locked
    )


def test_node_rows_name_nodes_by_the_id_the_captions_and_figures_use():
    from kvlab.views.text import caption

    lesson = example_8()
    rows = {
        ours.split(": ", 1)[1]: name
        for name, ours, _ in node_rows(lesson.tree_after_inserts, LESSON_TREE_AFTER_INSERTS)
    }
    assert rows == {
        "[1, 2, 3, 4, 5, 6]": "node 2",
        "[10, 11]": "node 1",
        "[30, 31]": "node 4",
        "[20, 21, 22]": "node 3",
    }
    lock = next(caption(s) for s in lesson.history.steps if caption(s).startswith("lock"))
    assert lock.startswith("lock node #3 ")  # the node that holds [20, 21, 22]
    with pytest.raises(InvalidArgumentError):
        node_rows(LESSON_TREE_AFTER_INSERTS, LESSON_TREE_AFTER_INSERTS)


def test_node_rows_show_a_node_one_side_lacks_and_the_table_marks_it(capsys):
    tree = RadixTree()
    tree.insert([1, 2, 3, 4, 5, 6, 10, 11])
    rows = node_rows(tree.snapshot(), LESSON_TREE_AFTER_INSERTS, " after one insert")
    assert rows[0] == (
        "node 1 after one insert",
        "depth 1: [1, 2, 3, 4, 5, 6, 10, 11]",
        "depth 1: [1, 2, 3, 4, 5, 6]",
    )
    assert [r[1] for r in rows[1:]] == ["(none)"] * 3
    assert [r[0] for r in rows[1:]] == [f"lesson line {i} after one insert" for i in (2, 3, 4)]
    compare_table(rows, "one insert")
    assert capsys.readouterr().out.count("✗ differs") == 4


@pytest.mark.parametrize(
    "text", ["[1, 2] t=x", " [1, 2] t=1", "1, 2 t=1", "[1, 2]", "[1, 2] locked", b"[1] t=1", None]
)
def test_printed_nodes_refuses_a_line_that_is_not_a_printed_node(text):
    with pytest.raises(InvalidArgumentError):
        printed_nodes(text)


@settings(max_examples=60, deadline=None)
@given(value=all_hostile_values())
def test_lesson_helpers_take_or_refuse_hostile_values(value):
    kvlab_or_ok(lambda: printed_nodes(value))
    kvlab_or_ok(lambda: tree_nodes(value))
    kvlab_or_ok(lambda: node_rows(example_8().tree_after_inserts, LESSON_TREE_AFTER_INSERTS, value))
    kvlab_or_ok(lambda: changed_blocks(value, value))


def test_turn_table_has_a_line_per_turn_and_says_where_each_prompt_changed():
    lines = turn_table(example_9()).splitlines()
    assert len(lines) == 11 and lines[0].split()[0] == "turn"
    assert "0 (timestamp)" in lines[2] and "288, 300 (tools)" in lines[2]


# ---------------------------------------------------------------- the start page's promises


def _start_page_text() -> str:
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "00_start_here.ipynb", as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_start_page_and_instructors_page_state_the_same_total_time():
    minutes = total_minutes()
    assert f"{minutes} minutes in all: about {minutes / 60:.1f} hours" in _start_page_text()
    assert f"about {minutes / 60:.1f} hours in all" in (ROOT / "docs" / "instructors.md").read_text()


def test_start_page_and_readme_give_the_same_binder_address_and_versions():
    start, readme = _start_page_text(), (ROOT / "README.md").read_text(encoding="utf-8")
    binder = (
        "https://mybinder.org/v2/gh/<owner>/<repository>/HEAD?urlpath=lab/tree/notebooks/00_start_here.ipynb"
    )
    assert binder in start and binder in readme
    assert "OWNER" not in start and "gh/kvlab/kvlab" not in readme
    for version in ("0.30.0", "0.33.0", "0.5.21", "0.5.23", "0c1e57098", "0.3.36", "0.3.2"):
        assert version in start and version in readme, version


def test_no_solution_pastes_with_a_stray_backslash_line():
    import runpy

    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        for exercise, source in runpy.run_path(str(path))["SOLUTIONS"].items():
            assert not source.startswith("\\"), (
                f"{path.name} {exercise}: the pasted cell starts with a '\\' line"
            )
