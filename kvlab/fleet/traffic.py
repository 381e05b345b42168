"""Lesson 002's chat traffic: who sends what, in which order, and the prompt each request sends.

The traffic is many users holding multi-turn chats behind one shared system
prompt. Turn n of a user sends ``system + history + message`` and gets an answer
back; the message and the answer then join that user's history, so turn n + 1
starts with everything turn n sent and received. Every random number comes from
one ``random.Random(seed)`` in the lesson's order (system prompt, the shuffled
arrival order, then per request: message length, message, answer length,
answer), so every figure matches the lesson's program. The content is drawn once
and shared by every scenario with the same users, turns, seed and system prompt.

The draws are taken in bulk from numpy's Mersenne Twister started in Python's
exact state (``_TwisterWords``); a self-check on a small case falls back to plain
``random.Random`` calls should the two ever differ.

Where the timestamp goes (``FleetConfig.header``) decides each prompt's layout:
``prompts_and_answers`` builds the token lists, ``prompt_lengths`` only their
lengths. ``ChatTraffic.encoded`` holds every token once as fixed-width bytes,
the form ``kvlab.fleet.keys`` chains read.
"""

from __future__ import annotations

import itertools
import random
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np

from kvlab.errors import (
    LIMITS,
    MAX_TOKEN_ID,
    InvalidArgumentError,
    brief,
    check_choice,
    check_int,
    check_size,
)

VOCAB = 50_000
MESSAGE_TOKENS = (20, 200)  # inclusive range of a user message's length
ANSWER_TOKENS = (50, 400)  # inclusive range of an answer's length
TOKEN_BYTES = 4  # chains read tokens as native 32-bit ints: a fixed width, so equal bytes = equal tokens


def encode_tokens(tokens: Sequence[int]) -> bytes:
    """Tokens (ids 0..MAX_TOKEN_ID) as the bytes chains read: ``TOKEN_BYTES`` per token, native order."""
    try:
        data = array("i", tokens)
    except Exception:  # not ints, out of range, or an iterable that raises
        raise InvalidArgumentError(
            f"tokens must be a list of integer token ids 0..{MAX_TOKEN_ID}, got {brief(tokens)}"
        ) from None
    if data and min(data) < 0:
        raise InvalidArgumentError(f"tokens must be token ids 0..{MAX_TOKEN_ID}, got {min(data)}")
    return data.tobytes()


HEADER_TOKENS = 2  # the timestamp's two tokens (``timestamp_tokens``)


