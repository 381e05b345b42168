"""Lesson example 12: reusing a prefix on a sliding-window model, with and without checkpoints.

The lesson ran two requests on three llama-server configurations -- ``-ctxcp 0``,
the default (32 context checkpoints) and ``--swa-full -ctxcp 0`` -- a 1,841-token
prompt, then one that shares its first 350 tokens and adds 4; and an append-only
follow-up on the default server. The course notes add a chat-endpoint run where
the last user message starts at token 345. Both are replayed here on
``kvlab.server.swa.SwaSlot``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import check_size
from kvlab.server.swa import SwaConfig, SwaRequestRecord, SwaSlot

LESSON_PROMPT = 1841
LESSON_SHARED = 350
LESSON_SHORT = 354


@dataclass(frozen=True)
class Example12:
    """The two requests on each server of the lesson, and the append-only follow-up."""

    ctxcp0: tuple[SwaRequestRecord, SwaRequestRecord]
    default: tuple[SwaRequestRecord, SwaRequestRecord]
    swa_full: tuple[SwaRequestRecord, SwaRequestRecord]
    follow_up: SwaRequestRecord  # on a default server, after the long request only
    slots: dict[str, SwaSlot]

    def report(self) -> list[str]:
        """The lesson's reasoning, with every number taken from the simulation."""
        short = self.default[1]
        ring_start = short.ring_pos_min
        lines = [
            f"position {short.common_prefix} needs SWA entries from {short.threshold}; SWA cache starts at {ring_start}"
        ]
        lines += [
            f"checkpoint [{c.pos_min}, {c.pos_max}]: {'usable' if c.usable else 'not usable'}"
            for c in short.checks
        ]
        lines.append(
            "forcing full prompt re-processing: cache_n = 0"
            if short.forced_full
            else f"reuse {short.cache_n} tokens"
        )
        f = self.follow_up
        verdict = f"reuse all {f.cache_n} tokens" if not f.forced_full and f.restored is None else "reprocess"
        lines.append(
            f"append-only follow-up: needs SWA entries from {f.threshold}, cache starts at {f.ring_pos_min} -> {verdict}"
        )
        return lines


def example_12(follow_up_tokens: int = 12) -> Example12:
    """The lesson's three servers: ``-ctxcp 0``, the default, and ``--swa-full -ctxcp 0``.

    Request 1 is 1,841 tokens, request 2 shares its first 350 and adds 4. The
    first request samples one token, so the slot holds exactly its prompt.
    """
    follow_up_tokens = check_size("follow_up_tokens", follow_up_tokens, "tokens", minimum=1)
    long_prompt = list(range(10_000, 10_000 + LESSON_PROMPT))
    short_prompt = long_prompt[:LESSON_SHARED] + list(range(50_000, 50_000 + LESSON_SHORT - LESSON_SHARED))
    out: dict[str, tuple[SwaRequestRecord, SwaRequestRecord]] = {}
    slots: dict[str, SwaSlot] = {}
    for name, cfg in (
        ("ctxcp0", SwaConfig(ctx_checkpoints=0)),
        ("default", SwaConfig()),
        ("swa_full", SwaConfig(swa_full=True, ctx_checkpoints=0)),
    ):
        slot = SwaSlot(cfg)
        out[name] = (slot.complete(long_prompt), slot.complete(short_prompt))
        slots[name] = slot
    follow = SwaSlot(SwaConfig())
    follow.complete(long_prompt)
    slots["follow_up"] = follow
    rec = follow.complete(long_prompt + list(range(60_000, 60_000 + follow_up_tokens)))
    return Example12(out["ctxcp0"], out["default"], out["swa_full"], rec, slots)


NOTES_CHAT_PROMPT = 1800
NOTES_USER_START = 345
NOTES_CHAT_SECOND = 386


def example_12_chat() -> tuple[SwaRequestRecord, SwaRequestRecord, SwaSlot]:
    """The notes' chat-endpoint run: the last user message starts at token 345 in both requests.

    The second request (350 shared tokens + 36) restores the checkpoint taken
    where that message starts, with n_past one less than its n_tokens: cache_n
    344, prompt_n 42; the two later checkpoints are erased.
    """
    first = list(range(20_000, 20_000 + NOTES_CHAT_PROMPT))
    second = first[:LESSON_SHARED] + list(range(70_000, 70_000 + NOTES_CHAT_SECOND - LESSON_SHARED))
    slot = SwaSlot(SwaConfig())
    a = slot.complete(first, user_starts=[NOTES_USER_START])
    b = slot.complete(second, user_starts=[NOTES_USER_START])
    return a, b, slot


def on_real_server() -> list[str]:
    """The lesson's two requests on a real llama-server (tiny gemma3, window 128, ``-c 4096``) and on kvlab.

    The real model has the lesson's window and ring (768 cells), so every ``cache_n`` and every
    checkpoint the server logs can be set next to kvlab's; without the binary, one line says how
    to get it (``kvlab.lessons.real_llama``).
    """
    from kvlab.lessons.real_llama import Request, available, missing_line, run_swa, side_by_side

    if not available("gemma3"):
        return [
            missing_line(
                "cache_n, prompt_n and the checkpoints it logs for the three servers next to kvlab's"
            )
        ]
    long_prompt = tuple(3 + (7 * i) % 509 for i in range(LESSON_PROMPT))
    short = long_prompt[:LESSON_SHARED] + tuple(
        3 + (1 + 7 * i) % 509 for i in range(LESSON_SHORT - LESSON_SHARED)
    )
    reqs = [Request(long_prompt), Request(short)]
    cols = ["cache_n", "prompt_n", "checkpoints"]
    lines: list[str] = []
    for title, kw in (
        ("-ctxcp 0", {"ctx_checkpoints": 0}),
        ("default (-ctxcp 32)", {}),
        ("--swa-full -ctxcp 0", {"ctx_checkpoints": 0, "swa_full": True}),
    ):
        lines += side_by_side(title, *run_swa(reqs, **kw), cols)
    return lines
