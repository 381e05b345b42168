"""A chat client replaying a conversation through a llama-server slot model (lesson example 10).

A chat client sends the whole history every turn: the system prompt, every
earlier user message and reply, and the new message, rendered with the chat
template. On one slot, turn ``k``'s prompt starts with everything turn ``k - 1``
left in the slot -- its prompt and all of its reply but the last sampled token --
so the *append-only rule* holds: ``cache_n`` of turn ``k`` is turn ``k - 1``'s
prompt + ``max_tokens`` - 1, and turn 1 finds nothing. Anything that changes
early in the prompt (a clock in the system prompt) stops the match there.

``replay_chat`` plays such a client against ``kvlab.server.slots.SlotServer`` with
``kvlab.core.chat_format``'s tokenizer and template, as the lesson's client did
against a real llama-server (whose response fields are ``usage.prompt_tokens``,
``timings.cache_n`` and ``timings.prompt_n``, the names kept here).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvlab.core.chat_format import Message, Tokenizer, render, reply_tokens
from kvlab.errors import LIMITS, InvalidArgumentError, brief, check_size
from kvlab.server.inputs import call_user, read_tokens
from kvlab.server.slots import SlotServer


@dataclass(frozen=True)
class TurnCounters:
    """One response's counters: ``usage.prompt_tokens``, ``timings.cache_n``, ``timings.prompt_n``."""

    prompt_tokens: int
    cache_n: int
    prompt_n: int

    def __post_init__(self) -> None:
        """Each counter is a whole number of tokens, 0..``LIMITS.tokens``."""
        for name in ("prompt_tokens", "cache_n", "prompt_n"):
            object.__setattr__(self, name, check_size(name, getattr(self, name), "tokens"))


def predicted_cache_n(prompt_tokens: Sequence[int], max_tokens: int) -> list[int]:
    """The append-only rule: turn 1 finds nothing, later turns find previous prompt + max_tokens - 1.

    At most ``LIMITS.turns`` prompt sizes, each 1..``LIMITS.tokens``.
    """
    sizes = read_tokens("prompt_tokens", prompt_tokens, limit=LIMITS.turns, in_range=False)
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    for i, p in enumerate(sizes):
        if p < 1:
            raise InvalidArgumentError(f"prompt sizes must be positive, got prompt_tokens[{i}] = {brief(p)}")
        check_size(f"prompt_tokens[{i}]", p, "tokens", minimum=1)
    return [0] + [p + max_tokens - 1 for p in sizes[:-1]]


def tokens_processed(turns: Sequence[TurnCounters]) -> int:
    """Prompt tokens the server computed over a run (at most ``LIMITS.turns`` turns): the sum of ``prompt_n``."""
    if isinstance(turns, (str, bytes)) or not hasattr(turns, "__iter__"):
        raise InvalidArgumentError(f"turns must be a list of TurnCounters, got {type(turns).__name__}")
    try:
        items = list(itertools.islice(turns, LIMITS.turns + 1))
    except Exception as exc:  # a 0-d array, an iterator that raises
        raise InvalidArgumentError(
            f"turns must be a list of TurnCounters, got {brief(turns)}: {exc}"
        ) from None
    if len(items) > LIMITS.turns:
        raise InvalidArgumentError(f"turns has more than {LIMITS.turns:,} items (LIMITS.turns)")
    for i, t in enumerate(items):
        if not isinstance(t, (TurnCounters, ChatTurn)):
            raise InvalidArgumentError(
                f"turns[{i}] must be a TurnCounters or a ChatTurn, got {type(t).__name__}"
            )
    return sum(t.prompt_n for t in items)


@dataclass(frozen=True)
class ChatTurn:
    turn: int  # 1-based
    prompt_tokens: int
    cache_n: int
    prompt_n: int
    predicted_cache_n: int  # previous prompt + max_tokens - 1 (0 on turn 1)
    reply: str

    @property
    def counters(self) -> TurnCounters:
        return TurnCounters(self.prompt_tokens, self.cache_n, self.prompt_n)


