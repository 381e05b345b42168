"""Notebook 11's checkers: right answers pass, the common wrong ones get a message that names the mistake."""

from __future__ import annotations

import random

import kvlab.exercises as ex
from kvlab.exercises.nb11 import _after_restore, _refused, _restore_cases


def test_notebook_11_has_three_exercises():
    assert [e.id for e in ex.exercises("11")] == ["11.1", "11.2", "11.3"]


def _after_restore_by_rule(saved, prompt):
    common = 0
    while common < min(len(saved), len(prompt)) and saved[common] == prompt[common]:
        common += 1
    cache_n = min(common, len(prompt) - 1)
    return [cache_n, len(prompt) - cache_n]


def test_what_a_restore_gives_back_is_read_from_real_save_and_restore_calls():
    saved = list(range(100, 110))
    assert _after_restore(saved, saved + [7, 8, 9]) == [10, 3]
    assert _after_restore(saved, saved) == [9, 1]  # the last token is always evaluated
    assert _after_restore(saved, saved[:4]) == [3, 1]
    assert _after_restore(saved, [1, 2, 3]) == [0, 3]
    for saved, prompt in _restore_cases(random.Random(3)):
        assert _after_restore(saved, prompt) == _after_restore_by_rule(saved, prompt)


def test_after_restore_rule_and_its_mistakes():
    result = ex.check("11.1", _after_restore_by_rule)
    assert result.right and "cache_n 748, prompt_n 5" in result.message

    def no_last_token_rule(saved, prompt):
        common = 0
        while common < min(len(saved), len(prompt)) and saved[common] == prompt[common]:
            common += 1
        return [common, len(prompt) - common]

    message = ex.check("11.1", no_last_token_rule).message
    assert "[9, 1], your function [10, 0]" in message
    assert "last token" in message and "len(prompt) - 1" in message  # the feedback names the rule missed
    assert "two whole numbers" in ex.check("11.1", lambda saved, prompt: [1]).message
    assert ex.check("11.1", lambda saved, prompt: ...).status == ex.NOT_DONE


def test_hidden_restore_cases_are_fresh_for_each_seed():
    e = ex.get("11.1")
    shown = e.draw_cases(None)
    a, b = e.draw_cases(random.Random(1)), e.draw_cases(random.Random(2))
    assert a[: len(shown)] == shown and len(a) > len(shown) and a[len(shown) :] != b[len(shown) :]

    def memorised(saved, prompt):  # right on the notebook's cases only
        table = {repr((s, p)): _after_restore_by_rule(s, p) for s, p in shown}
        return table.get(repr((saved, prompt)), [0, len(prompt)])

    assert ex.check("11.1", memorised).right
    assert ex.evaluate(e, memorised, a).status == ex.NOT_YET


def test_break_even_disk():
    assert ex.check("11.2", 0.674).right
    assert ex.check("11.2", 0.67).right
    assert "MB/s" in ex.check("11.2", 674).message
    assert "GiB/s" in ex.check("11.2", 0.628).message
    assert "against the CPU" in ex.check("11.2", 0.0083).message
    assert not ex.check("11.2", 3.0).right
    assert "lesson's SSD" in ex.check("11.2", 3.0).message
    assert "full peak" in ex.check("11.2", 1.348).message  # the 50% forgotten
    assert "half the break-even" in ex.check("11.2", 0.337).message
    assert "break-even speed is lower" in ex.check("11.2", 1.0).message
    assert "break-even speed is higher" in ex.check("11.2", 0.2).message
    assert "positive" in ex.check("11.2", 0).message


def test_refused_restores_are_found_by_trying_them():
    assert _refused() == [4, 5, 6]
    right = ex.check("11.3", [6, 5, 4])
    assert right.right and "llama-server 0c1e57098" in right.message  # kvlab's rule, and the real server's
    assert "restore fine" in ex.check("11.3", [1, 4, 5, 6]).message
    assert "misses 1 refused restore" in ex.check("11.3", [4, 6]).message
    assert "misses 2 refused restores" in ex.check("11.3", [4]).message
    assert "once" in ex.check("11.3", [4, 4, 5, 6]).message
    assert "whole numbers" in ex.check("11.3", ["4", 5, 6]).message
