"""ContiguousPool: first fit, both kinds of fragmentation, lesson example 1."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvlab.core.snapshots import ContiguousState, Event, Region
from kvlab.errors import DuplicateRequestError, InvalidArgumentError, UnknownRequestError
from kvlab.lessons.ex01 import exact_fit, example_1, reserve_max
from kvlab.models.contiguous import ContiguousPool
from kvlab.views.text import caption, captions

# ---------------------------------------------------------------- lesson example 1


def test_example_1_reserve_the_maximum():
    part = example_1().reserve_max
    assert part.placed == ("r0", "r1", "r2", "r3")
    assert part.rejected == ("r4",)
    assert [(r.start, r.end) for r in part.history[-1].state.regions] == [
        (0, 2048), (2048, 4096), (4096, 6144), (6144, 8192),
    ]  # fmt: skip
    assert part.reserved == 8192
    assert part.stored == 2350
    assert f"{part.stored_percent:.1f}" == "28.7"
    assert part.internal_fragmentation == 8192 - 2350


def test_example_1_exact_sizes_leave_gaps():
    part = example_1().exact_fit
    assert part.free == 1892
    assert part.gaps == (600, 400, 892)
    assert part.largest_gap == 892
    assert part.new_request == 900
    assert part.new_request_placed is False
    assert part.external_fragmentation == 1892 - 892
    final = part.history[-1].state
    assert final.rejected == ("q6",)
    assert [g for _, g in final.gaps] == [600, 400, 892]


def test_example_1_history_steps():
    part = example_1().exact_fit
    # empty pool, six reservations, two releases, one refusal
    assert len(part.history) == 10
    assert part.history[0].state.regions == ()
    assert "refused" in caption(part.history[-1])
    assert part.history[-1].state.regions == part.history[-2].state.regions


# ---------------------------------------------------------------- first fit


def test_first_fit_takes_the_lowest_gap_that_is_large_enough():
    pool = ContiguousPool(100)
    for rid, size in [("a", 10), ("b", 20), ("c", 10), ("d", 30)]:
        pool.reserve(rid, size)
    pool.release("a")  # gap [0, 10)
    pool.release("c")  # gap [30, 40)
    assert pool.gaps() == [(0, 10), (30, 10), (70, 30)]
    assert pool.reserve("e", 15).start == 70  # no earlier gap holds 15
    assert pool.reserve("f", 10).start == 0  # lowest gap, exact fit
    assert pool.reserve("g", 5).start == 30
    assert pool.gaps() == [(35, 5), (85, 15)]


def test_used_and_fragmentation_counters():
    pool = ContiguousPool(50)
    pool.reserve("a", 20, used=5)
    pool.reserve("b", 10)
    assert (pool.reserved, pool.stored, pool.free) == (30, 15, 20)
    assert pool.internal_fragmentation == 15
    assert pool.stored_fraction == 15 / 50
    pool.release("a")
    assert pool.gap_sizes() == [20, 20]
    assert pool.external_fragmentation == 20
    assert pool.largest_gap == 20
    assert pool.find_gap(21) is None and pool.find_gap(20) == 0


def test_refusal_changes_only_the_rejected_list():
    pool = ContiguousPool(100, record=True)
    pool.reserve("a", 60)
    before = pool.snapshot()
    assert pool.reserve("b", 41) is None
    after = pool.snapshot()
    assert after.regions == before.regions
    assert after.rejected == ("b",)
    assert pool.history is not None and pool.history[-1].state == after
    assert pool.reserve("b", 40) is not None  # a refused id may try again


def test_release_returns_the_region():
    pool = ContiguousPool(10)
    region = pool.reserve("a", 4, used=1)
    assert region == Region("a", 0, 4, 1)
    assert pool.release("a") == region
    assert pool.regions == ()


def test_not_recording_keeps_no_history():
    assert ContiguousPool(10).history is None


def test_steps_record_events_that_read_as_captions():
    pool = ContiguousPool(100, record=True)
    pool.reserve("a", 60, used=10)
    pool.reserve("b", 41)
    pool.release("a")
    assert pool.history is not None
    assert pool.history.events == [
        Event.of("contiguous.create", pool_size=100),
        Event.of("contiguous.reserve", request_id="a", size=60, used=10, start=0),
        Event.of("contiguous.reserve", request_id="b", size=41, used=41, start=None, largest_gap=40),
        Event.of("contiguous.release", request_id="a", start=0, end=60),
    ]
    assert captions(pool.history) == [
        "empty pool of 100 slots",
        "a: 60 slots at [0, 60), 10 used",
        "b: 41 slots refused, largest gap 40",
        "a finishes: [0, 60) is free",
    ]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("pool_size", "error", "message"),
    [
        (0, InvalidArgumentError, "pool_size must be at least 1"),
        (-5, InvalidArgumentError, "pool_size must be at least 1"),
        ("8192", InvalidArgumentError, "pool_size must be an integer"),
        (8192.0, InvalidArgumentError, "pool_size must be an integer"),
        (True, InvalidArgumentError, "pool_size must be an integer"),
    ],
)
def test_bad_pool_size(pool_size, error, message):
    with pytest.raises(error, match=message):
        ContiguousPool(pool_size)


def test_bad_record_flag():
    with pytest.raises(InvalidArgumentError, match="record must be True or False"):
        ContiguousPool(10, record="yes")


def _busy_pool() -> ContiguousPool:
    pool = ContiguousPool(100, record=True)
    pool.reserve("a", 30, used=10)
    pool.reserve("b", 20)
    pool.release("a")
    return pool


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda p: p.reserve("c", 0), InvalidArgumentError, "size must be at least 1"),
        (lambda p: p.reserve("c", -3), InvalidArgumentError, "size must be at least 1"),
        (lambda p: p.reserve("c", 2.5), InvalidArgumentError, "size must be an integer"),
        (
            lambda p: p.reserve("c", 10, used=11),
            InvalidArgumentError,
            r"used \(11\) cannot exceed size \(10\)",
        ),
        (lambda p: p.reserve("c", 10, used=-1), InvalidArgumentError, "used must be at least 0"),
        (lambda p: p.reserve(7, 10), InvalidArgumentError, "request_id must be a non-empty string"),
        (lambda p: p.reserve("", 10), InvalidArgumentError, "request_id must be a non-empty string"),
        (lambda p: p.reserve("b", 10), DuplicateRequestError, "'b' already holds a region"),
        (lambda p: p.release("a"), UnknownRequestError, "no region for request 'a'; held: 'b'"),
        (lambda p: p.release("zz"), UnknownRequestError, "no region for request 'zz'"),
        (lambda p: p.release(None), InvalidArgumentError, "request_id must be a non-empty string"),
        (lambda p: p.region("zz"), UnknownRequestError, "no region"),
        (lambda p: p.find_gap(0), InvalidArgumentError, "size must be at least 1"),
    ],
)
def test_bad_calls_change_nothing(call, error, message, refuses):
    refuses(_busy_pool(), call, error, message)


def test_unknown_request_message_is_not_quoted_like_a_key_error():
    pool = ContiguousPool(10)
    with pytest.raises(UnknownRequestError) as info:
        pool.release("x")
    assert str(info.value).startswith("no region")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: reserve_max([300, 3000], max_len=2048), r"lengths\[1\] = 3000 exceeds max_len = 2048"),
        (lambda: reserve_max([300, 0]), r"lengths\[1\] must be at least 1"),
        (lambda: reserve_max("300"), "lengths must be a list"),
        (lambda: reserve_max([300], max_len=0), "max_len must be at least 1"),
        (lambda: reserve_max([300], pool_size=0), "pool_size must be at least 1"),
        (lambda: exact_fit([10, 20], finished=[2], new_request=5), "finished index 2 is out of range"),
        (lambda: exact_fit([10, 20], finished=[1, 1], new_request=5), "finished lists a request twice"),
        (lambda: exact_fit([10, 20], finished=[-1], new_request=5), "finished index must be at least 0"),
        (lambda: exact_fit([10, 20], finished=[], new_request=0), "new_request must be at least 1"),
    ],
)
def test_bad_runner_arguments(call, message):
    with pytest.raises(InvalidArgumentError, match=message):
        call()


def test_runners_generalize():
    part = reserve_max([10, 20, 30], pool_size=100, max_len=40)
    assert part.placed == ("r0", "r1") and part.stored == 30 and part.internal_fragmentation == 50
    gaps = exact_fit([10, 20, 30], finished=[0, 2], new_request=45, pool_size=100)
    assert gaps.gaps == (10, 70) and gaps.new_request_placed is True


# ---------------------------------------------------------------- invariants


class ContiguousMachine(RuleBasedStateMachine):
    """Random reserves and releases against a plain list model of first fit."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = ContiguousPool(200)
        self.next_id = 0

    @rule(size=st.integers(1, 120), used_fraction=st.floats(0, 1))
    def reserve(self, size, used_fraction):
        used = int(size * used_fraction)
        gaps_before = self.pool.gaps()
        rid = f"q{self.next_id}"
        self.next_id += 1
        region = self.pool.reserve(rid, size, used=used)
        fitting = [start for start, gap in gaps_before if gap >= size]
        if fitting:
            assert region == Region(rid, fitting[0], size, used)
        else:
            assert region is None
            assert self.pool.rejected[-1] == rid
            assert self.pool.gaps() == gaps_before

    @precondition(lambda self: self.pool.regions)
    @rule(index=st.integers(0, 63))
    def release(self, index):
        region = self.pool.regions[index % len(self.pool.regions)]
        free_before = self.pool.free
        assert self.pool.release(region.owner) == region
        assert self.pool.free == free_before + region.size

    @invariant()
    def regions_are_disjoint_and_inside_the_pool(self):
        state: ContiguousState = self.pool.snapshot()
        pos = 0
        for r in state.regions:
            assert r.start >= pos and 0 <= r.used <= r.size
            pos = r.end
        assert pos <= state.pool_size
        assert state.reserved + sum(g for _, g in state.gaps) == state.pool_size
        # gaps are maximal: two gaps never touch
        gaps = state.gaps
        assert all(a[0] + a[1] < b[0] for a, b in zip(gaps, gaps[1:], strict=False))


ContiguousMachine.TestCase.settings = settings(max_examples=10, stateful_step_count=150, deadline=None)
TestContiguousMachine = ContiguousMachine.TestCase
