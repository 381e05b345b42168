"""Lesson example 12: reusing a prefix on a sliding-window model, with and without checkpoints.

The lesson ran two requests on three llama-server configurations -- ``-ctxcp 0``,
the default (32 context checkpoints) and ``--swa-full -ctxcp 0`` -- a 1,841-token
prompt, then one that shares its first 350 tokens and adds 4; and an append-only
follow-up on the default server. kvlab also ran requests on a real llama-server
(llama.cpp 0c1e57098, the tiny gemma3 test model with the lesson's window of 128):
a chat-endpoint run where the last user message starts at token 345, a
1,800-token ``/completion`` prompt, and reuse points on either side of the ring's
boundary. All are replayed here on ``kvlab.server.swa.SwaSlot``; the ``show_*``
functions print each part's figures next to the source that gives them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.snapshots import Event, SwaState
from kvlab.errors import InvalidArgumentError, brief, check_int, check_items, check_size
from kvlab.lessons.compare import compare_table
from kvlab.server.swa import (
    Checkpoint,
    CheckpointCheck,
    SwaConfig,
    SwaRequestRecord,
    SwaSlot,
    checkpoint_plan,
    checkpoint_usable,
)

LESSON_PROMPT = 1841
LESSON_SHARED = 350
LESSON_SHORT = 354

#: The column of figures kvlab observed on a real server (tools/conformance, kvlab.lessons.real_llama).
REAL = "llama-server 0c1e57098 (tiny gemma3)"


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


CHAT_PROMPT = 1800
CHAT_USER_START = 345
CHAT_SECOND = 386


def example_12_chat() -> tuple[SwaRequestRecord, SwaRequestRecord, SwaSlot]:
    """kvlab's chat-endpoint run on a real llama-server: the last user message starts at token 345.

    The second request (350 shared tokens + 36) restores the checkpoint taken
    where that message starts, with n_past one less than its n_tokens: cache_n
    344, prompt_n 42; the two later checkpoints are erased.
    """
    first = list(range(20_000, 20_000 + CHAT_PROMPT))
    second = first[:LESSON_SHARED] + list(range(70_000, 70_000 + CHAT_SECOND - LESSON_SHARED))
    slot = SwaSlot(SwaConfig())
    a = slot.complete(first, user_starts=[CHAT_USER_START])
    b = slot.complete(second, user_starts=[CHAT_USER_START])
    return a, b, slot


def branch_after_long_prompt(shared: int, *, ctx_checkpoints: int = 0) -> SwaSlot:
    """The lesson's 1,841-token prompt, then a request that shares its first ``shared`` tokens and adds 4.

    ``slot.records[-1]`` is the second request; ``swa_decision_figure(slot.history)`` draws its verdict.
    """
    shared = check_int("shared", shared, minimum=1)
    if shared >= LESSON_PROMPT:
        raise InvalidArgumentError(
            f"shared must be below the long prompt's {LESSON_PROMPT:,} tokens, got {brief(shared)}"
        )
    ctx_checkpoints = check_size("ctx_checkpoints", ctx_checkpoints, "count")
    long_prompt = list(range(10_000, 10_000 + LESSON_PROMPT))
    slot = SwaSlot(SwaConfig(ctx_checkpoints=ctx_checkpoints))
    slot.complete(long_prompt)
    slot.complete(long_prompt[:shared] + list(range(50_000, 50_004)))
    return slot


def state_before(slot: SwaSlot, request: int) -> SwaState:
    """The slot's snapshot just before request ``request`` (1 = the first) arrived, for ``swa_figure``."""
    if not isinstance(slot, SwaSlot):
        raise InvalidArgumentError(f"slot must be a SwaSlot, got {type(slot).__name__}")
    request = check_int("request", request, minimum=1)
    arrivals = [
        i
        for i, step in enumerate(slot.history)
        if isinstance(step.event, Event) and step.event.kind == "swa.reuse"
    ]
    if request > len(arrivals):
        raise InvalidArgumentError(f"the slot served {len(arrivals)} requests, got request={brief(request)}")
    if arrivals[request - 1] == 0:
        raise InvalidArgumentError(
            f"request {request} arrived at the history's first step: there is no state before it"
        )
    return slot.history[arrivals[request - 1] - 1].state


# ---------------------------------------------------------------------- the tables a notebook prints


def _spans(checkpoints: Sequence[Checkpoint | CheckpointCheck]) -> str:
    """Checkpoint spans as the server logs them: "[557, 1324], [1069, 1836]"."""
    return ", ".join(f"[{c.pos_min}, {c.pos_max}]" for c in checkpoints)


def _check_example(ex: object) -> Example12:
    if not isinstance(ex, Example12):
        raise InvalidArgumentError(f"ex must be what example_12() returns, got {type(ex).__name__}")
    return ex


