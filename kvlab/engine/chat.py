"""An agent-like conversation on the tiny engine, turn by turn (lesson example 10, for real).

Each turn renders the whole history plus a new user message with the ChatML
template (``kvlab.core.chat_format``), sends it to the engine, and appends the
reply's text to the history, the way the lesson's client did against
llama-server. Per turn it reports what the server's response would:
``prompt_tokens``, ``cache_n`` (prompt tokens reused), ``prompt_n`` (prompt
tokens computed) and the measured time to first token.

The conversation is the lesson's (``kvlab.lessons.ex10.EXAMPLE_SYSTEM`` and
``EXAMPLE_MESSAGES``, cycled with a pass number after the fourth turn);
``system_tokens`` replaces the system prompt by one of exactly that many tokens;
``clock`` puts the lesson's "Time: 10:0M:00. " at its start, one minute later each turn.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvlab.core.chat_format import REPLY_WORDS, Message, render
from kvlab.core.workloads import JavaRandom
from kvlab.engine.engine import Engine
from kvlab.errors import InvalidArgumentError, check_bool, check_size
from kvlab.lessons.ex10 import EXAMPLE_MESSAGES, EXAMPLE_SYSTEM, clock_at_ten


@dataclass(frozen=True)
class ChatTurnResult:
    """One turn's counters and reply, as ``--json`` prints them."""

    turn: int
    prompt_tokens: int
    cache_n: int
    prompt_n: int
    ttft_ms: float
    text: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def system_prompt(num_tokens: int) -> str:
    """A system prompt of exactly ``num_tokens`` tokens (seeded words, each one token); 0 gives the lesson's.

    At most ``LIMITS.tokens`` tokens, one request's worth.
    """
    num_tokens = check_size("system_tokens", num_tokens, "tokens")
    if num_tokens == 0:
        return EXAMPLE_SYSTEM
    rnd = JavaRandom(num_tokens)
    return "".join(" " + REPLY_WORDS[rnd.next_int(len(REPLY_WORDS))] for _ in range(num_tokens))


def user_message(turn: int) -> str:
    """The lesson's four messages, then the same again with a pass number so every turn differs."""
    turn = check_size("turn", turn, "turns")
    base = EXAMPLE_MESSAGES[turn % len(EXAMPLE_MESSAGES)]
    cycle = turn // len(EXAMPLE_MESSAGES)
    return base if cycle == 0 else f"{base} Pass {cycle + 1}."


def run_chat(
    engine: Engine,
    *,
    turns: int = 4,
    max_tokens: int = 8,
    system_tokens: int = 0,
    clock: bool = False,
) -> list[ChatTurnResult]:
    """Run ``turns`` turns on ``engine`` and return one result per turn.

    ``turns`` is at most ``LIMITS.turns``, ``max_tokens`` and ``system_tokens`` at most
    ``LIMITS.tokens``; the engine's ``max_model_len`` bounds them much more tightly in practice.
    """
    if not isinstance(engine, Engine):
        raise InvalidArgumentError(f"engine must be a kvlab.engine.Engine, got {type(engine).__name__}")
    turns = check_size("turns", turns, "turns", minimum=1)
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    check_bool("clock", clock)
    system = system_prompt(system_tokens)
    history: list[Message] = []
    out: list[ChatTurnResult] = []
    for i in range(turns):
        head = clock_at_ten(i) if clock else ""
        text = user_message(i)
        prompt = render([Message("system", head + system), *history, Message("user", text)], engine.tokenizer)
        result = engine.generate(list(prompt.tokens), max_tokens=max_tokens)
        reply = engine.decode_text(result.output_tokens)
        out.append(
            ChatTurnResult(
                i + 1, result.prompt_tokens, result.cache_n, result.prompt_n, result.ttft_ms, reply
            )
        )
        history += [Message("user", text), Message("assistant", reply)]
    return out


def context_needed(turns: int, max_tokens: int, system_tokens: int) -> int:
    """A safe upper bound on the longest prompt + reply of a run, to size the engine."""
    turns = check_size("turns", turns, "turns", minimum=1)
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    system_tokens = check_size("system_tokens", system_tokens, "tokens")
    per_turn = 40 + max_tokens  # a user message, its template tokens and the reply
    return len(EXAMPLE_SYSTEM) + system_tokens + 16 + turns * per_turn + max_tokens
