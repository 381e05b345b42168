"""Notebook 14's checkers (real paged attention): right answers pass, common wrong ones get a message naming the mistake."""

from __future__ import annotations

import pytest

import kvlab.exercises as ex

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")


def merge(out_a, lse_a, out_b, lse_b):
    top = torch.maximum(lse_a, lse_b)
    wa, wb = torch.exp(lse_a - top)[..., None], torch.exp(lse_b - top)[..., None]
    return (wa * out_a + wb * out_b) / (wa + wb)


def test_14_1_row_read():
    assert ex.check("14.1", 8 * 16 + 2).right
    assert "position in its sequence" in ex.check("14.1", 50).message
    assert "physical block" in ex.check("14.1", 8).message
    assert "add the token's offset" in ex.check("14.1", 8 * 16).message
    assert "wrong block" in ex.check("14.1", 21 * 16 + 2).message
    assert "Right block" in ex.check("14.1", 131).message and "offset 3" in ex.check("14.1", 131).message
    assert "entry 2 of the table" in ex.check("14.1", 21 * 16 + 5).message
    assert "not in any of this sequence's blocks" in ex.check("14.1", 7).message
    assert ex.check("14.1", "130").status == ex.NOT_YET  # a string, not a whole number


def test_14_2_kv_bytes():
    per_token = 2 * 4 * 2 * 32 * 4
    assert ex.check("14.2", 63 * 16 * per_token).right
    assert "whole 16-token blocks" in ex.check("14.2", 1000 * per_token).message
    assert "both the key and the value" in ex.check("14.2", 63 * 16 * per_token // 2).message
    assert "one layer's share" in ex.check("14.2", 63 * 16 * per_token // 4).message
    assert "query heads" in ex.check("14.2", 63 * 16 * per_token * 4).message
    assert "Two slips" in ex.check("14.2", 1000 * per_token * 4).message


def test_14_3_merge():
    right = ex.check("14.3", merge)
    assert right.right and "split-K kernel (one that splits a sequence's keys and values" in right.message

    def naive(out_a, lse_a, out_b, lse_b):
        wa, wb = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]
        return (wa * out_a + wb * out_b) / (wa + wb)

    assert "overflows" in ex.check("14.3", naive).message
    assert "plain average" in ex.check("14.3", lambda a, la, b, lb: (a + b) / 2).message
    assert "not a tuple" in ex.check("14.3", lambda a, la, b, lb: (merge(a, la, b, lb), la)).message
    assert "swapped" in ex.check("14.3", lambda a, la, b, lb: merge(a, lb, b, la)).message
    assert "shape" in ex.check("14.3", lambda a, la, b, lb: merge(a, la, b, lb)[0]).message
    assert "raised ZeroDivisionError" in ex.check("14.3", lambda a, la, b, lb: 1 / 0).message
    assert ex.check("14.3", lambda a, la, b, lb: ...).status == ex.NOT_DONE


def test_14_4_next_turn():
    assert ex.check("14.4", [116, 112]).right
    assert "last sampled token" in ex.check("14.4", [117, 112]).message
    assert "reply tokens" in ex.check("14.4", [109, 112]).message
    assert "whole blocks only" in ex.check("14.4", [116, 116]).message
    assert "fill blocks too" in ex.check("14.4", [116, 96]).message
    assert "multiple of 16" in ex.check("14.4", [116, 120]).message
    assert "two whole numbers" in ex.check("14.4", [116]).message
    assert not any("8 - 1" in h or "+ 8" in h for h in ex.exercises("14")[3].hints)


def test_14_4_small_model_gives_the_notebooks_counters():
    """The checker plays the chat on a small model; the counters must be the default model's."""
    from kvlab.engine import Engine, run_chat
    from kvlab.engine.chat import context_needed
    from kvlab.exercises.nb14 import CHAT_BLOCK, MAX_TOKENS, TURNS, _chat_counters

    for cache in ("slot", "blocks"):
        engine = Engine(
            cache=cache, block_size=CHAT_BLOCK, max_model_len=context_needed(TURNS, MAX_TOKENS, 0)
        )
        full = run_chat(engine, turns=TURNS, max_tokens=MAX_TOKENS)
        small = _chat_counters(cache)
        assert [(t.prompt_tokens, t.cache_n) for t in small] == [(t.prompt_tokens, t.cache_n) for t in full]
