"""Exercises of notebook 16, your own server and traffic (the capstone).

16.1 is a prediction (graded for being made before the notebook reveals the server's count; an off
guess is told the likely slip, from the recorded two-tenant chat's sizes); 16.2 is a prediction
checked for being right; the prices and hit rates come from ``kvlab.lessons.capstone``; nothing here
states an answer. The function exercises (16.3, 16.4) are
re-run by the grader on sessions and traffic drawn for each grading run.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from kvlab.exercises.core import NotYet, Prediction, call, exercise, whole
from kvlab.lessons import capstone
from kvlab.traces import read_trace

COST_FACTOR = 0.8  # 16.3: at most this share of append-only's cost
ROUTER_TOLERANCE = (
    0.05  # 16.4: a hit rate this far under routing by cached tokens within LOAD_BOUND still counts
)
LOAD_BOUND = 1.10  # 16.4: the busiest replica's requests over the mean


@functools.lru_cache(maxsize=1)
def _sample_sizes() -> tuple[int, int, int]:
    """(turn 1's prompt tokens, turn 1's reply tokens, turn 2's prompt tokens) of the recorded chat."""
    trace = read_trace(capstone.sample_trace_path())
    first, second = trace.exchanges[0], trace.exchanges[1]
    return len(first.prompt), len(first.output), len(second.prompt)


def _cached_tokens_slip(guess: Any, value: Any) -> str | None:
    """What an off guess of alice's second turn most likely counted instead."""
    prompt1, reply1, prompt2 = _sample_sizes()
    cap = (prompt2 - 1) // 16 * 16
    if guess == cap != value:
        return (
            f"{cap} is turn 2's last-token cap: the most any {prompt2}-token prompt could hit "
            f"(({prompt2} - 1) // 16 whole blocks), not the length it shares with what turn 1 left."
        )
    if guess == prompt1 // 16 * 16 != value:
        return "That counts turn 1's prompt only; its reply (but its last token) was cached too."
    if guess in (prompt2, prompt2 - 1):
        return "Not all of turn 2: its new question was never sent before, and its last token always runs."
    if guess % 16:
        return "vLLM reuses whole 16-token blocks: the count is a multiple of 16."
    return None


@exercise(
    "16.1",
    title="Predict a server's cached tokens, then reveal",
    assesses="predicting vLLM's cached_tokens from a trace: the shared prefix, in whole blocks, at most prompt - 1 "
    "(graded for being made before the reveal)",
    minutes=8,
    answer_type="int",
    points=2,
    difficulty="core",
    prerequisites=["06.1"],
    hints=[
        "The cache holds turn 1's prompt and its reply but the reply's last token; turn 2 starts with all of it.",
        "Any whole number of tokens from 0 to turn 2's prompt length is a prediction; the reveal shows the "
        "server's count beside it.",
    ],
    predicts=Prediction(
        reread="Exercise 16.1's question: what turn 1 left cached, how much of it turn 2 repeats, in whole "
        "16-token blocks",
        unit=" tokens",
        slip=_cached_tokens_slip,
    ),
)
def trace_prediction(answer: int) -> str:
    prompt2 = _sample_sizes()[2]
    if not 0 <= answer <= prompt2:
        raise NotYet(f"{answer} is not a count of turn 2's prompt tokens: it has {prompt2}.")
    return f"Your guess, {answer} tokens, is kept: run the reveal cell below to see the server's count."


@exercise(
    "16.2",
    title="Predict what the naive layout gets from the cache",
    assesses="seeing that a volatile early token leaves only the blocks before it cached, turn after turn",
    minutes=6,
    answer_type="int",
    points=2,
    difficulty="core",
    prerequisites=["09.1"],
    hints=[
        "Only whole blocks before the first token that changes can be found; count those blocks per turn.",
        "The first turn finds nothing (the cache is empty); every later turn finds the same whole blocks before "
        "the timestamp's minutes.",
    ],
)
def naive_cached_tokens(answer: int) -> str:
    session = capstone.agent_session()
    cost = capstone.price_session(session, capstone.naive_layout)
    expected = cost.cached_tokens
    if answer == expected:
        return (
            f"{expected:,} of {cost.prompt_tokens:,} prompt tokens (a hit rate of {cost.hit_rate:.2%}): the "
            "timestamp's minutes change the second block every turn, so only the first block is ever found."
        )
    per_turn = expected // (session.turns - 1)
    if answer == 0:
        raise NotYet("Not quite nothing: the blocks before the first changing token are found every turn.")
    if answer == per_turn * session.turns:
        raise NotYet("Nearly: the first turn finds nothing, the cache is still empty.")
    if answer % 16:
        raise NotYet("vLLM reuses whole 16-token blocks: the answer is a multiple of 16.")
    raise NotYet(f"{answer:,} is not what the naive layout finds in the cache over {session.turns} turns.")


def _session_name(seed: int) -> str:
    """How a failure names a session: the notebook's by its seed, others as the call that draws them."""
    return "this session (seed 16)" if seed == 16 else f"agent_session({seed})"


def _session_cases(rng: random.Random | None) -> list[tuple[int, int]]:
    """(seed, calls) of each session: the notebook's two, and with ``rng`` one fresh one (the grader's, hidden).

    One hidden session, not more: pricing a session takes about a second, and the check's time limit
    (``kvlab.exercises.core.FUNCTION_SECONDS``) covers the whole check.
    """
    return [(16, 48), (7, 48)] + ([(rng.randrange(1000, 10**6), 48)] if rng else [])


@functools.lru_cache(maxsize=8)
def _append_only_cost(seed: int, calls: int) -> capstone.SessionCost:
    return capstone.price_session(capstone.agent_session(seed, calls), capstone.append_only_layout)


@exercise(
    "16.3",
    title="A cheaper layout that keeps what the agent needs",
    assesses="designing an agent's prompt layout and history policy for a prefix cache, priced in dollars",
    minutes=20,
    answer_type="function",
    cases=_session_cases,
    points=4,
    difficulty="stretch",
    prerequisites=["13.3", "16.2"],
    hints=[
        "Start from append-only: a fixed front (system prompt, tools in one order, task), then every call appended.",
        "Append-only keeps every large result forever. Replace old results by a one-line stub, but only every few "
        "turns and all at once, keeping the last 5 verbatim.",
    ],
)
def cheaper_layout(answer: Any, cases: list[tuple[int, int]]) -> str:
    lines = []
    for seed, calls in cases:
        session = capstone.agent_session(seed, calls)

        def layout(s: capstone.AgentSession, turn: int) -> Any:
            messages = call(answer, s, turn)
            if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
                raise NotYet(f"layout(session, {turn}) must return a list of {{'role', 'content'}} dicts.")
            return messages

        kept, why = capstone.information_kept(session, layout)
        if not kept:
            raise NotYet(f"Information lost ({_session_name(seed)}): {why}.")
        cost = capstone.price_session(session, layout)
        baseline = _append_only_cost(seed, calls)
        limit = COST_FACTOR * baseline.dollars
        if cost.dollars >= limit:
            raise NotYet(
                f"{_session_name(seed)}: ${cost.dollars:.4f} (hit rate {cost.hit_rate:.2f}); it must cost below "
                f"${limit:.4f}, {COST_FACTOR:.0%} of append-only's ${baseline.dollars:.4f}."
            )
        lines.append(
            f"{_session_name(seed)}: ${cost.dollars:.4f} against append-only's ${baseline.dollars:.4f}"
        )
    return "Everything kept, and cheaper: " + "; ".join(lines) + "."


@dataclass(frozen=True)
class Traffic:
    """One traffic 16.4 routes: ``route_fleet``'s options, and how feedback names it."""

    seed: int
    users: int
    turns: int = 4
    replicas: int = 4
    system_tokens: int = 600
    capacity_blocks: int = 2400

    def options(self) -> dict[str, int]:
        return asdict(self)

    def call(self) -> str:
        """The call that replays it, so a student can rerun the traffic that failed."""
        return "route_fleet(router, " + ", ".join(f"{k}={v}" for k, v in self.options().items()) + ")"

    @property
    def splits_unevenly(self) -> bool:
        """True when no assignment of whole users to replicas stays within the load bound.

        Every user sends ``turns`` requests, so a router that keeps each user on one replica gives
        some replica ``ceil(users / replicas)`` users: that over the mean is its imbalance at best.
        """
        return math.ceil(self.users / self.replicas) * self.replicas / self.users > LOAD_BOUND


NOTEBOOK_TRAFFIC = Traffic(seed=1, users=48)
UNEVEN_TRAFFIC = Traffic(seed=2, users=13, turns=8, replicas=3)


def _traffic_cases(rng: random.Random | None) -> list[Traffic]:
    """The notebook's two traffics, and with ``rng`` two fresh ones (the grader's, hidden).

    The lesson's 48 users split evenly over 4 replicas, so keeping each user on one replica
    (``request.user % 4``) is perfectly balanced there. The others have 3 or 5 replicas and user
    counts that no whole-user split keeps within ``LOAD_BOUND`` (``Traffic.splits_unevenly``): a
    router that ignores what is cached either breaks the bound or loses the users' histories. The
    last has a longer system prompt and a smaller cache, so histories compete for room.
    """
    cases = [NOTEBOOK_TRAFFIC, UNEVEN_TRAFFIC]
    if rng is None:
        return cases
    return cases + [
        Traffic(rng.randrange(3, 10**6), users=rng.choice((7, 10, 16)), turns=8, replicas=3),
        Traffic(
            rng.randrange(3, 10**6),
            users=rng.choice((11, 16, 21, 26)),
            turns=6,
            replicas=5,
            system_tokens=1200,
            capacity_blocks=2000,
        ),
    ]


@functools.lru_cache(maxsize=16)
def _reference(traffic: Traffic) -> capstone.RoutingResult:
    """What routing by cached tokens within ``LOAD_BOUND`` reaches on this traffic (the hit-rate bar)."""
    return capstone.route_fleet(
        functools.partial(capstone.longest_prefix, load_bound=LOAD_BOUND),
        name="prefix-aware",
        **traffic.options(),
    )


@functools.lru_cache(maxsize=16)
def _by_user(traffic: Traffic) -> capstone.RoutingResult:
    return capstone.route_fleet(capstone.user_hash, **traffic.options())


def _routed(router: Any, traffic: Traffic) -> capstone.RoutingResult:
    """``route_fleet`` with the student's router; what the router did wrong comes back as NotYet."""
    try:
        return capstone.route_fleet(router, name="yours", **traffic.options())
    except Exception as exc:
        if exc.__cause__ is not None:  # what the student's router did (call() made it NotYet or not done)
            raise exc.__cause__ from None
        raise


def _load_advice(traffic: Traffic) -> str:
    """Why a router broke the bound on this traffic, when the traffic itself says why."""
    if not traffic.splits_unevenly:
        return ""
    per = math.ceil(traffic.users / traffic.replicas)
    return (
        f" {traffic.users} users do not split evenly over {traffic.replicas} replicas: keeping every user on one "
        f"replica puts {per} users ({per * traffic.turns} requests) on one of them. Move a user when its replica "
        "is full, to the replica with the most of its prompt cached."
    )


@exercise(
    "16.4",
    title="Write a prefix-aware router",
    assesses="routing for cache hits within a load bound, as cache-aware routers do",
    minutes=20,
    answer_type="function",
    cases=_traffic_cases,
    points=3,
    difficulty="stretch",
    prerequisites=["16.2"],
    hints=[
        "Each replica view says how much of the prompt it has cached (replica.cached_tokens) and its load "
        "(replica.requests).",
        "Prefer the most cached tokens, but only among replicas that would stay within 1.10 times the mean load "
        "(count this request too).",
    ],
)
def prefix_router(answer: Any, cases: list[Traffic]) -> str:
    lines = []
    for traffic in cases:

        def router(request: Any, replicas: Any) -> int:
            choice = call(answer, request, replicas)
            if not whole(choice):
                raise NotYet(f"router must return a replica index (an int), got {choice!r}.")
            return int(choice)

        mine = _routed(router, traffic)
        name = f"Traffic {traffic.call()}"
        if mine.imbalance > LOAD_BOUND + 1e-9:
            raise NotYet(
                f"{name}: the busiest replica took {mine.imbalance:.2f} times the mean load "
                f"(requests {list(mine.requests)}); keep it at most {LOAD_BOUND:.2f}.{_load_advice(traffic)}"
            )
        bar = _reference(traffic)
        if mine.hit_rate < bar.hit_rate - ROUTER_TOLERANCE:
            by_user = _by_user(traffic)
            raise NotYet(
                f"{name}: hit rate {mine.hit_rate:.3f}, more than {ROUTER_TOLERANCE} below {bar.hit_rate:.3f}, what "
                f"routing by cached tokens reaches within the same load bound (user-hash: {by_user.hit_rate:.3f} "
                f"at {by_user.imbalance:.2f}x the mean load): send a request where its prefix is cached whenever "
                "the load allows."
            )
        lines.append(
            f"hit rate {mine.hit_rate:.3f} (the bar: {bar.hit_rate - ROUTER_TOLERANCE:.3f}), load {mine.imbalance:.3f}x"
        )
    return "Good routing: " + "; ".join(lines) + "."
