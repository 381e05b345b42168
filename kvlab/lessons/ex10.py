"""Lesson example 10: llama-server's ``cache_n`` across the turns of a chat.

The lesson sent four turns of one conversation to llama-server (a tiny
qwen2-vocab model, ``-np 1 --cache-ram 0``, ``max_tokens`` 8) twice: append-only,
then with a clock line at the start of the system prompt. Its recorded counters
are here next to kvlab's replay of the same two runs (``example_10``), which
uses ``kvlab.server.slots.SlotServer`` and ``kvlab.server.conversation.replay_chat``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.chat_format import Tokenizer
from kvlab.errors import LIMITS, InvalidArgumentError, check_size
from kvlab.server.conversation import ChatTurn, TurnCounters, predicted_cache_n, replay_chat, tokens_processed
from kvlab.server.slots import SlotServer

# the lesson's recorded values (llama-server, tiny qwen2-vocab model, -np 1 --cache-ram 0, max_tokens 8)
LESSON_MAX_TOKENS = 8
LESSON_APPEND_ONLY = (
    TurnCounters(34, 0, 34),
    TurnCounters(56, 41, 15),
    TurnCounters(78, 63, 15),
    TurnCounters(100, 85, 15),
)
LESSON_CLOCK = (
    TurnCounters(46, 3, 43),
    TurnCounters(68, 10, 58),
    TurnCounters(90, 10, 80),
    TurnCounters(112, 10, 102),
)
# the same experiment on another build (shared/notes/llama-server.md): cache_n = previous + 8 - 1 again
NOTES_APPEND_ONLY = (
    TurnCounters(76, 0, 76),
    TurnCounters(134, 83, 51),
    TurnCounters(184, 141, 43),
    TurnCounters(248, 191, 57),
)

EXAMPLE_SYSTEM = "You are a coding agent. Read files with the tools and answer briefly."
EXAMPLE_MESSAGES = (
    "List the files in src.",
    "Open Main.java and summarize it.",
    "Which function parses the config?",
    "Run the tests and report failures.",
)


def clock_at_ten(turn: int) -> str:
    """The lesson's clock line: "Time: 10:00:00. ", one minute later each turn."""
    turn = check_size("turn", turn, "turns")
    return f"Time: 10:{turn:02d}:00. "


def arithmetic_report(
    append_only: Sequence[TurnCounters] = LESSON_APPEND_ONLY,
    clock: Sequence[TurnCounters] = LESSON_CLOCK,
    max_tokens: int = LESSON_MAX_TOKENS,
) -> list[str]:
    """The lesson's check of recorded counters against the rule, one line per turn plus the totals."""
    append_only, clock = _counters("append_only", append_only), _counters("clock", clock)
    sizes = [t.prompt_tokens for t in append_only]
    predicted = predicted_cache_n(sizes, max_tokens)
    lines = []
    for i, t in enumerate(append_only):
        added = t.prompt_tokens - (sizes[i - 1] if i else 0)
        lines.append(
            f"turn {i + 1}: +{added:2d} tokens, predicted cache_n {predicted[i]:3d}, "
            f"observed {t.cache_n:3d}, processed {t.prompt_tokens - t.cache_n:3d}"
        )
    lines.append(
        f"tokens processed over {len(append_only)} turns: append-only {tokens_processed(append_only)}, "
        f"timestamp in system prompt {tokens_processed(clock)}"
    )
    return lines


def _counters(name: str, turns: object) -> list[TurnCounters]:
    """A run's recorded counters: a non-empty list of TurnCounters (at most LIMITS.turns)."""
    if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence):
        raise InvalidArgumentError(f"{name} must be a list of TurnCounters, got {type(turns).__name__}")
    items = list(turns[: LIMITS.turns + 1])
    if not items:
        raise InvalidArgumentError("give at least one turn for each run")
    if len(items) > LIMITS.turns:
        raise InvalidArgumentError(f"{name} has more than {LIMITS.turns:,} turns (LIMITS.turns)")
    for i, t in enumerate(items):
        if not isinstance(t, TurnCounters):
            raise InvalidArgumentError(f"{name}[{i}] must be a TurnCounters, got {type(t).__name__}")
    return items


