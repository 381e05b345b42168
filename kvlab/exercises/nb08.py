"""Exercises of notebook 08, the radix tree (lesson example 8).

The expected answers come from ``kvlab.models.radix.RadixTree``; nothing here states them.
"""

from __future__ import annotations

import random
from typing import Any

from kvlab.errors import brief
from kvlab.exercises.core import NotYet, all_whole, call, exercise, expect_two_whole
from kvlab.lessons.ex05 import system_prompt_request
from kvlab.lessons.ex08 import EXAMPLE_8_PROMPTS, EXAMPLE_8_REQUEST
from kvlab.models.radix import RadixTree

# 08.1: four new requests, each matched against the tree the lesson's three inserts build
NEW_REQUESTS = (
    (1, 2, 3, 4, 5, 6, 10, 11, 30, 31, 50),
    (1, 2, 3, 9),
    (1, 2, 3, 4, 5, 6, 20, 21, 23),
    (7, 1, 2),
)
EVICT_TOKENS = 3  # 08.2: the lesson's eviction, asking for this many tokens instead of 1
PAGE_SIZE = 4  # 08.4


def _lesson_tree(page_size: int = 1) -> RadixTree:
    tree = RadixTree(page_size=page_size)
    for prompt in EXAMPLE_8_PROMPTS:
        tree.insert(prompt)
    return tree


@exercise(
    "08.1",
    title="How far does each request match?",
    assesses="walking a radix tree by hand: a match follows runs token by token and may stop inside a run",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    hints=[
        "Walk down from the root: compare the request with a child's run token by token, and stop at the first "
        "token that differs. Only tokens before that point count.",
        "A match does not have to end at the end of a run: [1, 2, 7] would follow the first two tokens of "
        "[1, 2, 3, 4, 5, 6] and stop there (the tree splits that run after token 2).",
    ],
)
def matched_lengths(answer: list[Any]) -> str:
    expected = [_lesson_tree().match(list(r)).matched_len for r in NEW_REQUESTS]
    if len(answer) != len(expected) or not all_whole(answer):
        raise NotYet(f"Give {len(expected)} whole numbers, one per request, in the order listed.")
    if answer == expected:
        return (
            "The second request shows why a lookup can change the tree: its match ends inside "
            "[1, 2, 3, 4, 5, 6], so that node is split into [1, 2, 3] and [4, 5, 6]."
        )
    low = [i + 1 for i, (a, e) in enumerate(zip(answer, expected, strict=True)) if a < e]
    high = [i + 1 for i, (a, e) in enumerate(zip(answer, expected, strict=True)) if a > e]
    parts = []
    if low:
        parts.append(
            f"{_requests(low)}: more tokens match than that; a match can stop in the middle of a run, "
            "and the tokens before the stop count"
        )
    if high:
        parts.append(f"{_requests(high)}: fewer tokens match; the first token that differs ends the match")
    text = "; ".join(parts) + "."
    raise NotYet(text[0].upper() + text[1:])


def _requests(numbers: list[int]) -> str:
    """The notebook's numbering of 08.1's requests in words: "request 3", "requests 1 and 4"."""
    if len(numbers) == 1:
        return f"request {numbers[0]}"
    words = [str(n) for n in numbers]
    return f"requests {', '.join(words[:-1])} and {words[-1]}"


@exercise(
    "08.2",
    title="Which leaves go when more is asked?",
    assesses="tracing SGLang's eviction: unlocked leaves only, least recently used first, whole leaves, "
    "a parent left without children becomes a leaf",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["08.1"],
    hints=[
        "Only unlocked leaves can go, and a leaf goes whole. The lesson's first pick, [30, 31], frees 2 tokens. "
        "Is that enough?",
        "Once [30, 31] is gone, its parent has no children left and no lock: it is now a leaf, and a candidate.",
    ],
)
def evicted_runs(answer: list[Any]) -> str:
    tree = _lesson_tree()
    hit = tree.match(list(EXAMPLE_8_REQUEST))
    tree.lock(hit.node)
    runs = tree.evict(EVICT_TOKENS)
    expected = [list(r) for r in runs]
    if not all(isinstance(r, (list, tuple)) and all_whole(r) for r in answer):
        raise NotYet("Give a list of runs, each a list of token ids, e.g. [[1, 2], [3]].")
    got = [list(r) for r in answer]
    if got == expected:
        freed = sum(len(r) for r in expected)
        return (
            f"{freed} tokens freed for {EVICT_TOKENS} asked, because leaves go whole. "
            "[1..6] and [20, 21, 22] stay: the running request locks them (and its match had just made "
            "[20, 21, 22] the newest leaf)."
        )
    if any(r == [20, 21, 22] or r == [1, 2, 3, 4, 5, 6] for r in got):
        raise NotYet(
            "The new request locked [1, 2, 3, 4, 5, 6] and [20, 21, 22]; eviction never takes a locked node."
        )
    if got == expected[:1]:
        raise NotYet(f"That frees {len(expected[0])} tokens, fewer than the {EVICT_TOKENS} asked for.")
    if sorted(map(tuple, got)) == sorted(map(tuple, expected)):
        raise NotYet("Right runs, wrong order: a child must go before its parent can become a leaf.")
    raise NotYet(f"{got} is not what evict({EVICT_TOKENS}) removes.")


