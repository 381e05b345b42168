"""Exercises of notebook 15, prefix caching at fleet scale (lesson 002's "Try it").

15.1 is a prediction (graded for being made before the notebook reveals the value), 15.2 explains a
number the notebook prints, 15.3 implements the rule behind round-robin's losses and is checked on
hidden cases, 15.4 applies the two rounding rules. The expected answers come from ``kvlab.fleet`` and
``kvlab.models.prefix_cache``; nothing here states them.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from kvlab.exercises.core import NotYet, Prediction, call_for_list, exercise, expect_two_whole
from kvlab.fleet import ChatTraffic, FleetConfig, chat_traffic, route, simulate
from kvlab.models.prefix_cache import PrefixCache

UNLIMITED = 10**7  # blocks: more than the lesson's fleet ever caches, so nothing is evicted
TENANTS = 10  # exercise 15.2


@cache
def _traffic() -> ChatTraffic:
    """The lesson's requests (200 users, 6 turns, seed 1), drawn once for every check."""
    return chat_traffic()


@cache
def _small_traffic() -> ChatTraffic:
    """The notebook's 50-user fleet (the sweep's and the routing section's traffic)."""
    return chat_traffic(users=50)


@cache
def _prefill(config: FleetConfig) -> int:
    """Prompt tokens one scenario of the lesson's fleet prefills (cached: checks may be repeated)."""
    return simulate(config, traffic=_traffic()).prefill_tokens


@exercise(
    "15.1",
    title="Predict: the timestamp before the new message",
    assesses="predicting, before the fleet is run, what a volatile field costs from where it sits in the "
    "prompt (graded for being made before the reveal)",
    minutes=5,
    answer_type="number",
    points=2,
    difficulty="core",
    prerequisites=["09.1"],
    hints=[
        "Which blocks of turn 2's prompt differ from what turn 1 left in the cache when the stamp sits "
        "just before the new message? Look at the third pair of hash chains.",
        "Any percentage from 0 to 100 is a prediction; the reveal cell shows kvlab's figure beside it.",
    ],
    predicts=Prediction(
        reread="'Where a timestamp goes': which blocks a stamp before the message changes, and what "
        "the next turn resends",
        within=3.0,
        unit="%",
    ),
)
def timestamp_prediction(answer: float) -> str:
    if not 0 <= answer <= 100:
        raise NotYet(f"{answer} is not a percentage: a hit rate lies between 0 and 100%.")
    return f"Your guess, {answer:g}%, is kept: run the reveal cell below to see it beside kvlab's figure."


def _salt_split() -> tuple[int, int, int]:
    """(extra prefill of a salt per tenant, of it the system prompt computed again, of it evictions)."""
    salted = {"salt": "tenant", "tenants": TENANTS}
    extra = _prefill(FleetConfig(**salted)) - _prefill(FleetConfig())
    copies = _prefill(FleetConfig(capacity_blocks=UNLIMITED, **salted)) - _prefill(
        FleetConfig(capacity_blocks=UNLIMITED)
    )
    return extra, copies, extra - copies


@exercise(
    "15.2",
    title="Where a per-tenant salt's extra prefill comes from",
    assesses="explaining a measured cost from the rule: a salt makes each tenant compute the shared "
    "prompt once, and its copies crowd the cache",
    minutes=8,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["15.1"],
    hints=[
        "Without a salt the 1,200-token system prompt is computed once for the whole fleet. With a salt "
        "per tenant, how many times? Only the extra times count.",
        "Count the system prompt's computations with a salt per tenant against without one; only the "
        "difference is the first part. The rest of the extra prefill is history the extra copies pushed out.",
    ],
)
def salt_split(answer: list[Any]) -> str:
    extra, copies, evictions = _salt_split()
    system = FleetConfig().system_tokens
    expect_two_whole(answer, "[system prompt computed again, lost to evictions]")
    if sum(answer) != extra:
        raise NotYet(
            f"Your two parts add up to {sum(answer):,}; together they must be the {extra:,} extra tokens."
        )
    if answer == [TENANTS * system, extra - TENANTS * system]:
        raise NotYet(
            "Without a salt the system prompt is computed once too: count only the computations a salt adds."
        )
    if answer == [evictions, copies]:
        raise NotYet("Swapped: the first number is the system prompt computed again, the second evictions.")
    if answer in ([0, extra], [extra, 0]):
        raise NotYet(
            "Both causes add prefill: the extra copies are computed, and they take room in the cache."
        )
    if answer != [copies, evictions]:
        raise NotYet("How many extra times is the 1,200-token system prompt computed with a salt per tenant?")
    return (
        f"{copies:,} = {copies // system} extra computations of the {system:,}-token system prompt (one per "
        f"tenant, less the one any fleet makes); the other {evictions:,} tokens are history evicted because "
        f"the {TENANTS} copies take {TENANTS - 1} × {system // FleetConfig().block_size} more blocks. "
        "With an unlimited cache only the first part remains."
    )