def max_traffic_tokens(users: int, turns: int, system_tokens: int) -> int:
    """An upper bound on the tokens a traffic sends through a cache: every prompt plus every answer.

    Turn t of a user sends at most ``system + t * (2 + 200 + 400) + 2 + 200`` prompt tokens (the
    longest messages and answers, a timestamp per message) and gets at most 400 back, so a user's
    ``turns`` turns total ``turns * (system + 602) + 602 * turns * (turns - 1) / 2``. Computed from
    the sizes alone, before anything is drawn.
    """
    for name, value in (("users", users), ("turns", turns), ("system_tokens", system_tokens)):
        check_int(name, value, minimum=0)
    per_turn = HEADER_TOKENS + MESSAGE_TOKENS[1] + ANSWER_TOKENS[1]
    return users * (turns * (system_tokens + per_turn) + per_turn * turns * (turns - 1) // 2)


def check_traffic_size(users: object, turns: object, system_tokens: object) -> tuple[int, int, int]:
    """Bound a traffic's sizes: ``LIMITS.users``, ``LIMITS.turns``, ``LIMITS.tokens`` for the system
    prompt, and ``max_traffic_tokens`` at most ``LIMITS.total_tokens`` (134M tokens: a few seconds
    of the lesson's store, about half a minute of the engine model), refused before any draw.
    """
    users = check_size("users", users, "users", minimum=1)
    turns = check_size("turns", turns, "turns", minimum=1)
    system_tokens = check_size("system_tokens", system_tokens, "tokens")
    work = max_traffic_tokens(users, turns, system_tokens)
    if work > LIMITS.total_tokens:
        raise InvalidArgumentError(
            f"{users:,} users x {turns:,} turns with a {system_tokens:,}-token system prompt may send up to "
            f"{work:,} tokens, more than {LIMITS.total_tokens:,} (kvlab's limit LIMITS.total_tokens); "
            "use fewer users, turns or system tokens, or kvlab.errors.raised_limits(total_tokens=...)"
        )
    return users, turns, system_tokens


@dataclass(frozen=True)
class UserTurn:
    """One turn of one user: the request's random content (its user, new message and the answer it gets).

    It holds no prompt: the prompt is the system prompt + the user's history + this message, laid out by
    ``prompts_and_answers``. (Not ``kvlab.server``'s ``ChatTurn``, which is a llama-server turn's counters.)
    """

    clock: int  # arrival position, 0-based
    user: int
    message: tuple[int, ...]
    answer: tuple[int, ...]


@dataclass(frozen=True)
class ChatTraffic:
    """The shared system prompt and every request, in arrival order."""

    users: int
    turns: int
    seed: int
    system: tuple[int, ...]
    requests: tuple[UserTurn, ...]

    @cached_property
    def encoded(self) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The system prompt and each (message, answer) as chain bytes, encoded once for all scenarios."""
        data = encode_tokens(
            list(itertools.chain(self.system, *(t.message + t.answer for t in self.requests)))
        )
        system_end = len(self.system) * TOKEN_BYTES
        turns, pos = [], system_end
        for t in self.requests:
            mid = pos + len(t.message) * TOKEN_BYTES
            end = mid + len(t.answer) * TOKEN_BYTES
            turns.append((data[pos:mid], data[mid:end]))
            pos = end
        return data[:system_end], turns


def chat_traffic(users: int = 200, turns: int = 6, seed: int = 1, system_tokens: int = 1200) -> ChatTraffic:
    """The lesson's traffic: ``users`` x ``turns`` requests in a seeded random order.

    The draws are those of ``random.Random(seed)``: ``system_tokens`` ids in
    [0, 50,000), a shuffle of the arrival order (each user listed ``turns`` times),
    then per request a message length in [20, 200], the message, an answer length
    in [50, 400] and the answer. They are taken in bulk from numpy's Mersenne
    Twister started in Python's exact state, which gives the very same numbers
    (CPython's ``randrange`` takes one 32-bit word per try); a self-check falls
    back to plain ``random.Random`` calls should that ever differ. The sizes are bounded by
    ``check_traffic_size`` before anything is drawn; ``seed`` is a 64-bit integer.
    """
    users, turns, system_tokens = check_traffic_size(users, turns, system_tokens)
    seed = check_seed(seed)
    draw = _draw_traffic_fast if _fast_draws_match() else _draw_traffic_reference
    return draw(users, turns, seed, system_tokens)


def _draw_traffic_reference(users: int, turns: int, seed: int, system_tokens: int) -> ChatTraffic:
    """Plain ``random.Random`` calls in the lesson's order (the definition the fast path must match)."""
    rng = random.Random(seed)
    system = tuple(rng.randrange(VOCAB) for _ in range(system_tokens))
    order = [u for u in range(users) for _ in range(turns)]
    rng.shuffle(order)
    requests = []
    for clock, user in enumerate(order):
        message = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(*MESSAGE_TOKENS)))
        answer = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(*ANSWER_TOKENS)))
        requests.append(UserTurn(clock, user, message, answer))
    return ChatTraffic(users, turns, seed, system, tuple(requests))


def _draw_traffic_fast(users: int, turns: int, seed: int, system_tokens: int) -> ChatTraffic:
    words = _TwisterWords(random.Random(seed))
    system = words.many_below(VOCAB, system_tokens)
    order = [u for u in range(users) for _ in range(turns)]
    for i in reversed(range(1, len(order))):  # random.shuffle's loop
        j = words.below(i + 1)
        order[i], order[j] = order[j], order[i]
    msg_lo, msg_hi = MESSAGE_TOKENS
    ans_lo, ans_hi = ANSWER_TOKENS
    requests = []
    for clock, user in enumerate(order):
        message = words.many_below(VOCAB, msg_lo + words.below(msg_hi - msg_lo + 1))
        answer = words.many_below(VOCAB, ans_lo + words.below(ans_hi - ans_lo + 1))
        requests.append(UserTurn(clock, user, message, answer))
    return ChatTraffic(users, turns, seed, system, tuple(requests))


