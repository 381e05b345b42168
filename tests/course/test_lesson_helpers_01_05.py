"""The lesson helpers notebooks 01 to 05 call instead of building tables and data in their cells: each
reproduces every figure the lesson's program printed, and refuses what is not its input."""

from __future__ import annotations

import pytest
from hostile import all_hostile_values, kvlab_or_ok
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import InvalidArgumentError
from kvlab.lessons import ex01, ex02, ex03, ex04, ex05
from kvlab.models.paged import BlockPool
from kvlab.models.utilization import fill_paged, request_lengths


def _lesson_tables():
    """Every (name, rows) the five notebooks print with compare_table, as their cells call them."""
    one, two, three = ex01.example_1(), ex02.example_2(), ex03.example_3()
    four, five = ex04.example_4(), ex05.example_5()
    return {
        "01 part one": ex01.part_one_rows(one.reserve_max),
        "01 part two": ex01.part_two_rows(one.exact_fit),
        "02 block tables": ex02.block_table_rows(two),
        "02 translations": ex02.translation_rows(two),
        "03": ex03.example_3_rows(three),
        "04 fork": ex04.fork_rows(four),
        "04 writes": ex04.write_rows(four),
        "04 child requests": ex04.child_request_rows(ex04.child_requests()),
        "05": ex05.example_5_rows(five),
        "05 prefix cache": ex05.prefix_cache_rows(ex05.in_prefix_cache()),
    }


def _plain(value):
    """A figure as compare_table compares it: tuples as lists."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def test_every_row_agrees_with_the_figure_the_lesson_printed():
    for name, rows in _lesson_tables().items():
        assert rows, name
        for what, ours, lesson in rows:
            assert _plain(ours) == _plain(lesson), f"{name}: {what}"


def test_the_tables_cover_every_figure_the_lessons_programs_print():
    tables = _lesson_tables()
    named = {name: {what for what, _, _ in rows} for name, rows in tables.items()}
    assert named["01 part one"] == set(ex01.LESSON_PART_ONE)
    assert named["01 part two"] == set(ex01.LESSON_PART_TWO)
    assert len(tables["02 translations"]) == len(ex02.LESSON_TRANSLATIONS) == 5
    assert named["03"] == set(ex03.LESSON_FIGURES)
    assert len(tables["04 writes"]) == len(ex04.LESSON_WRITES) + len(ex04.LESSON_AFTER_WRITES)
    assert named["05"] == set(ex05.LESSON_FIGURES)


def test_the_rows_are_kvlabs_own_figures_not_copies_of_the_lessons():
    other = ex01.reserve_max([300, 1000, 150], pool_size=3072, max_len=1024)
    rows = dict((what, ours) for what, ours, _ in ex01.part_one_rows(other))
    assert rows["where each region starts"] == [0, 1024, 2048] and rows["request refused"] == []
    assert rows["share of the pool holding KV"] == "47.2%"
    fork = dict((what, ours) for what, ours, _ in ex04.fork_rows(ex04.parallel_sampling(50, 2)))
    assert fork["tables after the fork"] == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_describe_write_says_in_place_or_which_copy():
    pool = BlockPool(8, 16)
    pool.allocate("s0", 40)
    pool.fork("s0", "s1")
    assert ex04.describe_write(pool.append("s1", 1)) == "copy 2 -> 3, 8 entries"
    assert ex04.describe_write(pool.append("s0", 1)) == "in place"


def test_child_requests_take_vllms_route_first_child_computes_the_others_hit_full_blocks():
    route = ex04.child_requests(40, 3, block_size=16)
    assert [list(c.block_table) for c in route.children] == [[0, 1, 2], [0, 1, 3], [0, 1, 4]]
    assert [(c.num_cached_tokens, c.num_computed_tokens) for c in route.children] == [
        (0, 40),
        (32, 8),
        (32, 8),
    ]
    assert route.log[1] == "child 1: table [0, 1, 3], reused 32 tokens, computed 8"


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.integers(2, 8),
    full_blocks=st.integers(0, 4),
    partial=st.integers(1, 7),
    n=st.integers(1, 5),
)
def test_child_requests_share_as_much_as_copy_on_write_when_the_last_block_is_partial(
    block_size, full_blocks, partial, n
):
    prompt_len = full_blocks * block_size + 1 + partial % (block_size - 1)  # never a whole number of blocks
    route = ex04.child_requests(prompt_len, n, block_size=block_size)
    sampled = ex04.parallel_sampling(prompt_len, n, block_size=block_size)
    assert route.blocks_in_use == sampled.blocks_used == full_blocks + n
    assert sorted(route.ref_counts.values()) == sorted(sampled.ref_counts.values())


def test_block_size_table_is_one_fill_per_block_size():
    lines = ex03.block_size_table([1, 16, 256]).splitlines()
    assert lines[0].split()[:2] == ["block", "size"] and len(lines) == 4
    lengths = request_lengths(5, 40)
    for line, block_size in zip(lines[1:], (1, 16, 256), strict=True):
        fill = fill_paged(lengths, pool_size=8192, block_size=block_size)
        assert line.split() == [
            str(block_size),
            str(fill.requests),
            f"{fill.stored_percent:.1f}%",
            str(fill.wasted_slots),
        ]


@pytest.mark.parametrize("sizes", [[], [0], [16.0], [True], "16", [8193], list(range(1, 14)), None, [[16]]])
def test_block_size_table_refuses_what_is_not_a_short_list_of_block_sizes(sizes):
    with pytest.raises(InvalidArgumentError):
        ex03.block_size_table(sizes)


@pytest.mark.parametrize(
    "call",
    [
        lambda: ex01.part_one_rows(ex01.example_1().exact_fit),
        lambda: ex01.part_two_rows(ex01.example_1()),
        lambda: ex02.block_table_rows(None),
        lambda: ex02.translation_rows(ex03.example_3()),
        lambda: ex03.example_3_rows(ex02.example_2()),
        lambda: ex04.fork_rows(ex05.example_5()),
        lambda: ex04.write_rows({}),
        lambda: ex04.describe_write("in place"),
        lambda: ex04.child_request_rows(ex04.example_4()),
        lambda: ex04.child_requests(4_194_304, 4096),
        lambda: ex05.example_5_rows(ex05.shared_prefix([[1, 2, 3]])),
        lambda: ex05.prefix_cache_rows(ex05.in_prefix_cache()[:1]),
        lambda: ex05.in_prefix_cache(block_size=0),
    ],
)
def test_the_helpers_refuse_what_is_not_their_input(call):
    with pytest.raises(InvalidArgumentError):
        call()


@settings(max_examples=60, deadline=None)
@given(value=all_hostile_values())
def test_the_helpers_take_or_refuse_hostile_values(value):
    for helper in (
        ex01.part_one_rows,
        ex01.part_two_rows,
        ex02.block_table_rows,
        ex02.translation_rows,
        ex03.example_3_rows,
        ex04.fork_rows,
        ex04.write_rows,
        ex04.describe_write,
        ex04.child_request_rows,
        ex05.example_5_rows,
        ex05.prefix_cache_rows,
    ):
        assert not kvlab_or_ok(lambda h=helper: h(value))
    kvlab_or_ok(lambda: ex03.block_size_table(value))
    kvlab_or_ok(lambda: ex04.child_requests(value, 2, block_size=4))
    kvlab_or_ok(lambda: ex04.child_requests(8, value, block_size=4))
    kvlab_or_ok(lambda: ex05.in_prefix_cache(block_size=value))
