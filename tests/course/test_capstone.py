"""Notebook 16's problems: the agent session's pricing, what a layout must keep, and the fleet router."""

from __future__ import annotations

import pytest

from kvlab.errors import KvlabError
from kvlab.lessons.capstone import (
    EXAMPLE_PRICING,
    NAIVE_FAULTS,
    Pricing,
    agent_session,
    append_only_layout,
    fault_layout,
    fault_lines,
    information_kept,
    longest_prefix,
    naive_layout,
    price_session,
    round_robin,
    route_fleet,
    user_hash,
)


@pytest.fixture(scope="module")
def session():
    return agent_session()


def test_session_is_deterministic_and_varied(session):
    again = agent_session()
    assert again == session
    assert 30 <= session.turns <= 60
    sizes = sorted(len(c.result.split()) for c in session.calls)
    assert sizes[0] < 30 and sizes[-1] > 1000  # a line up to whole documents


def test_naive_layout_breaks_the_prefix_every_turn(session):
    naive = price_session(session, naive_layout)
    append = price_session(session, append_only_layout)
    assert naive.hit_rate < 0.05  # the timestamp on top changes the first block every turn
    assert append.hit_rate > 0.9
    assert append.dollars < naive.dollars
    assert information_kept(session, naive_layout)[0] and information_kept(session, append_only_layout)[0]


def test_each_naive_fault_alone_breaks_the_prefix_and_together_they_are_the_naive_layout(session):
    append = price_session(session, append_only_layout)
    alone = {name: price_session(session, fault_layout(name)) for name in NAIVE_FAULTS}
    assert all(cost.cached_tokens < append.cached_tokens for cost in alone.values())
    assert alone["timestamp first"].cached_tokens == price_session(session, naive_layout).cached_tokens
    assert all(sum(options.values()) == 1 for options in NAIVE_FAULTS.values())  # one fault each
    lines = fault_lines(session)
    assert len(lines) == 2 + len(NAIVE_FAULTS) + 1 and "naive (all three)" in lines[-1]
    with pytest.raises(KvlabError, match="fault must be one of"):
        fault_layout("a timestamp last")


def test_pricing_adds_up(session):
    free_cache = Pricing(uncached_input=1.0, cached_input=0.0, output=0.0)
    cost = price_session(session, append_only_layout, free_cache)
    assert cost.dollars == pytest.approx(cost.prefill_tokens / 1e6)
    assert cost.cached_tokens + cost.prefill_tokens == cost.prompt_tokens
    full = price_session(session, append_only_layout, EXAMPLE_PRICING)
    assert full.dollars > cost.dollars


def test_information_kept_names_what_is_missing(session):
    def drops_tools(s, t):
        return [{"role": "system", "content": s.system}, {"role": "user", "content": s.task}]

    ok, why = information_kept(session, drops_tools)
    assert not ok and "tool definition 0" in why


def test_routers_compared_on_lesson_traffic():
    rr, uh, lp = (route_fleet(r) for r in (round_robin, user_hash, longest_prefix))
    assert uh.hit_rate > rr.hit_rate + 0.15  # one user's turns stay on one replica
    assert lp.hit_rate > rr.hit_rate + 0.15
    assert lp.imbalance <= 1.25
    assert sum(lp.requests) == sum(rr.requests)


@pytest.mark.parametrize(
    "router",
    [lambda r, reps: 99, lambda r, reps: "0", lambda r, reps: 1 / 0, "not a function"],
)
def test_a_bad_router_is_refused_with_a_clear_error(router):
    with pytest.raises(KvlabError):
        route_fleet(router, users=4, turns=1)


def test_bad_prices_refused():
    for bad in (-1, float("nan"), True, "3"):
        with pytest.raises(KvlabError):
            Pricing(uncached_input=bad, cached_input=0, output=0)
