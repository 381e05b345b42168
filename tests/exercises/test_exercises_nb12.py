"""Notebook 12's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import kvlab.exercises as ex
from kvlab.server.swa import checkpoint_plan


def test_notebook_12_has_four_exercises():
    assert [e.id for e in ex.exercises("12")] == ["12.1", "12.2", "12.3", "12.4"]


def test_usable_or_not():
    assert ex.check("12.1", [True, False, True, False]).right
    assert ex.check("12.1", (True, False, True, False)).right
    assert (
        "B: it ends at 1836, after the reuse point 1400"
        in ex.check("12.1", [True, True, True, False]).message
    )
    assert "C: it starts at position 0" in ex.check("12.1", [True, False, False, False]).message
    said_d = ex.check("12.1", [True, False, True, True]).message
    assert "D: it starts at 300, not below the threshold 222" in said_d
    assert "reads positions 222 to 348" in said_d
    assert "True or False" in ex.check("12.1", [1, 0, 1, 0]).message
    assert "True or False" in ex.check("12.1", [True, False, True]).message


def test_checkpoint_placement():
    right = [c.n_tokens for c in checkpoint_plan(3000)]
    assert ex.check("12.3", right).right
    assert "one more than pos_max" in ex.check("12.3", [c.pos_max for c in checkpoint_plan(3000)]).message
    assert "oldest first" in ex.check("12.3", right[::-1]).message
    assert "gets 2 checkpoints" in ex.check("12.3", right[1:]).message
    assert "4 tokens" in ex.check("12.3", [2488, 3000]).message
    assert "whole numbers" in ex.check("12.3", ["2484", 2996]).message
    # a cut at n_batch (2,048) gets no checkpoint, and the feedback says so
    assert "2,048 is where the first batch ends" in ex.check("12.3", [2048, *right]).message


def test_chat_cache_n(feedback):
    feedback("12.4", [344, 76], "taken at 345 tokens", [
        ([400, 20], "--swa-full"),
        ([345, 75], "restarts at its last position, 344"),
        ([0, 420], "Not a full re-processing"),
        ([344, 70], "always the prompt's length, 420"),
        ([344], "[cache_n, prompt_n]"),
    ])  # fmt: skip


# ------------------------------------------------ the notebook's claim about rule 2's start test


def _random_runs(seed: int, trials: int):
    """(n_swa, request record, created checkpoints) of seeded random SwaSlot runs: windows 16 to 128,
    other ubatch and batch sizes, user-message starts, prefixes cut anywhere, answers of 0 to 200 tokens."""
    import random

    from kvlab.server.swa import SwaConfig, SwaSlot

    rng = random.Random(seed)
    for _ in range(trials):
        n_swa = rng.choice([16, 32, 64, 128])
        n_ubatch = rng.choice([8, 32, 64, 128, 512])
        config = SwaConfig(
            n_swa=n_swa,
            n_ubatch=n_ubatch,
            n_batch=rng.choice([n_ubatch, 2 * n_ubatch, 2048]),
            ctx_checkpoints=rng.choice([2, 8, 32]),
            checkpoint_min_step=rng.choice([0, 64, 8192]),
        )
        slot = SwaSlot(config)
        prompt = list(range(1000, 1000 + rng.randint(10, 1500)))
        for _ in range(rng.randint(1, 5)):
            cut = rng.randint(0, len(prompt))
            prompt = prompt[:cut] + [rng.randint(0, 999) for _ in range(rng.randint(1, 400))]
            starts = (
                sorted(rng.sample(range(1, len(prompt)), k=2))
                if rng.random() < 0.5 and len(prompt) > 2
                else []
            )
            record = slot.complete(prompt, max_tokens=rng.choice([0, 0, 5, 200]), user_starts=starts)
            yield n_swa, record, list(record.created)


def test_server_checkpoints_hold_a_window_except_just_after_a_restore():
    """Notebook 12, *Where the rule's edges come from*: a checkpoint the server takes starts at 0 or
    holds the n_swa - 1 positions before its pos_max, so the start test is safe for it; the one exception
    is the copy taken right after a restore (the restored pos_max is computed again), which holds one less.
    The notebook quotes these 150 runs: 1 such copy in 1,175 checkpoints."""
    seen = after_restore = 0
    for n_swa, record, created in _random_runs(seed=0, trials=150):
        for cp in created:
            seen += 1
            if cp.pos_min == 0 or cp.pos_max - cp.pos_min + 1 >= n_swa:
                continue
            restored = record.restored
            assert restored is not None and cp.pos_max == restored.pos_max - 1, (n_swa, cp, restored)
            assert cp.pos_max - cp.pos_min + 1 == n_swa - 1
            after_restore += 1
    assert (after_restore, seen) == (1, 1175)


def test_the_chat_run_takes_a_short_copy_after_its_restore_but_never_needs_it():
    """Notebook 12, *Where the rule's edges come from*: after restoring [0, 344] the chat run's next
    checkpoint is [217, 343], 127 positions; the newer [217, 344] passes rule 2 whenever it does."""
    from kvlab.lessons.ex12 import example_12_chat
    from kvlab.server.swa import checkpoint_usable

    record = example_12_chat()[1]
    assert record.restored is not None and record.restored.span == (0, 344)
    short, full = record.created[0], record.created[1]
    assert (short.span, full.span) == ((217, 343), (217, 344))
    for n_past in range(344, 400):
        if checkpoint_usable(short, n_past, 128):
            assert checkpoint_usable(full, n_past, 128)