class _TwisterWords:
    """Python's Mersenne Twister output, 32-bit words drawn in bulk by numpy.

    CPython draws ``randrange(n)`` as ``getrandbits(k)`` with ``k = n.bit_length()``,
    retried while the result is >= n, and ``getrandbits(k)`` for k <= 32 is one
    32-bit word shifted right by ``32 - k``. So a run of draws below ``n`` is the
    accepted words of a vectorised filter.
    """

    def __init__(self, rng: random.Random) -> None:
        _version, internal, _gauss = rng.getstate()
        self._bits = np.random.MT19937()
        self._bits.state = {
            "bit_generator": "MT19937",
            "state": {"key": np.array(internal[:-1], dtype=np.uint32), "pos": internal[-1]},
        }
        self._words = np.empty(0, dtype=np.uint64)
        self._pos = 0

    def _ensure(self, count: int) -> None:
        if self._pos + count > len(self._words):
            fresh = self._bits.random_raw(max(count, 1 << 16))
            self._words = np.concatenate((self._words[self._pos :], fresh))
            self._pos = 0

    def below(self, n: int) -> int:
        shift = 32 - n.bit_length()
        while True:
            self._ensure(1)
            value = int(self._words[self._pos]) >> shift
            self._pos += 1
            if value < n:
                return value

    def many_below(self, n: int, count: int) -> tuple[int, ...]:
        if count == 0:
            return ()
        shift = np.uint64(32 - n.bit_length())
        span = int(count * (1 << n.bit_length()) / n * 1.1) + 32
        while True:
            self._ensure(span)
            values = self._words[self._pos : self._pos + span] >> shift
            accepted = np.flatnonzero(values < n)
            if len(accepted) >= count:
                self._pos += int(accepted[count - 1]) + 1
                return tuple(values[accepted[:count]].tolist())
            span *= 2


@cache
def _fast_draws_match() -> bool:
    """Whether the bulk draws equal ``random.Random``'s on this Python (checked once, on a small case)."""
    args = (7, 3, 2024, 40)
    return _draw_traffic_fast(*args) == _draw_traffic_reference(*args)


def check_seed(seed: object) -> int:
    """A traffic seed: an int that fits 64 bits signed (``random.Random`` takes any, the lesson uses 1)."""
    return check_int("seed", seed, minimum=-(2**63), maximum=2**63 - 1)


def timestamp_tokens(clock: int) -> tuple[int, int]:
    """The lesson's volatile header: two tokens that change at every request, like a clock.

    ``clock`` is a request's arrival position, 0..MAX_TOKEN_ID (both tokens are then token ids).
    """
    clock = check_int("clock", clock, minimum=0, maximum=MAX_TOKEN_ID)
    return (clock % 997, clock // 997)


HEADERS = ("none", "start", "before-message")  # the same as kvlab.fleet.config.HEADERS


def _check_traffic(traffic: object, header: object) -> str:
    if not isinstance(traffic, ChatTraffic):
        raise InvalidArgumentError(f"traffic must come from chat_traffic(), got {type(traffic).__name__}")
    return check_choice("header", header, HEADERS)


def prompts_and_answers(traffic: ChatTraffic, header: str) -> Iterator[tuple[list[int], list[int]]]:
    """The token lists themselves, request by request, with the timestamp where ``header`` puts it."""
    header = _check_traffic(traffic, header)
    return _prompts_and_answers(traffic, header)


def _prompts_and_answers(traffic: ChatTraffic, header: str) -> Iterator[tuple[list[int], list[int]]]:
    histories: dict[int, list[int]] = {}
    for req in traffic.requests:
        history = histories.setdefault(req.user, [])
        stamp = list(timestamp_tokens(req.clock))
        if header == "start":
            prompt = stamp + list(traffic.system) + history + list(req.message)
            history += req.message + req.answer
        elif header == "before-message":
            prompt = list(traffic.system) + history + stamp + list(req.message)
            history += stamp + list(req.message) + list(req.answer)
        else:
            prompt = list(traffic.system) + history + list(req.message)
            history += req.message + req.answer
        yield prompt, list(req.answer)


def prompt_lengths(traffic: ChatTraffic, header: str) -> list[tuple[int, int]]:
    """(prompt tokens, answer tokens) of each request, without building the prompts."""
    header = _check_traffic(traffic, header)
    history: dict[int, int] = {}
    stamp = 2 if header != "none" else 0
    out = []
    for req in traffic.requests:
        before = history.get(req.user, 0)
        prompt = len(traffic.system) + before + stamp + len(req.message)
        kept = stamp if header == "before-message" else 0
        history[req.user] = before + kept + len(req.message) + len(req.answer)
        out.append((prompt, len(req.answer)))
    return out