def _store_cases(rng: random.Random | None) -> list[list[list[int]]]:
    """The notebook's prompt sets; with ``rng``, eight fresh ones too (the grader's hidden cases)."""
    cases = [
        [list(p) for p in EXAMPLE_8_PROMPTS],
        [system_prompt_request(70, 20, 5000), system_prompt_request(70, 33, 6000)],
        [[1, 2, 3], [1, 2, 3]],
        [[1, 2, 3], [1, 2, 3, 4, 5]],
        [[1, 2, 3, 4, 5], [1, 2]],
        [[5, 6], [7, 8, 9]],
        [[9]],
    ]
    for _ in range(8 if rng else 0):  # few token ids, so that prompts share beginnings
        cases.append(
            [[rng.randint(1, 3) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 6))]
        )
    return cases


@exercise(
    "08.3",
    title="How many tokens does the tree store?",
    assesses="seeing that a radix tree stores every distinct prefix once: shared beginnings cost nothing twice",
    minutes=8,
    answer_type="function",
    cases=_store_cases,
    points=2,
    difficulty="core",
    prerequisites=["08.1"],
    hints=[
        "A token is stored once per distinct prefix that ends with it: prompts that start the same share those tokens.",
        "Collect tuple(prompt[:i]) for every prompt and every i from 1 to len(prompt) in a set; count the set.",
    ],
)
def stored_tokens(answer: Any, cases: list[list[list[int]]]) -> str:
    for prompts in cases:
        tree = RadixTree()
        for p in prompts:
            tree.insert(p)
        expected = tree.total_tokens
        got = call(answer, [list(p) for p in prompts])
        if got != expected:
            extra = ""
            if got == sum(len(p) for p in prompts):
                extra = " That is every prompt token; shared prefixes are stored once."
            raise NotYet(
                f"stored_tokens({brief(prompts, 50)}) returned {got!r}; the radix tree stores another number.{extra}"
            )
    return f"It agrees with kvlab's RadixTree on {len(cases)} prompt sets, the lesson's 13 entries for 27 tokens among them."


@exercise(
    "08.4",
    title="Pages of four tokens",
    assesses="applying page_size: keys are cut to whole pages, and runs split only on page boundaries",
    minutes=6,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["08.1"],
    hints=[
        "With page_size=4 each key is cut to a multiple of 4 tokens first: an 8-, 9- and 10-token prompt each keep 8.",
        "Prompt 2 keeps [1, 2, 3, 4, 5, 6, 20, 21]: it shares only the page [1, 2, 3, 4] with prompt 1, so the split "
        "falls after token 4. Prompt 3 keeps exactly prompt 1's 8 tokens.",
    ],
)
def page_size_four(answer: list[Any]) -> str:
    tree = _lesson_tree(PAGE_SIZE)
    stored = tree.total_tokens
    matched = tree.match(list(EXAMPLE_8_REQUEST)).matched_len
    expected = [matched, stored]
    expect_two_whole(answer, "[tokens matched, tokens stored]")
    if answer == expected:
        return (
            f"The request keeps {matched} of its {len(EXAMPLE_8_REQUEST)} tokens (whole pages only) and all of them "
            f"match. The tree stores {stored} tokens: [5, 6] now sits in two nodes, while the tokens past each "
            "prompt's last whole page are not cached at all."
        )
    if answer[0] == 9:
        raise NotYet(
            "9 is the lesson's answer at page size 1. With pages of 4, can a match end after token 9?"
        )
    if answer[1] == 13:
        raise NotYet(
            "13 is the page-size-1 count. Cut each prompt to whole pages and split only on page boundaries."
        )
    raise NotYet(f"{answer} is not what the page_size=4 tree reports.")