def show_counters(ex: Example12) -> None:
    """Part one: ``cache_n`` and ``prompt_n`` of both requests on the lesson's three servers."""
    ex = _check_example(ex)
    lesson = {
        "ctxcp0": ([0, 1841], [0, 354]),
        "default": ([0, 1841], [0, 354]),
        "swa_full": ([0, 1841], [350, 4]),
    }
    names = {"ctxcp0": "-ctxcp 0", "default": "default", "swa_full": "--swa-full"}
    rows = []
    for key, (first, second) in lesson.items():
        one, two = getattr(ex, key)
        rows.append((f"{names[key]}, request 1: cache_n, prompt_n", [one.cache_n, one.prompt_n], first))
        rows.append((f"{names[key]}, request 2: cache_n, prompt_n", [two.cache_n, two.prompt_n], second))
    compare_table(rows, title="The lesson's three servers: request 2 shares 350 tokens with request 1")


def show_default_log(ex: Example12) -> None:
    """Part one: the checkpoints the default server took and checked, as its log shows them."""
    ex = _check_example(ex)
    long, short = ex.default
    compare_table(
        [
            ("checkpoints taken by request 1", _spans(long.created), "[557, 1324], [1069, 1836]"),
            ("... when this many tokens were processed", [c.n_tokens for c in long.created], [1325, 1837]),
            ("request 2 checks, newest first", _spans(short.checks), "[1069, 1836], [557, 1324]"),
            ("... against the threshold", sorted({c.threshold for c in short.checks}), [222]),
            ("default: forcing full re-processing", short.forced_full, True),
            ("-ctxcp 0: forcing full re-processing", ex.ctxcp0[1].forced_full, True),
        ],
        title="What the lesson's default server logged",
        not_reproduced=[
            (
                "checkpoint size (0.158 MiB each)",
                "it depends on the tiny model's layer shapes, which kvlab does not model",
            )
        ],
    )


def show_program(ex: Example12) -> None:
    """Part one: the lesson's program repeating the server's decision, with kvlab's numbers."""
    ex = _check_example(ex)
    short, follow = ex.default[1], ex.follow_up
    print("\n".join(ex.report()))
    print()
    compare_table(
        [
            ("request 2 continues at", short.common_prefix, 350),
            ("threshold n_past - 128", short.threshold, 222),
            ("oldest position in the SWA cells", short.ring_pos_min, 1073),
            *[
                (
                    f"checkpoint [{c.pos_min}, {c.pos_max}]",
                    "usable" if c.usable else "not usable",
                    "not usable",
                )
                for c in short.checks
            ],
            ("follow-up: threshold", follow.threshold, 1713),
            ("follow-up: oldest position in the cells", follow.ring_pos_min, 1073),
            ("follow-up reuses", follow.cache_n, 1841),
        ],
        title="The lesson's program, reproduced",
    )


BOUNDARY = (1201, 1202)  # the oldest cell holds 1,073 = 1,201 - 128


def show_boundary() -> dict[int, SwaSlot]:
    """Reuse points on either side of the ring's boundary on the ``-ctxcp 0`` server, and what a real one did."""
    slots = {shared: branch_after_long_prompt(shared) for shared in BOUNDARY}
    forced, kept = (slots[n].records[-1] for n in BOUNDARY)
    for rec in (forced, kept):
        print(
            f"share {rec.common_prefix:,}: threshold {rec.threshold:,}; the oldest SWA cell holds "
            f"{rec.ring_pos_min:,} -> {'start over' if rec.forced_full else 'the SWA cells serve'}"
        )
    print()
    compare_table(
        [
            ("share 1,201: cache_n, prompt_n", [forced.cache_n, forced.prompt_n], [0, 1205]),
            ("share 1,202: cache_n, prompt_n", [kept.cache_n, kept.prompt_n], [1202, 4]),
        ],
        title="-ctxcp 0 server after the 1,841-token prompt: one token either side of the boundary",
        sources=(REAL,),
    )
    return slots


def show_placement() -> None:
    """Deep dive: where a ``/completion`` prompt's checkpoints go, for the lesson's and kvlab's prompt."""
    lesson_plan, real_plan = checkpoint_plan(LESSON_PROMPT), checkpoint_plan(CHAT_PROMPT)
    compare_table(
        [
            ("1,841 tokens: checkpoints at n_tokens", [c.n_tokens for c in lesson_plan], [1325, 1837], None),
            ("1,841 tokens: [pos_min, pos_max]", _spans(lesson_plan), "[557, 1324], [1069, 1836]", None),
            ("1,800 tokens: checkpoints at n_tokens", [c.n_tokens for c in real_plan], None, [1284, 1796]),
            ("1,800 tokens: [pos_min, pos_max]", _spans(real_plan), None, "[516, 1283], [1028, 1795]"),
        ],
        title="Checkpoints of a /completion prompt: n - 516 and n - 4 tokens",
        sources=("lesson", REAL),
    )


def _checkpoints(name: str, checkpoints: object) -> list[Checkpoint]:
    items = check_items(name, checkpoints, what="a tuple of Checkpoint")
    for i, cp in enumerate(items):
        if not isinstance(cp, Checkpoint) or not all(
            type(v) is int for v in (cp.pos_min, cp.pos_max, cp.n_tokens)
        ):
            raise InvalidArgumentError(f"{name}[{i}] must be a Checkpoint of plain ints, got {brief(cp)}")
    return items  # type: ignore[return-value]


