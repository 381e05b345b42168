"""Exercises of notebook 12, sliding-window checkpoints (lesson example 12).

The expected answers come from ``kvlab.server.swa`` (``SwaSlot``, ``checkpoint_plan``,
``checkpoint_usable``); nothing here states them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kvlab.core.snapshots import Checkpoint
from kvlab.exercises.core import NotYet, all_whole, call, exercise, expect_two_whole
from kvlab.server.swa import SwaConfig, SwaSlot, checkpoint_plan, checkpoint_usable

N_SWA = 128
# 12.1: (checkpoint, n_past); D is made up: a copy of a ring that held only 50 positions
USABLE_CASES = (
    ("A", Checkpoint(557, 1324, 1325), 1400),
    ("B", Checkpoint(1069, 1836, 1837), 1400),
    ("C", Checkpoint(0, 344, 345), 350),
    ("D", Checkpoint(300, 349, 350), 350),
)
PLAN_TOKENS = 3000  # 12.3
N_BATCH = 2048  # llama-server's default n_batch: a 3,000-token prompt is also cut there, with no checkpoint
CHAT_PROMPT, CHAT_USER_START = 1800, 345  # 12.4: the chat-endpoint run kvlab observed on a real server
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
        "Work out the threshold n_past - 128 for each case first: 1,272 for A and B, 222 for C and D.",
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
                f"Look at {name}: it starts at {cp.pos_min}, not below the threshold {threshold} and not at 0. "
                f"Restored, it continues from its last position, {cp.pos_max}, which reads positions "
                f"{cp.pos_max - N_SWA + 1} to {cp.pos_max - 1}: the cells it copied did not reach back that far."
            )
        raise NotYet(f"Look at {name} again: it ends by {n_past} and starts before {threshold}.")
    raise NotYet("Check each case against both conditions.")  # pragma: no cover - the loop always finds one


# 12.2: each case is a run on kvlab's SwaSlot: (first prompt's length, where its last user message
# starts or None, tokens generated, -ctxcp, window, shared tokens). "shared" is a number, or
# ("edge", d): the ring's oldest position + window + d, one side or the other of the boundary.
Shared = int | tuple[str, int]
DecideCase = tuple[int, int | None, int, int, int, Shared]
DECIDE_CASES: tuple[DecideCase, ...] = (
    (1841, None, 1, 32, N_SWA, 350),  # the lesson's request 2
    (1841, None, 1, 32, N_SWA, 1800),
    (1841, None, 1, 0, N_SWA, ("edge", 0)),  # 1,201: the oldest cell is exactly n_past - 128
    (1841, None, 1, 0, N_SWA, ("edge", 1)),  # 1,202
    (1800, 345, 1, 32, N_SWA, 400),  # the chat run: the user-message checkpoint serves
    (1800, 345, 1000, 32, N_SWA, 1500),  # the ring moved on: two checkpoints fit, the newer one serves
    (600, None, 1, 32, N_SWA, 100),  # inside the first window: the threshold is 0
)
NEW_TOKENS = 20  # the second request's own tokens after the shared part


def _decide_cases(rng: random.Random | None) -> list[DecideCase]:
    """The notebook's runs; with ``rng``, eight fresh ones too (the grader's hidden cases)."""
    cases = list(DECIDE_CASES)
    for _ in range(8 if rng else 0):
        assert rng is not None
        n_swa = rng.choice([64, 128, 256])
        first = rng.randint(n_swa + 50, 2600)
        user = rng.choice([None, rng.randint(1, first - 1)])
        generated = rng.choice([1, 1, rng.randint(2, 1200)])
        ctxcp = rng.choice([32, 32, 0, 2])
        shared: Shared = ("edge", rng.choice([-1, 0, 1])) if rng.random() < 0.4 else rng.randint(1, first - 1)
        cases.append((first, user, generated, ctxcp, n_swa, shared))
    return cases


@dataclass(frozen=True)
class _Decided:
    """One 12.2 case as the student's function sees it, and what the slot did."""

    n_past: int
    oldest_held: int
    checkpoints: list[tuple[int, int]]
    n_swa: int
    outcome: str | tuple[int, int]  # "cells", "start over", or the restored checkpoint's span


def _run_decide_case(case: DecideCase) -> _Decided:
    first_len, user, generated, ctxcp, n_swa, shared = case
    slot = SwaSlot(SwaConfig(n_swa=n_swa, ctx_checkpoints=ctxcp))
    first = list(range(10_000, 10_000 + first_len))
    slot.complete(first, max_tokens=generated, user_starts=[] if user is None else [user])
    n_past = slot.ring.pos_min + n_swa + shared[1] if isinstance(shared, tuple) else shared
    n_past = min(max(n_past, 1), first_len - 1)
    spans = [c.span for c in slot.checkpoints]
    rec = slot.complete(first[:n_past] + list(range(90_000, 90_000 + NEW_TOKENS)))
    outcome: str | tuple[int, int] = (
        rec.restored.span if rec.restored is not None else "start over" if rec.forced_full else "cells"
    )
    return _Decided(n_past, rec.ring_pos_min, spans, n_swa, outcome)


