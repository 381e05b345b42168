"""Exercises of notebook 12, sliding-window checkpoints (lesson example 12).

The expected answers come from ``kvlab.server.swa`` (``SwaSlot``, ``checkpoint_plan``,
``checkpoint_usable``); nothing here states them.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from kvlab.core.snapshots import Checkpoint
from kvlab.exercises.core import NotYet, all_whole, exercise, expect_two_whole
from kvlab.server.swa import SwaConfig, SwaSlot, checkpoint_plan, checkpoint_usable

N_SWA = 128
# 12.1: (checkpoint, n_past); D is made up: a copy of a ring that held only 50 positions
USABLE_CASES = (
    ("A", Checkpoint(557, 1324, 1325), 1400),
    ("B", Checkpoint(1069, 1836, 1837), 1400),
    ("C", Checkpoint(0, 344, 345), 350),
    ("D", Checkpoint(300, 349, 350), 350),
)
LONG_PROMPT = 1841  # 12.2: the lesson's first request
PLAN_TOKENS = 3000  # 12.3
CHAT_PROMPT, CHAT_USER_START = 1800, 345  # 12.4: the notes' chat run
CHAT_SHARED, CHAT_TOTAL = 400, 420


@exercise(
    "12.1",
    title="Usable or not?",
    assesses="applying llama-server's checkpoint rule: ends at or before the reuse point, starts early enough",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["10.1"],
    hints=[
        "Two conditions, both needed: pos_max <= n_past, and pos_min < n_past - 128 (or pos_min == 0).",
        "Work out n_past - 128 for each case first: 1,272 for A and B, 222 for C and D.",
    ],
)
def usable_or_not(answer: list[Any]) -> str:
    expected = [checkpoint_usable(cp, n_past, N_SWA) for _, cp, n_past in USABLE_CASES]
    if len(answer) != len(USABLE_CASES) or not all(isinstance(a, bool) for a in answer):
        raise NotYet(
            f"Give {len(USABLE_CASES)} values True or False, one per case A to D, e.g. [True, True, False, False]."
        )
    if answer == expected:
        return (
            "A full copy of the ring spans 768 positions, so once it ends by the reuse point it also starts early "
            "enough: what rules B out is its end. Only a small checkpoint like D can fail on its start."
        )
    for (name, cp, n_past), got, want in zip(USABLE_CASES, answer, expected, strict=True):
        if got == want:
            continue
        threshold = max(0, n_past - N_SWA)
        if cp.pos_max > n_past:
            raise NotYet(
                f"Look at {name}: it ends at {cp.pos_max}, after the reuse point {n_past}. "
                "It holds the state of tokens the new prompt does not share."
            )
        if cp.pos_min == 0:
            raise NotYet(f"Look at {name}: it starts at position 0, so no earlier position can be missing.")
        if cp.pos_min >= threshold:
            raise NotYet(
                f"Look at {name}: continuing at {n_past} needs positions from {threshold}, "
                f"but it starts at {cp.pos_min}."
            )
        raise NotYet(f"Look at {name} again: it ends by {n_past} and starts before {threshold}.")
    raise NotYet("Check each case against both conditions.")  # pragma: no cover - the loop always finds one


@cache
def _after_long_prompt() -> SwaSlot:
    slot = SwaSlot(SwaConfig(ctx_checkpoints=0))
    slot.complete(list(range(10_000, 10_000 + LONG_PROMPT)))
    return slot


def _ring_reuses(shared: int) -> bool:
    """Does the -ctxcp 0 server keep ``shared`` tokens when a request shares them and then differs?"""
    slot = copy.deepcopy(_after_long_prompt())
    prompt = list(range(10_000, 10_000 + shared)) + list(range(60_000, 60_020))
    return slot.complete(prompt).cache_n == shared


@cache
def _smallest_ring_reuse() -> int:
    lo, hi = 1, LONG_PROMPT  # reuse fails for lo... and holds at hi - 1 (the cells hold the end)
    assert _ring_reuses(hi - 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if _ring_reuses(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@exercise(
    "12.2",
    title="The smallest reuse point the ring supports",
    assesses="reading the ring's contents and the server's strict test: when the SWA cells alone can continue a prompt",
    minutes=8,
    answer_type="int",
    points=2,
    difficulty="core",
    prerequisites=["12.1"],
    hints=[
        "After the 1,841-token prompt the SWA cells hold positions 1,073 to 1,840. To continue at n the server "
        "needs positions from n - 128.",
        "The server uses the cells only when their oldest position is strictly below n - 128; otherwise it looks "
        "for a checkpoint, and with -ctxcp 0 there is none.",
    ],
)
def smallest_ring_reuse(answer: int) -> str:
    expected = _smallest_ring_reuse()
    oldest = _after_long_prompt().ring.pos_min
    if answer == expected:
        return (
            f"At {expected:,} the local layers need positions from {expected - N_SWA:,}, and the oldest cell holds "
            f"{oldest:,}, strictly below it. Every shared prefix from {expected:,} to {LONG_PROMPT - 1:,} tokens is "
            "kept; any shorter one is processed again from position 0."
        )
    if answer == expected - 1:
        raise NotYet(
            f"Close. At {answer} the window needs positions from {answer - N_SWA}, the oldest the cells hold, "
            "but the server's test is strict: it uses the cells only when their oldest position is *below* "
            "n - 128 (current llama.cpp; older builds compared the other way and would accept this one)."
        )
    if answer == oldest:
        raise NotYet(
            f"{oldest} is the oldest position the cells hold; a reuse point also needs the 128 positions before it."
        )
    if answer == LONG_PROMPT - N_SWA:
        raise NotYet(
            f"{answer} is where the append-only follow-up's window starts; "
            "look for the smallest shared prefix instead."
        )
    if answer >= LONG_PROMPT:
        raise NotYet(
            f"The second request shares part of the first one's {LONG_PROMPT:,} tokens; give a smaller number."
        )
    if answer < expected:
        raise NotYet(
            f"At {answer} the local layers would need positions from {max(0, answer - N_SWA)}; "
            f"the cells start at {oldest}."
        )
    raise NotYet(f"{answer} works, but a smaller shared prefix works too.")


@exercise(
    "12.3",
    title="Where do the checkpoints go?",
    assesses="predicting llama-server's checkpoint placement near the end of a /completion prompt",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["12.1"],
    hints=[
        "For 1,841 tokens they were taken at 1,325 and 1,837 tokens; for 1,800 at 1,284 and 1,796. "
        "How far is each from the end?",
        "The prompt is cut so that its last 4 + 512 tokens and its last 4 tokens start new batches; a checkpoint "
        "is taken just before each of those batches. Give n_tokens, the tokens processed when it was taken.",
    ],
)
def checkpoint_placement(answer: list[Any]) -> str:
    plan = checkpoint_plan(PLAN_TOKENS)
    expected = [cp.n_tokens for cp in plan]
    if not all_whole(answer):
        raise NotYet("Give whole numbers: the n_tokens of each checkpoint, oldest first, e.g. [10, 20].")
    if answer == expected:
        spans = ", ".join(f"[{cp.pos_min}, {cp.pos_max}]" for cp in plan)
        return f"Checkpoints at {expected} tokens, covering {spans}: the 768 cells before each."
    if answer == [cp.pos_max for cp in plan]:
        raise NotYet(
            "Those are the last positions each checkpoint covers; give n_tokens, one more than pos_max."
        )
    if sorted(answer) == expected:
        raise NotYet("Right numbers; list them oldest first.")
    if len(answer) != len(expected):
        raise NotYet(
            f"A {PLAN_TOKENS:,}-token prompt gets {len(expected)} checkpoints in this case, not {len(answer)}."
        )
    if answer == [PLAN_TOKENS - 512, PLAN_TOKENS]:
        raise NotYet("Count the 4 tokens that are always kept for the last batch.")
    raise NotYet(f"{answer} is not where the server checkpoints a {PLAN_TOKENS:,}-token prompt.")


def _chat_second() -> tuple[int, int, int]:
    first = list(range(20_000, 20_000 + CHAT_PROMPT))
    second = first[:CHAT_SHARED] + list(range(70_000, 70_000 + CHAT_TOTAL - CHAT_SHARED))
    slot = SwaSlot(SwaConfig())
    slot.complete(first, user_starts=[CHAT_USER_START])
    rec = slot.complete(second, user_starts=[CHAT_USER_START])
    assert rec.restored is not None
    return rec.cache_n, rec.prompt_n, rec.restored.n_tokens


@exercise(
    "12.4",
    title="Predict cache_n on the chat endpoint",
    assesses="tracing a checkpoint restore: which checkpoint serves, and where processing starts again",
    minutes=7,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["12.3"],
    hints=[
        "The ring cannot serve a reuse point this far back, so the server looks through its checkpoints, "
        "newest first. Which one ends by the reuse point?",
        "It restores the checkpoint taken where the user message starts and restarts at that checkpoint's last "
        "position, as in the notes' run; everything from there on is processed.",
    ],
)
def chat_cache_n(answer: list[Any]) -> str:
    cache_n, prompt_n, n_tokens = _chat_second()
    expect_two_whole(answer, "[cache_n, prompt_n]")
    if answer == [cache_n, prompt_n]:
        return (
            f"The checkpoint taken at {n_tokens} tokens is the only one that ends by {CHAT_SHARED}; restoring it "
            f"gives cache_n {cache_n}, although {CHAT_SHARED} tokens are shared: the {CHAT_SHARED - cache_n} "
            f"after it are processed again, with the {CHAT_TOTAL - CHAT_SHARED} new ones."
        )
    if answer[0] + answer[1] != CHAT_TOTAL:
        raise NotYet(f"cache_n + prompt_n is always the prompt's length, {CHAT_TOTAL}.")
    if answer[0] == CHAT_SHARED:
        raise NotYet(
            f"That is what --swa-full would give. Here the SWA cells no longer hold the positions "
            f"{CHAT_SHARED - N_SWA}..{CHAT_SHARED - 1}."
        )
    if answer[0] == n_tokens:
        raise NotYet(
            f"The checkpoint was taken at {n_tokens} tokens (positions 0..{n_tokens - 1}), but the server "
            f"restarts at its last position, {n_tokens - 1}, and processes that token again."
        )
    if answer[0] == 0:
        raise NotYet("Not a full re-processing this time: one checkpoint ends early enough. Which?")
    raise NotYet(f"{answer} is not what the server reports; find the checkpoint it restores first.")