def _check_record(name: str, record: object) -> SwaRequestRecord:
    """A request's record as ``show_chat`` reads it: its checkpoints and counters, as plain values."""
    if not isinstance(record, SwaRequestRecord):
        raise InvalidArgumentError(
            f"{name} must be a SwaRequestRecord (what SwaSlot.complete returns), got {brief(record)}"
        )
    restored = record.restored
    if restored is not None:
        restored = _checkpoints(f"{name}.restored", [restored])[0]
    return dataclasses.replace(
        record,
        created=tuple(_checkpoints(f"{name}.created", record.created)),
        erased=tuple(_checkpoints(f"{name}.erased", record.erased)),
        restored=restored,
        cache_n=check_size(f"{name}.cache_n", record.cache_n, "tokens"),
        prompt_n=check_size(f"{name}.prompt_n", record.prompt_n, "tokens"),
    )


def show_chat(chat: tuple[SwaRequestRecord, SwaRequestRecord, SwaSlot]) -> None:
    """The chat-endpoint run next to what kvlab observed on the real server (the lesson has no such run)."""
    shape = "chat must be what example_12_chat() returns: (record, record, slot)"
    if not isinstance(chat, tuple):
        raise InvalidArgumentError(f"{shape}, got {brief(chat)}")
    items = check_items("chat", chat, what="(record, record, slot)")
    if len(items) != 3 or not isinstance(items[2], SwaSlot):
        raise InvalidArgumentError(f"{shape}, got {brief(chat)}")
    first, second = (_check_record(f"chat[{i}]", r) for i, r in enumerate(items[:2]))
    compare_table(
        [
            ("request 1: checkpoints at n_tokens", [c.n_tokens for c in first.created], [345, 1284, 1796]),
            ("the user-message checkpoint covers", _spans(first.created[:1]), "[0, 344]"),
            ("request 2 restores", _spans([second.restored] if second.restored else []), "[0, 344]"),
            ("request 2: cache_n, prompt_n", [second.cache_n, second.prompt_n], [344, 42]),
            ("erased as invalidated", _spans(second.erased), "[516, 1283], [1028, 1795]"),
        ],
        title="Chat endpoint: the last user message starts at token 345",
        sources=(REAL,),
    )


def after_a_long_answer() -> list[str]:
    """Deep dive: when the near-end checkpoints pay off -- the ring has moved on past the prompt.

    The slot answers the 1,841-token prompt with 1,000 tokens, so its SWA cells hold only the
    answer's region; then the client sends the prompt again cut 4 tokens short and 10 new ones
    (a regenerated or edited last message).
    """
    slot = SwaSlot(SwaConfig())
    prompt = list(range(10_000, 10_000 + LESSON_PROMPT))
    slot.complete(prompt, max_tokens=1000)
    held = f"the SWA cells now hold positions {slot.ring.pos_min} to {slot.ring.pos_max}"
    again = slot.complete(prompt[: LESSON_PROMPT - 4] + list(range(80_000, 80_010)))
    restored = _spans([again.restored]) if again.restored else "none"
    plan = checkpoint_plan(LESSON_PROMPT)
    usable = [
        f"n_past {n:,}: "
        + "; ".join(
            f"[{c.pos_min}, {c.pos_max}] {'usable' if checkpoint_usable(c, n, 128) else 'not usable'}"
            for c in plan
        )
        for n in (350, 1330, 1837)
    ]
    return [held, f"restored: {restored}, cache_n {again.cache_n}, prompt_n {again.prompt_n}", *usable]


def on_real_server() -> list[str]:
    """The lesson's two requests on a real llama-server (tiny gemma3, window 128, ``-c 4096``) and on kvlab.

    The real model has the lesson's window and ring (768 cells), so every ``cache_n`` and every
    checkpoint the server logs can be set next to kvlab's. (The boundary figures of ``show_boundary``
    are checked on the real server by ``tests/exercises/test_nb12_reuse_rule.py``.) Without the
    binary, one line says how to get it (``kvlab.lessons.real_llama``).
    """
    from kvlab.lessons.real_llama import Request, available, missing_line, run_swa, side_by_side

    if not available("gemma3"):
        return [
            missing_line(
                "cache_n, prompt_n and the checkpoints it logs for the three servers next to kvlab's"
            )
        ]
    long_prompt = tuple(3 + (7 * i) % 509 for i in range(LESSON_PROMPT))

    def branch(shared: int, extra: int) -> Request:
        return Request(long_prompt[:shared] + tuple(3 + (1 + 7 * i) % 509 for i in range(extra)))

    reqs = [Request(long_prompt), branch(LESSON_SHARED, LESSON_SHORT - LESSON_SHARED)]
    cols = ["cache_n", "prompt_n", "checkpoints"]
    lines: list[str] = []
    for title, kw in (
        ("-ctxcp 0", {"ctx_checkpoints": 0}),
        ("default (-ctxcp 32)", {}),
        ("--swa-full -ctxcp 0", {"ctx_checkpoints": 0, "swa_full": True}),
    ):
        lines += side_by_side(title, *run_swa(reqs, **kw), cols)
    return lines