def _as_outcome(got: Any) -> str | tuple[int, int] | None:
    """The student's return value as "cells", "start over" or a (pos_min, pos_max) pair; None if neither."""
    if got in ("cells", "start over"):
        return got
    if isinstance(got, (list, tuple)) and len(got) == 2 and all_whole(got):
        return (int(got[0]), int(got[1]))
    return None


@exercise(
    "12.2",
    title="Write the reuse rule",
    assesses="stating llama-server 0c1e57098's reuse rule exactly: the SWA cells first (strictly below the "
    "threshold), then the checkpoints newest first, else start over",
    minutes=10,
    answer_type="function",
    cases=_decide_cases,
    points=2,
    difficulty="core",
    prerequisites=["12.1"],
    hints=[
        "Three steps in order: can the SWA cells serve (their oldest position strictly below n_past - n_swa)? "
        "If not, which checkpoint, newest first, ends at or before n_past and starts below n_past - n_swa "
        "(or at 0)? If none, start over.",
        "checkpoints come oldest first: walk them with reversed(checkpoints), return the first usable pair "
        "as it was given, and compare the oldest cell with < (llama.cpp 0c1e57098), not <= (the lesson's "
        "follow-up line).",
    ],
)
def reuse_rule(answer: Any, cases: list[DecideCase]) -> str:
    for case in cases:
        d = _run_decide_case(case)
        threshold = max(0, d.n_past - d.n_swa)
        got = call(answer, d.n_past, d.oldest_held, list(d.checkpoints), d.n_swa)
        said = f"decide({d.n_past}, {d.oldest_held}, {d.checkpoints}, {d.n_swa}) returned {got!r}"
        outcome = _as_outcome(got)
        if outcome is None:
            raise NotYet(
                f'{said}; return "cells", "start over", or one of the checkpoints as its (pos_min, pos_max).'
            )
        if outcome == d.outcome:
            continue
        if outcome == "cells" and threshold == 0:
            raise NotYet(
                f"{said}. n_past - n_swa is 0 or less, so the threshold is 0 and no cell can lie below it: "
                "the server looks for a checkpoint, even though the cells hold position 0."
            )
        if outcome == "cells" and d.oldest_held == threshold:
            raise NotYet(
                f"{said}. The oldest cell holds {d.oldest_held}, exactly n_past - n_swa: llama.cpp 0c1e57098 "
                "lets the cells serve only when their oldest position is strictly below it."
            )
        if outcome == "cells":
            raise NotYet(f"{said}. The cells start at {d.oldest_held}, not below {threshold}.")
        if d.outcome == "cells":
            raise NotYet(
                f"{said}. The oldest cell holds {d.oldest_held}, below {threshold}: the cells serve."
            )
        if isinstance(outcome, tuple) and outcome not in d.checkpoints:
            raise NotYet(
                f"{said}, which is not one of the checkpoints; return the one that serves as it was given."
            )
        if isinstance(outcome, tuple) and isinstance(d.outcome, tuple):
            raise NotYet(
                f"{said}. Two checkpoints may be usable: the server takes the newest (the last in the list)."
            )
        if isinstance(outcome, tuple):
            pos_min, pos_max = outcome
            why = (
                f"it ends at {pos_max}, after {d.n_past}"
                if pos_max > d.n_past
                else (f"it starts at {pos_min}, not below {threshold}, and not at 0")
            )
            raise NotYet(f"{said}, but {why}.")
        raise NotYet(f"{said}. One checkpoint ends by {d.n_past} and starts early enough: which?")
    return (
        f"It decides as kvlab's SwaSlot (llama.cpp 0c1e57098) on {len(cases)} runs, the boundary included, "
        "where one shared token more or less decides between keeping the prefix and computing it again."
    )


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
        "For 1,841 tokens they were taken at 1,325 and 1,837 tokens (lesson 000, example 12); for 1,800 at 1,284 and "
        "1,796 (a real llama-server 0c1e57098). How far is each from the end?",
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
    if N_BATCH in answer:
        raise NotYet(
            f"{N_BATCH:,} is where the first batch ends: a prompt longer than n_batch = {N_BATCH:,} tokens is "
            "also cut there, but only the batches near the end get a checkpoint. Count back from the end."
        )
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
        "position, as in the chat-endpoint example; everything from there on is processed.",
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
            f"{CHAT_SHARED - N_SWA + 1}..{CHAT_SHARED - 1}."
        )
    if answer[0] == n_tokens:
        raise NotYet(
            f"The checkpoint was taken at {n_tokens} tokens (positions 0..{n_tokens - 1}), but the server "
            f"restarts at its last position, {n_tokens - 1}, and processes that token again."
        )
    if answer[0] == 0:
        raise NotYet("Not a full re-processing this time: one checkpoint ends early enough. Which?")
    raise NotYet(f"{answer} is not what the server reports; find the checkpoint it restores first.")
