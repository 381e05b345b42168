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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvlab.core.chat_format import Message, Tokenizer, render, reply_tokens
from kvlab.errors import InvalidArgumentError, check_int, check_tokens
from kvlab.server.slots import SlotServer


@dataclass(frozen=True)
class TurnCounters:
    """One response's counters: ``usage.prompt_tokens``, ``timings.cache_n``, ``timings.prompt_n``."""

    prompt_tokens: int
    cache_n: int
    prompt_n: int


def predicted_cache_n(prompt_tokens: Sequence[int], max_tokens: int) -> list[int]:
    """The append-only rule: turn 1 finds nothing, later turns find previous prompt + max_tokens - 1."""
    sizes = check_tokens("prompt_tokens", prompt_tokens)
    check_int("max_tokens", max_tokens, minimum=1)
    if any(p < 1 for p in sizes):
        raise InvalidArgumentError("prompt sizes must be positive")
    return [0] + [p + max_tokens - 1 for p in sizes[:-1]]


def tokens_processed(turns: Sequence[TurnCounters]) -> int:
    """Prompt tokens the server computed over a run: the sum of ``prompt_n``."""
    return sum(t.prompt_n for t in turns)


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
    if (
        isinstance(user_messages, str)
        or not all(isinstance(m, str) for m in user_messages)
        or not user_messages
    ):
        raise InvalidArgumentError("user_messages must be a non-empty list of strings")
    if not isinstance(system, str):
        raise InvalidArgumentError("system must be a string")
    if not isinstance(server, SlotServer) or not isinstance(tokenizer, Tokenizer):
        raise InvalidArgumentError("server must be a SlotServer and tokenizer a kvlab Tokenizer")
    check_int("max_tokens", max_tokens, minimum=1)
    if clock is not None and not callable(clock):
        raise InvalidArgumentError("clock must be a callable turn -> text, or None")
    history: list[Message] = []
    out: list[ChatTurn] = []
    prev = 0
    for i, text in enumerate(user_messages):
        head = clock(i) if clock is not None else ""
        msgs = [Message("system", head + system), *history, Message("user", text)]
        prompt = render(msgs, tokenizer)
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