@dataclass(frozen=True)
class Example10:
    """Example 10 side by side: the lesson's recorded counters and kvlab's own replay."""

    lesson_append_only: tuple[TurnCounters, ...]
    lesson_clock: tuple[TurnCounters, ...]
    kvlab_append_only: tuple[ChatTurn, ...]
    kvlab_clock: tuple[ChatTurn, ...]
    max_tokens: int

    def rows(self) -> list[dict[str, object]]:
        """One row per (run, turn) with both sources, for a table or a plot."""
        out: list[dict[str, object]] = []
        for run, lesson, ours in (
            ("append-only", self.lesson_append_only, self.kvlab_append_only),
            ("clock in system prompt", self.lesson_clock, self.kvlab_clock),
        ):
            for i, (a, b) in enumerate(zip(lesson, ours, strict=False)):
                out.append(
                    {
                        "run": run,
                        "turn": i + 1,
                        "lesson_prompt_tokens": a.prompt_tokens,
                        "lesson_cache_n": a.cache_n,
                        "lesson_prompt_n": a.prompt_n,
                        "kvlab_prompt_tokens": b.prompt_tokens,
                        "kvlab_cache_n": b.cache_n,
                        "kvlab_prompt_n": b.prompt_n,
                    }
                )
        return out


def example_10(max_tokens: int = LESSON_MAX_TOKENS) -> Example10:
    """Replay the lesson's two runs on one slot (``-np 1 --cache-ram 0``), append-only first.

    The clock run starts on the slot the append-only run left behind, so its
    first turn matches only ``<|im_start|>system\\n`` (3 tokens), as in the lesson.
    """
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    server = SlotServer(1, cache_ram_mib=0)
    tok = Tokenizer()
    plain = replay_chat(
        EXAMPLE_MESSAGES, system=EXAMPLE_SYSTEM, server=server, tokenizer=tok, max_tokens=max_tokens
    )
    timed = replay_chat(
        EXAMPLE_MESSAGES,
        system=EXAMPLE_SYSTEM,
        server=server,
        tokenizer=tok,
        max_tokens=max_tokens,
        clock=clock_at_ten,
    )
    return Example10(LESSON_APPEND_ONLY, LESSON_CLOCK, tuple(plain), tuple(timed), max_tokens)


def _ids(start: int, n: int) -> tuple[int, ...]:
    """Token ids inside the real tiny model's 512-token vocabulary, deterministic."""
    return tuple(3 + (start + 7 * i) % 509 for i in range(n))


def on_real_server() -> list[str]:
    """Three runs on a real llama-server next to kvlab's prediction, or one line saying how to get one.

    An append-only chat of token ids (``cache_n`` = previous prompt + 8 - 1), a prompt longer than
    the slot that is refused yet still moves the next request to the other slot, and ``n_predict:
    0``, which samples one token anyway (``kvlab.lessons.real_llama``).
    """
    from kvlab.lessons.real_llama import Request, available, missing_line, run_slots, side_by_side

    if not available("llama"):
        return [missing_line("each request's slot, cache_n, prompt_n and tokens sampled next to kvlab's")]
    chat = [Request(_ids(0, 34), 8)] + [Request(_ids(t, 14), 8, after_previous=True) for t in (1, 2, 3)]
    refusal = [Request(_ids(4, 10)), Request(_ids(5, 300)), Request(_ids(6, 12))]
    zero = [Request(_ids(7, 40), 0), Request(_ids(7, 40) + _ids(8, 5), 0)]
    cols = ["slot", "cache_n", "prompt_n", "n_generated"]
    lines = side_by_side("append-only chat, -np 1, max_tokens 8", *run_slots(chat, n_ctx=512), cols)
    lines += side_by_side(
        "a 300-token prompt on 256-token slots, -np 2", *run_slots(refusal, n_slots=2, n_ctx=256), cols
    )
    lines += side_by_side("n_predict 0, -np 1", *run_slots(zero, n_ctx=512), cols)
    return lines