def replay_chat(
    user_messages: Sequence[str],
    *,
    system: str,
    server: SlotServer,
    tokenizer: Tokenizer,
    max_tokens: int = 8,
    clock: Callable[[int], str] | None = None,
) -> list[ChatTurn]:
    """Run a chat through ``server`` turn by turn, as the lesson's client did (``max_tokens`` 8 there).

    Each turn sends the whole history plus a new user message, rendered with the
    ChatML template, and appends the reply (the text of the sampled tokens) to the
    history. ``clock(turn)`` (0-based) is put at the start of the system prompt,
    like the lesson's "Time: 10:00:00." run.
    """
    messages = _messages(user_messages)
    if not isinstance(system, str):
        raise InvalidArgumentError(f"system must be a string, got {type(system).__name__}")
    if not isinstance(server, SlotServer) or not isinstance(tokenizer, Tokenizer):
        raise InvalidArgumentError("server must be a SlotServer and tokenizer a kvlab Tokenizer")
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    if clock is not None and not callable(clock):
        raise InvalidArgumentError("clock must be a callable turn -> text, or None")
    with server.all_or_nothing():  # a turn refused halfway leaves the server as before the chat
        return _replay(messages, system, server, tokenizer, max_tokens, clock)


def _messages(user_messages: object) -> list[str]:
    """The user messages as a list of plain strings, at most ``LIMITS.turns`` of them."""
    if isinstance(user_messages, (str, bytes)) or not hasattr(user_messages, "__iter__"):
        raise InvalidArgumentError("user_messages must be a non-empty list of strings")
    try:
        items = list(itertools.islice(iter(user_messages), LIMITS.turns + 1))  # type: ignore[call-overload]
    except Exception as exc:
        raise InvalidArgumentError(f"user_messages could not be read: {type(exc).__name__}") from exc
    if len(items) > LIMITS.turns:
        raise InvalidArgumentError(f"user_messages has more than {LIMITS.turns:,} messages (LIMITS.turns)")
    if not items or not all(isinstance(m, str) for m in items):
        raise InvalidArgumentError("user_messages must be a non-empty list of strings")
    return [str.__str__(m) for m in items]


def _replay(
    user_messages: list[str],
    system: str,
    server: SlotServer,
    tokenizer: Tokenizer,
    max_tokens: int,
    clock: Callable[[int], str] | None,
) -> list[ChatTurn]:
    history: list[Message] = []
    out: list[ChatTurn] = []
    prev = total = 0
    for i, text in enumerate(user_messages):
        head = call_user(f"clock({i})", clock, i) if clock is not None else ""
        if not isinstance(head, str):
            raise InvalidArgumentError(f"clock({i}) must return a string, got {brief(head)}")
        msgs = [Message("system", head + system), *history, Message("user", text)]
        prompt = render(msgs, tokenizer)
        if len(prompt) >= server.n_ctx:
            raise InvalidArgumentError(
                f"turn {i + 1}'s prompt has {len(prompt)} tokens but a slot holds {server.n_ctx}: "
                "shorten the chat or raise n_ctx; the server is left as it was before the chat"
            )
        total += len(prompt)
        if total > LIMITS.total_tokens:
            raise InvalidArgumentError(
                f"the chat's prompts add up to more than LIMITS.total_tokens ({LIMITS.total_tokens:,}) by turn {i + 1}"
            )
        gen = reply_tokens(tokenizer, prompt.tokens, min(max_tokens, server.n_ctx - len(prompt)))
        rec = server.complete(prompt.tokens, max_tokens=max_tokens, generated=gen)
        reply = tokenizer.decode(gen)
        out.append(
            ChatTurn(
                i + 1, rec.prompt_tokens, rec.cache_n, rec.prompt_n, prev + max_tokens - 1 if i else 0, reply
            )
        )
        prev = rec.prompt_tokens
        history += [Message("user", text), Message("assistant", reply)]
    return out