def _orders(rng: random.Random | None) -> list[tuple[list[int], int]]:
    """(users in arrival order, replicas): the notebook's cases, then fresh shuffled ones when grading."""
    cases: list[tuple[list[int], int]] = [
        ([0, 1, 0, 1], 2),
        ([0, 0, 0], 2),
        ([0, 1, 2, 0, 1, 2, 0], 3),
        ([5, 5, 5, 5], 1),
        ([0, 1, 0, 2, 1, 0, 2, 2], 4),
    ]
    if rng is not None:
        for _ in range(12):
            users, turns = rng.randint(1, 8), rng.randint(1, 5)
            order = [u for u in range(users) for _ in range(turns)]
            rng.shuffle(order)
            cases.append((order, rng.randint(1, 6)))
    return cases


def _lands_with_history(users: list[int], replicas: int) -> list[bool]:
    """kvlab.fleet's round-robin: request i goes to ``route(config, i, user)``; compare with the user's last."""
    config = FleetConfig(users=max(users) + 1, replicas=replicas, routing="round-robin")
    last: dict[int, int] = {}
    out = []
    for clock, user in enumerate(users):
        replica = route(config, clock, user)
        out.append(last.get(user) == replica)
        last[user] = replica
    return out


@exercise(
    "15.3",
    title="Round-robin: which turns land where their history is?",
    assesses="explaining why routing decides hits in a fleet, by writing the rule that says which "
    "requests reach the replica holding their conversation",
    minutes=10,
    answer_type="function",
    points=2,
    difficulty="core",
    prerequisites=["15.1"],
    hints=[
        "Round-robin sends request i (counting from 0, in arrival order) to replica i % replicas, "
        "whoever sent it.",
        "Remember, per user, the replica of its previous request; a user's first request has no history "
        "anywhere (False).",
    ],
    cases=_orders,
)
def lands_with_history(function: Any, cases: list[tuple[list[int], int]]) -> str:
    for users, replicas in cases:
        got = call_for_list(function, "a list of True/False, one per request", list(users), replicas)
        want = _lands_with_history(users, replicas)
        if len(got) != len(want) or not all(type(g) is bool for g in got):
            raise NotYet(f"Return one True or False per request: {len(want)} for {users}, got {got!r}.")
        if got != want:
            wrong = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
            raise NotYet(
                f"For users {users} on {replicas} replicas, request {wrong} (user {users[wrong]}) should "
                f"be {want[wrong]}."
            )
    order = [r.user for r in _small_traffic().requests]
    later = [hit for hit, turn in zip(_lands_with_history(order, 2), _turns(order), strict=True) if turn > 0]
    share = sum(later) / len(later)
    return (
        f"On the notebook's 50-user fleet with 2 replicas, {share:.1%} of the later turns reach the replica "
        "that served the user's previous turn (the figure in 'Replicas and routing'); the others find only "
        "the system prompt (or an older turn) there. A sticky user hash sends every later turn home."
    )


def _turns(users: list[int]) -> list[int]:
    seen: dict[int, int] = {}
    out = []
    for user in users:
        out.append(seen.get(user, 0))
        seen[user] = out[-1] + 1
    return out


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
