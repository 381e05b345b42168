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

One request's time to first token on a shared machine says little: another
process can take the core for a few milliseconds, and a prefill longer than
the engine's warm-up prompt (``WARM_UP_TOKENS``) can still pay one-time costs
(torch prepares its matrix kernels for the new shapes, the allocator grows).
``repeats`` > 1 therefore plays the same conversation on ``repeats - 1`` more
engines built like the given one (``Engine.twin``: same model, pool size and
reuse rule, each starting empty), plus ``warmup`` untimed ones that go
first: every turn is served ``repeats`` times from the same cache state, and
its ``ttft`` is a ``kvlab.core.timing.Timing`` of those samples (``ttft_ms``
is their median). The engines run in staggered rounds (in round r, engine e
plays turn r - e), so the samples of different turns are taken side by side
and a burst of load on the machine falls on several turns alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvlab.core.chat_format import REPLY_WORDS, Message, render
from kvlab.core.timing import Timing
from kvlab.core.workloads import JavaRandom
from kvlab.engine.engine import Engine, GenerationResult
from kvlab.errors import InvalidArgumentError, check_bool, check_int, check_size
from kvlab.lessons.ex10 import EXAMPLE_MESSAGES, EXAMPLE_SYSTEM, clock_at_ten

MAX_REPEATS = 51
"""Most engines one ``run_chat`` plays the conversation on (``repeats`` + ``warmup``); each holds a model."""


@dataclass(frozen=True)
class ChatTurnResult:
    """One turn's counters and reply, as ``--json`` prints them, and the timing behind ``ttft_ms``.

    ``ttft.wall_ms`` are the engines' measured times to first token;
    ``ttft.cpu_ms`` is this process's CPU time over each whole request (the
    same span when ``max_tokens`` is 1).
    """

    turn: int
    prompt_tokens: int
    cache_n: int
    prompt_n: int
    ttft_ms: float
    text: str
    ttft: Timing | None = field(default=None, compare=False)

    def as_dict(self) -> dict[str, object]:
        return {
            "turn": self.turn,
            "prompt_tokens": self.prompt_tokens,
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "ttft_ms": self.ttft_ms,
            "text": self.text,
        }


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
    repeats: int = 1,
    warmup: int = 0,
) -> list[ChatTurnResult]:
    """Run ``turns`` turns on ``engine`` and return one result per turn.

    ``turns`` is at most ``LIMITS.turns``, ``max_tokens`` and ``system_tokens`` at most
    ``LIMITS.tokens``; the engine's ``max_model_len`` bounds them much more tightly in practice.
    ``repeats`` (each turn's TTFT samples) and ``warmup`` (untimed engines) together are at most
    ``MAX_REPEATS``; with either above its default the engine must not have served a request yet,
    so that its twins start from the same state.
    """
    if not isinstance(engine, Engine):
        raise InvalidArgumentError(f"engine must be a kvlab.engine.Engine, got {type(engine).__name__}")
    turns = check_size("turns", turns, "turns", minimum=1)
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    check_bool("clock", clock)
    repeats = check_int("repeats", repeats, minimum=1, maximum=MAX_REPEATS)
    warmup = check_int("warmup", warmup, minimum=0, maximum=MAX_REPEATS - repeats)
    system = system_prompt(system_tokens)
    if (repeats > 1 or warmup) and not _served_nothing(engine):
        raise InvalidArgumentError(
            "repeats or warmup need an engine that has served no request yet: its twins start empty"
        )
    engines = [engine.twin() for _ in range(warmup)] + [engine] + [engine.twin() for _ in range(repeats - 1)]
    prompts: list[list[int]] = []
    texts: list[str] = []
    history: list[Message] = []
    samples: list[list[tuple[GenerationResult, float]]] = [[] for _ in range(turns)]
    # staggered rounds: in round r, engine e plays turn r - e, so every round mixes turns and a burst of
    # load on the machine falls on several turns alike instead of on all samples of one turn
    for r in range(turns + len(engines) - 1):
        for e, twin in enumerate(engines):
            k = r - e
            if not 0 <= k < turns:
                continue
            if k == len(prompts):  # engine 0 is first to play turn k: history holds turns 0 .. k-1
                head = clock_at_ten(k) if clock else ""
                texts.append(user_message(k))
                msgs = [Message("system", head + system), *history, Message("user", texts[k])]
                prompts.append(list(render(msgs, engine.tokenizer).tokens))
            sample = _timed_request(twin, prompts[k], max_tokens)
            if e == 0:
                reply = engine.decode_text(sample[0].output_tokens)
                history += [Message("user", texts[k]), Message("assistant", reply)]
            if e >= warmup:
                samples[k].append(sample)
    out: list[ChatTurnResult] = []
    for k, turn in enumerate(samples):
        result = turn[0][0]  # the given engine's own request
        if any((r.cache_n, r.output_tokens) != (result.cache_n, result.output_tokens) for r, _ in turn):
            raise AssertionError("engines built alike served the same turn differently")  # pragma: no cover
        ttft = Timing(tuple(r.ttft_ms for r, _ in turn), tuple(cpu for _, cpu in turn))
        reply = engine.decode_text(result.output_tokens)
        out.append(
            ChatTurnResult(
                k + 1, result.prompt_tokens, result.cache_n, result.prompt_n, ttft.median_ms, reply, ttft
            )
        )
    return out


def _timed_request(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[GenerationResult, float]:
    """The engine's result (which holds its measured TTFT) and this process's CPU ms over the request."""
    cpu0 = time.process_time()
    result = engine.generate(prompt, max_tokens=max_tokens)
    return result, (time.process_time() - cpu0) * 1e3


def _served_nothing(engine: Engine) -> bool:
    if engine.prefix_cache is not None:
        return not engine.prefix_cache.requests and not engine.prefix_cache.cached_blocks()
    return not engine.slot_tokens


def context_needed(turns: int, max_tokens: int, system_tokens: int) -> int:
    """A safe upper bound on the longest prompt + reply of a run, to size the engine."""
    turns = check_size("turns", turns, "turns", minimum=1)
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    system_tokens = check_size("system_tokens", system_tokens, "tokens")
    per_turn = 40 + max_tokens  # a user message, its template tokens and the reply
    return len(EXAMPLE_SYSTEM) + system_tokens + 16 + turns * per_turn + max_tokens
