"""Reserve-the-maximum against on-demand blocks: lesson example 3."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import InvalidArgumentError, cdiv
from kvlab.lessons.ex03 import example_3
from kvlab.models.utilization import compare_utilization, fill_paged, fill_reserving, request_lengths
from kvlab.views.text import caption


def test_example_3_lengths_come_from_java_random_5():
    lengths = request_lengths(5, 40)
    assert len(lengths) == 40
    assert lengths[:5] == [1187, 1392, 174, 324, 1406]  # 100 + the first nextInt(1400) draws of new Random(5)
    assert all(100 <= n < 1500 for n in lengths)


def test_example_3_reserving():
    fill = example_3().reserving
    assert fill.requests == 4
    assert fill.tokens_stored == 3077
    assert f"{fill.stored_percent:.1f}" == "37.6"


def test_example_3_paged():
    fill = example_3().paged
    assert fill.requests == 8
    assert fill.tokens_stored == 7533
    assert f"{fill.stored_percent:.1f}" == "92.0"
    assert fill.wasted_slots == 51
    assert f"{fill.waste_per_request:.1f}" == "6.4"


def test_example_3_paged_history_fills_the_pool():
    history = example_3().paged.history
    assert history is not None
    # empty pool, 8 admissions, then the ninth request that does not fit
    assert len(history) == 10
    used = [s.state.num_blocks - len(s.state.free_queue) for s in history]
    assert used[0] == 0 and used == sorted(used)
    assert used[-1] == used[-2] == (7533 + 51) // 16
    assert "r8" in caption(history[-1]) and "waits" in caption(history[-1])
    assert caption(history[-1]) == "r8 (1,022 tokens) needs 64 blocks, 38 free: it waits"
    assert history[-1].event.kind == "utilization.wait" and history[-1].event["request_id"] == "r8"
    assert [rid for rid, _ in history[-1].state.tables] == [f"r{i}" for i in range(8)]


def test_example_3_reserving_history():
    history = example_3().reserving.history
    assert history is not None
    assert [len(s.state.regions) for s in history] == [0, 1, 2, 3, 4, 4]
    assert history[-1].state.rejected == ("r4",)


def test_not_recording_keeps_no_history():
    assert fill_paged([10, 20]).history is None
    assert compare_utilization([10], record=False).reserving.history is None


def test_waste_per_request_is_below_one_block():
    fill = fill_paged([17, 32, 1], pool_size=160, block_size=16)
    assert (fill.requests, fill.tokens_stored, fill.wasted_slots) == (3, 50, 15 + 0 + 15)


def test_first_come_first_served_stops_at_the_first_misfit():
    # the third request does not fit; the smaller fourth one is not admitted ahead of it
    fill = fill_paged([64, 64, 64, 16], pool_size=160, block_size=16)
    assert fill.requests == 2
    fill = fill_reserving([10, 10, 10], pool_size=50, max_len=20)
    assert fill.requests == 2


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 600), min_size=1, max_size=30),
    block_size=st.sampled_from([1, 4, 16, 32]),
    pool_blocks=st.integers(1, 200),
)
def test_paged_never_stores_less_than_reserving(lengths, block_size, pool_blocks):
    """Whenever the reservation is a whole number of blocks (as a server's max length is), paging wins.

    With a reservation that is not (say 1 token against 4-token blocks), reserving can fit more
    requests: the claim is about realistic maxima, which are far larger than a block.
    """
    pool_size = pool_blocks * block_size
    paged = fill_paged(lengths, pool_size=pool_size, block_size=block_size)
    max_len = cdiv(max(lengths), block_size) * block_size
    reserving = fill_reserving(lengths, pool_size=pool_size, max_len=max_len)
    assert paged.requests >= reserving.requests
    assert paged.tokens_stored >= reserving.tokens_stored
    assert paged.wasted_slots <= paged.requests * (block_size - 1)
    assert paged.tokens_stored + paged.wasted_slots <= pool_size


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fill_paged([10, 0]), r"lengths\[1\] must be at least 1"),
        (lambda: fill_paged("10"), "lengths must be a list"),
        (lambda: fill_paged([10], pool_size=8, block_size=16), r"pool_size \(8\) is smaller than one block"),
        (lambda: fill_paged([10], block_size=0), "block_size must be at least 1"),
        (lambda: fill_paged([10], pool_size=-1), "pool_size must be at least 1"),
        (lambda: fill_reserving([3000]), r"lengths\[0\] = 3000 exceeds max_len = 2048"),
        (lambda: fill_reserving([10], max_len=1.5), "max_len must be an integer"),
        (lambda: compare_utilization([10, None]), r"lengths\[1\] must be an integer"),
        (lambda: request_lengths("5"), "seed must be an integer"),
        (lambda: request_lengths(5, -1), "count must be at least 0"),
        (lambda: request_lengths(5, 4, spread=0), "spread must be at least 1"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(InvalidArgumentError, match=message):
        call()


def test_the_wait_step_marks_no_blocks():
    """A request that waits allocates nothing, so its snapshot carries no op's hit/new/copied/evicted marks."""
    history = example_3().paged.history
    wait = history[-1].state
    assert history[-1].event.kind == "utilization.wait"
    assert (wait.hit_block_ids, wait.new_block_ids, wait.evicted_block_ids, wait.copied_blocks) == (
        (),
        (),
        (),
        (),
    )
