"""Notebook 15's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import pytest

import kvlab.exercises as ex
from kvlab.fleet import FleetConfig, chat_traffic, simulate


@pytest.fixture(scope="module")
def percent():
    traffic = chat_traffic()

    def run(**options) -> float:
        return 100 * simulate(FleetConfig(**options), traffic=traffic).hit_rate

    return run


def test_notebook_15_has_four_exercises():
    assert [e.id for e in ex.exercises("15")] == ["15.1", "15.2", "15.3", "15.4"]


def test_timestamp_before_message(percent):
    expected = percent(header="before-message")
    assert ex.check("15.1", round(expected, 1)).right
    assert ex.check("15.1", expected).right
    assert "fraction" in ex.check("15.1", expected / 100).message
    assert "no timestamp at all" in ex.check("15.1", round(percent(), 1)).message
    assert "at the top of the prompt" in ex.check("15.1", 0.0).message
    assert "not a percentage" in ex.check("15.1", 140).message
    assert "not what kvlab's fleet gives" in ex.check("15.1", round(expected, 1) - 1).message


def test_salt_per_tenant(percent):
    expected = percent(salt="tenant", tenants=10)
    assert ex.check("15.2", round(expected, 1)).right
    assert "with a salt per user" in ex.check("15.2", round(percent(salt="user"), 1)).message
    assert "with no salt" in ex.check("15.2", round(percent(), 1)).message
    assert "fraction" in ex.check("15.2", expected / 100).message


def test_replicas_and_routing(percent):
    rr = round(percent(replicas=4, routing="round-robin"), 1)
    uh = round(percent(replicas=4, routing="user-hash"), 1)
    assert rr < uh
    assert ex.check("15.3", {"round-robin": rr, "user-hash": uh}).right
    assert "swapped" in ex.check("15.3", {"round-robin": uh, "user-hash": rr}).message
    assert "exactly two keys" in ex.check("15.3", {"rr": rr, "hash": uh}).message
    assert "fractions" in ex.check("15.3", {"round-robin": rr / 100, "user-hash": uh / 100}).message
    single = round(percent(), 1)
    assert "single-replica" in ex.check("15.3", {"round-robin": single, "user-hash": uh}).message
    assert "should be a number" in ex.check("15.3", {"round-robin": "65", "user-hash": uh}).message
    assert ex.check("15.3", {"round-robin": ..., "user-hash": ...}).status == ex.NOT_DONE


def test_same_prompt_twice():
    assert ex.check("15.4", [1984, 16]).right
    assert ex.check("15.4", (1984, 16)).right
    assert "at least one position" in ex.check("15.4", [2000, 0]).message
    assert "whole blocks" in ex.check("15.4", [1999, 1]).message
    assert "Swapped" in ex.check("15.4", [16, 1984]).message
    assert "add up to" in ex.check("15.4", [1984, 15]).message
    assert "two whole numbers" in ex.check("15.4", [1984.0, 16]).message
    assert "not what the prefix cache reports" in ex.check("15.4", [1968, 32]).message
