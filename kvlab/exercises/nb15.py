"""Exercises of notebook 15, prefix caching at fleet scale (lesson 002's "Try it").

The expected answers come from ``kvlab.fleet`` and ``kvlab.models.prefix_cache``; nothing here states them.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from kvlab.exercises.core import NotYet, exercise, expect_two_whole
from kvlab.fleet import ChatTraffic, FleetConfig, chat_traffic, simulate
from kvlab.models.prefix_cache import PrefixCache

TOLERANCE = 0.05  # percentage points: answers rounded to one decimal place are right


@cache
def _traffic() -> ChatTraffic:
    """The lesson's requests (200 users, 6 turns, seed 1), drawn once for every check."""
    return chat_traffic()


@cache
def _percent(config: FleetConfig) -> float:
    """The hit rate of one scenario of the lesson's fleet, in percent (cached: checks may be repeated)."""
    return 100 * simulate(config, traffic=_traffic()).hit_rate


def _check_percent(answer: float, expected: float, others: dict[str, FleetConfig]) -> None:
    """NotYet unless ``answer`` is ``expected`` percent; name the common mistakes (``others``' hit rates) first."""
    if 0 < answer <= 1 and abs(100 * answer - expected) < TOLERANCE:
        raise NotYet(f"{answer} looks like a fraction; give a percentage (a number from 0 to 100).")
    if abs(answer - expected) < TOLERANCE:
        return
    for what, config in others.items():
        if abs(answer - _percent(config)) < TOLERANCE:
            raise NotYet(f"{answer}% is the hit rate {what}; change the configuration as the exercise asks.")
    if not 0 <= answer <= 100:
        raise NotYet(f"{answer} is not a percentage: a hit rate lies between 0 and 100%.")
    raise NotYet(f"{answer}% is not what kvlab's fleet gives for this configuration.")


@exercise(
    "15.1",
    title="The timestamp before the new message",
    assesses="predicting which blocks a volatile field invalidates from where it sits in the prompt, "
    "then measuring it on the fleet",
    minutes=5,
    answer_type="number",
    points=2,
    difficulty="core",
    prerequisites=["09.1"],
    hints=[
        "FleetConfig has a header option with three places for the timestamp; keep every other setting "
        "as in the lesson (200 users, 20,000 blocks).",
        "simulate(FleetConfig(header='before-message')).hit_rate is a fraction; multiply by 100.",
    ],
)
def timestamp_before_message(answer: float) -> str:
    expected = _percent(FleetConfig(header="before-message"))
    others = {
        "with no timestamp at all": FleetConfig(),
        "with the timestamp at the top of the prompt": FleetConfig(header="start"),
    }
    _check_percent(answer, expected, others)
    return (
        f"{expected:.1f}%: nearly all the reuse survives. Placed before the message, the timestamp only "
        "changes blocks that are new on this turn anyway, and it stays in the history that later turns resend."
    )


@exercise(
    "15.2",
    title="A salt per tenant",
    assesses="weighing isolation against reuse: how much a per-tenant salt costs compared with none "
    "and with a salt per user",
    minutes=5,
    answer_type="number",
    points=2,
    difficulty="core",
    prerequisites=["15.1"],
    hints=[
        "Use salt='tenant' with tenants=10: 200 users in groups of 20 share a salt.",
        "simulate(FleetConfig(salt='tenant', tenants=10)).hit_rate, in percent.",
    ],
)
def salt_per_tenant(answer: float) -> str:
    expected = _percent(FleetConfig(salt="tenant", tenants=10))
    others = {"with no salt": FleetConfig(), "with a salt per user": FleetConfig(salt="user")}
    _check_percent(answer, expected, others)
    return (
        f"{expected:.1f}%, close to no salt. The shared system prompt is now computed once per tenant "
        "instead of once for everybody, and each tenant's 20 users still share it."
    )


