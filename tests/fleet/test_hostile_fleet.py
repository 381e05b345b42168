"""Hostile input for the fleet: kvlab's own error, before any traffic is drawn, never a crash or a hang.

Every field of ``FleetConfig`` and every argument of ``chat_traffic``, ``timestamp_tokens``,
``route``, ``replica_capacities``, ``salt_of`` and ``simulate``/``simulate_many`` gets values from
``tests/hostile.py``; absurd sizes (a trillion-token system prompt, a billion users) are refused at
once with a message that names the limit.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from hostile import AlwaysEqual, hostile_values, kvlab_or_ok, quick_refusal
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import LIMITS
from kvlab.fleet import (
    FleetConfig,
    chat_traffic,
    replica_capacities,
    route,
    simulate,
    simulate_many,
    timestamp_tokens,
)
from kvlab.fleet.config import salt_of
from kvlab.fleet.traffic import max_traffic_tokens, prompt_lengths, prompts_and_answers

FAST = settings(max_examples=30, deadline=None)
TINY = {"users": 3, "turns": 2, "system_tokens": 20, "capacity_blocks": 50}
FIELDS = [f.name for f in fields(FleetConfig)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"system_tokens": 10**12}, "LIMITS.tokens"),
        ({"users": 10**9}, "LIMITS.users"),
        ({"turns": 10**9}, "LIMITS.turns"),
        ({"replicas": 10**9}, "LIMITS.replicas"),
        ({"block_size": 10**9}, "LIMITS.block_size"),
        ({"capacity_blocks": 10**30}, "LIMITS.total_tokens"),
        ({"users": 100_000}, "LIMITS.total_tokens"),
        ({"users": 1000, "turns": 1000}, "LIMITS.total_tokens"),
        ({"seed": 10**400}, "seed must be at most"),
        ({"users": 4.0}, "pass an int"),
        ({"header": np.array(["none"])}, "unknown header"),
        ({"routing": AlwaysEqual()}, "unknown routing"),
        ({"salt": AlwaysEqual()}, "unknown salt"),
        ({"hash_scheme": np.array(["exact"])}, "unknown hash_scheme"),
        ({"salt": "tenant", "tenants": 10**30}, "LIMITS.users"),
    ],
)
def test_absurd_configs_are_refused_at_once(kwargs, match):
    quick_refusal(lambda: FleetConfig(**kwargs), match)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: chat_traffic(system_tokens=10**12), "LIMITS.tokens"),
        (lambda: chat_traffic(users=200_000), "LIMITS.total_tokens"),
        (lambda: timestamp_tokens(2**40), "clock must be at most"),
        (lambda: timestamp_tokens(-1), "clock must be at least 0"),
        (lambda: timestamp_tokens("7"), "clock must be an integer"),
        (lambda: replica_capacities(10**30, 2), "LIMITS.total_tokens"),
        (lambda: replica_capacities(100, 10**30), "LIMITS.replicas"),
        (lambda: simulate(FleetConfig(**TINY), engine=True, concurrent=10**30), "LIMITS.slots"),
        (lambda: simulate(FleetConfig(**TINY), engine=True, busy_blocks=10**30), "LIMITS.num_blocks"),
        (lambda: simulate(FleetConfig(capacity_blocks=10**7), engine=True), "LIMITS.num_blocks"),
        (lambda: simulate_many(iter(lambda: FleetConfig(**TINY), None)), "LIMITS.total_tokens"),
        (lambda: route(FleetConfig(**TINY), 0, 99), "user must be at most 2"),
    ],
)
def test_absurd_calls_are_refused_at_once(call, match):
    quick_refusal(call, match)


def test_the_traffic_bound_holds_for_the_lesson_and_is_an_upper_bound():
    traffic = chat_traffic(users=20, turns=4, system_tokens=100)
    for header in ("none", "start", "before-message"):
        sent = sum(p + a for p, a in prompt_lengths(traffic, header))
        assert sent <= max_traffic_tokens(20, 4, 100)
    assert max_traffic_tokens(200, 6, 1200) <= LIMITS.total_tokens  # the lesson's traffic


@FAST
@given(value=hostile_values(), which=st.sampled_from(FIELDS))
def test_fleet_config_refuses_hostile_fields(value, which):
    args = dict(TINY)
    args[which] = value
    if which == "tenants":
        args["salt"] = "tenant"
    kvlab_or_ok(lambda: FleetConfig(**args))


@FAST
@given(value=hostile_values(), which=st.sampled_from(["users", "turns", "seed", "system_tokens"]))
def test_chat_traffic_refuses_hostile_sizes(value, which):
    args: dict[str, Any] = {"users": 2, "turns": 2, "seed": 1, "system_tokens": 10, which: value}
    kvlab_or_ok(lambda: chat_traffic(**args))


@FAST
@given(value=hostile_values())
def test_small_public_functions_refuse_hostile_values(value):
    config = FleetConfig(**TINY)
    traffic = chat_traffic(3, 2, 1, 20)
    kvlab_or_ok(lambda: timestamp_tokens(value))
    kvlab_or_ok(lambda: route(value, 0, 0))
    kvlab_or_ok(lambda: route(config, value, 0))
    kvlab_or_ok(lambda: route(config, 0, value))
    kvlab_or_ok(lambda: salt_of(config, value))
    kvlab_or_ok(lambda: replica_capacities(value, 2))
    kvlab_or_ok(lambda: replica_capacities(100, value))
    kvlab_or_ok(lambda: prompt_lengths(traffic, value))
    kvlab_or_ok(lambda: list(prompts_and_answers(value, "none")))


@FAST
@given(
    value=hostile_values(),
    which=st.sampled_from(["configs", "names", "engine", "concurrent", "busy_blocks", "traffic"]),
)
def test_simulate_many_refuses_hostile_arguments(value, which):
    args: dict[str, Any] = {"configs": [FleetConfig(**TINY)], which: value}
    kvlab_or_ok(lambda: simulate_many(**args))