@exercise(
    "15.3",
    title="Four replicas: round-robin or user hash",
    assesses="explaining why routing decides hits in a fleet: a prefix only helps on the replica that holds it",
    minutes=10,
    answer_type="dict",
    points=2,
    difficulty="core",
    prerequisites=["15.1"],
    hints=[
        "Two runs with replicas=4 and the lesson's 20,000 blocks (5,000 per replica); only routing differs.",
        "Give {'round-robin': ..., 'user-hash': ...} with each hit rate in percent.",
    ],
)
def replicas_and_routing(answer: dict[Any, Any]) -> str:
    if set(answer) != {"round-robin", "user-hash"}:
        raise NotYet("Give a dict with exactly two keys, 'round-robin' and 'user-hash'.")
    expected = {
        routing: _percent(FleetConfig(replicas=4, routing=routing))
        for routing in ("round-robin", "user-hash")
    }
    values = {}
    for routing, value in answer.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise NotYet(f"answer[{routing!r}] should be a number (a percentage), got {value!r}.")
        values[routing] = float(value)
    if all(0 < v <= 1 for v in values.values()):
        raise NotYet("These look like fractions; give percentages (numbers from 0 to 100).")
    swapped = all(abs(values[a] - expected[b]) < TOLERANCE for a, b in
                  (("round-robin", "user-hash"), ("user-hash", "round-robin")))  # fmt: skip
    if swapped:
        raise NotYet(
            "The two values are swapped: which routing sends a user's next turn to the same replica?"
        )
    for routing in ("round-robin", "user-hash"):
        if abs(values[routing] - expected[routing]) < TOLERANCE:
            continue
        if abs(values[routing] - _percent(FleetConfig())) < TOLERANCE:
            raise NotYet(
                f"{values[routing]}% is the single-replica hit rate; set replicas=4 for {routing!r}."
            )
        raise NotYet(f"{values[routing]}% is not what kvlab's fleet gives for {routing!r} routing.")
    rr, uh = expected["round-robin"], expected["user-hash"]
    return (
        f"Round-robin {rr:.1f}%, user hash {uh:.1f}%. "
        "Round-robin sends a user's next turn to another replica three times in four, where only the "
        "system prompt is cached; a sticky hash keeps each session where its history is."
    )


def _same_prompt_twice(num_tokens: int, block_size: int) -> tuple[int, int]:
    """(cached, computed) tokens of the second of two identical prompts, from the prefix-cache model."""
    rng = random.Random(15)
    prompt = [rng.randrange(50_000) for _ in range(num_tokens)]
    pool = PrefixCache(2 * (num_tokens // block_size + 1), block_size)
    pool.allocate("first", prompt)
    pool.free("first")
    second = pool.allocate("second", prompt)
    return second.num_cached_tokens, second.num_computed_tokens


@exercise(
    "15.4",
    title="The same 2,000-token prompt twice",
    assesses="applying both rounding rules (whole blocks, the last token always computed) to a repeated prompt",
    minutes=10,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["06.3"],
    hints=[
        "The last prompt token is always computed, so at most 1,999 tokens can come from the cache.",
        "Hits come in whole 16-token blocks: how many full blocks fit in 1,999 tokens?",
    ],
)
def same_prompt_twice(answer: list[Any]) -> str:
    cached, computed = _same_prompt_twice(2000, 16)
    expect_two_whole(answer, "[cached tokens, computed tokens] of the second request")
    if answer[0] + answer[1] != cached + computed:
        raise NotYet(f"The two numbers add up to {sum(answer):,}; the prompt has 2,000 tokens.")
    if answer == [2000, 0]:
        raise NotYet(
            "Not all of it: the model must run on at least one position to produce the first new token."
        )
    if answer == [1999, 1]:
        raise NotYet("Only the last token must run, but the cache hands out whole blocks, not single tokens.")
    if answer == [computed, cached]:
        raise NotYet("Swapped: the first number is what came from the cache, the second what was computed.")
    if answer != [cached, computed]:
        raise NotYet(f"{answer} is not what the prefix cache reports for the second request.")
    return (
        f"{cached:,} cached, {computed} computed; the first request computed all 2,000. Prefill work falls "
        f"{2000 // computed}-fold and the time to first token with it (less than that: each step has fixed "
        "costs); decode is unchanged."
    )
