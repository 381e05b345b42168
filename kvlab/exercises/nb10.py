"""Exercises of notebook 10, llama-server cache_n (lesson example 10).

The expected answers come from ``kvlab.server.slots.SlotServer`` and ``kvlab.server.conversation.replay_chat``;
nothing here states them.
"""

from __future__ import annotations

from typing import Any

from kvlab.core.chat_format import Message, Tokenizer, render, reply_tokens
from kvlab.core.snapshots import RequestRecord
from kvlab.exercises.core import NotYet, exercise, expect_two_whole
from kvlab.lessons.ex10 import EXAMPLE_SYSTEM, LESSON_MAX_TOKENS
from kvlab.server.conversation import replay_chat
from kvlab.server.slots import SlotServer

# The notebook's conversation: user messages whose prompts have the lesson's token counts.
MESSAGES = ("List the files in src.", "Open the config.", "Run the tests.", "Show the diff.")
FIFTH_MESSAGE = "Now fix it."  # exercise 10.1
ONE_TOKEN_PROMPT = list(range(1000, 1060))  # exercise 10.2: a 60-token prompt, max_tokens 1
ONE_TOKEN_SAMPLED = 7777
ONE_TOKEN_NEXT = list(range(2000, 2010))
# exercise 10.3: two agents whose system prompts start with the same words, on -np 2
LOOKALIKE_SYSTEMS = {
    "coder": "You are a coding agent. Read files with the tools, change as little as you can, and answer briefly.",
    "planner": "You are a travel planner. Suggest trains before flights, keep to the budget, and answer in short lines.",
}
LOOKALIKE_FIRST = {"coder": "List the files in src.", "planner": "Plan a weekend in Lyon."}


@exercise(
    "10.1",
    title="Predict cache_n for turn 5",
    assesses="applying the slot rule: the slot holds the previous prompt and all sampled tokens but the last",
    minutes=5,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["06.3"],
    hints=[
        "After turn 4 the slot holds turn 4's prompt and the tokens sampled for it, except one.",
        "Part two's table shows the pattern: set each turn's cache_n beside the previous turn's prompt_tokens.",
        "Turn 5's prompt grows by 22 tokens, as every turn did (the 8-token reply, 10 template tokens, a 4-token "
        "message); prompt_n is the part of it the slot does not hold.",
    ],
)
def turn_five(answer: list[Any]) -> str:
    turns = replay_chat(
        [*MESSAGES, FIFTH_MESSAGE], system=EXAMPLE_SYSTEM, server=SlotServer(1, cache_ram_mib=0),
        tokenizer=Tokenizer(), max_tokens=LESSON_MAX_TOKENS,
    )  # fmt: skip
    fourth, fifth = turns[3], turns[4]
    expected = [fifth.cache_n, fifth.prompt_n]
    expect_two_whole(answer, "[cache_n, prompt_n]")
    if answer == expected:
        return (
            f"The slot held turn 4's {fourth.prompt_tokens} prompt tokens and {LESSON_MAX_TOKENS - 1} of the "
            f"{LESSON_MAX_TOKENS} sampled ones: cache_n {fifth.cache_n}; the {fifth.prompt_tokens}-token prompt "
            f"leaves prompt_n {fifth.prompt_n}."
        )
    cache_n, prompt_n = answer
    if cache_n == fourth.prompt_tokens + LESSON_MAX_TOKENS:
        raise NotYet(
            "One too many: the last sampled token never went through the model, so it is not in the slot."
        )
    if cache_n == fourth.prompt_tokens:
        raise NotYet("The slot keeps more than the prompt: the reply's tokens were computed too.")
    if cache_n == fifth.prompt_tokens:
        raise NotYet("That is the size of turn 5's prompt; cache_n is the part of it already in the slot.")
    if cache_n == fifth.cache_n:
        raise NotYet(f"cache_n is right; prompt_n is the rest of the {fifth.prompt_tokens}-token prompt.")
    if fourth.prompt_tokens < cache_n < fifth.cache_n:
        raise NotYet(
            f"More than turn 4's {fourth.prompt_tokens}-token prompt, but too few: of the {LESSON_MAX_TOKENS} "
            "tokens sampled for turn 4, only the very last was never read back by the model."
        )
    if cache_n < fourth.prompt_tokens:
        raise NotYet(
            f"Too few: turn 5's prompt starts with turn 4's whole {fourth.prompt_tokens}-token prompt, "
            "which is still in the slot."
        )
    if cache_n > fifth.prompt_tokens:
        raise NotYet(f"cache_n counts tokens of turn 5's prompt, which has only {fifth.prompt_tokens}.")
    raise NotYet(
        "Too many: after turn 4 the slot holds turn 4's prompt and its sampled tokens but the last; "
        "what comes after those in turn 5's prompt is new."
    )


@exercise(
    "10.2",
    title="The token that is never cached",
    assesses="why the last sampled token is missing from the slot: a token's KV exists only once it is processed",
    minutes=4,
    answer_type="int",
    points=1,
    difficulty="intro",
    prerequisites=["10.1"],
    hints=[
        "A token gets keys and values when the model processes it as input. When was the sampled token processed?",
        "With max_tokens 1 the request stops right after sampling, so the sampled token never goes back in.",
    ],
)
def never_cached(answer: int) -> str:
    server = SlotServer(1, cache_ram_mib=0)
    server.complete(ONE_TOKEN_PROMPT, max_tokens=1, generated=[ONE_TOKEN_SAMPLED])
    second = ONE_TOKEN_PROMPT + [ONE_TOKEN_SAMPLED] + ONE_TOKEN_NEXT
    expected = server.complete(second, max_tokens=1).cache_n
    if answer == expected:
        return (
            f"cache_n {expected}: the slot holds the prompt only. The sampled token is the first token the second "
            "request has to process, as in every lesson turn, whose 15 processed tokens start with the last "
            "token of the previous reply."
        )
    if answer == expected + 1:
        raise NotYet(
            "The sampled token is in the new prompt, but is it in the slot? Its KV was never computed."
        )
    if answer == len(second):
        raise NotYet("That is the whole new prompt; only the part the slot holds counts.")
    if answer == expected - 1:
        raise NotYet(
            "The server takes one token back only when the *whole* prompt matches; here it does not."
        )
    if isinstance(answer, int) and answer < len(ONE_TOKEN_PROMPT):
        raise NotYet(
            f"Too few: the second request starts with the same {len(ONE_TOKEN_PROMPT)} prompt tokens, "
            "and the slot still holds every one of them."
        )
    if isinstance(answer, int) and answer < len(second):
        raise NotYet(
            "Too many: the match stops at the first token of the new prompt that the slot does not hold. "
            "Which token comes right after the 60 prompt tokens, and was its KV ever computed?"
        )
    raise NotYet(f"{answer} is more than the second prompt's {len(second)} tokens.")


def _first_requests() -> dict[str, RequestRecord]:
    tokenizer = Tokenizer()
    server = SlotServer(2, cache_ram_mib=0)
    out = {}
    for name, system in LOOKALIKE_SYSTEMS.items():
        prompt = render([Message("system", system), Message("user", LOOKALIKE_FIRST[name])], tokenizer)
        reply = reply_tokens(tokenizer, prompt.tokens, LESSON_MAX_TOKENS)
        out[name] = server.complete(prompt.tokens, max_tokens=LESSON_MAX_TOKENS, generated=reply)
    return out


@exercise(
    "10.3",
    title="Which slot does the second agent get?",
    assesses="llama-server's slot choice: the similarity test on idle slots with tokens comes before LRU",
    minutes=6,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["10.1"],
    hints=[
        "The similarity test comes first and looks only at idle slots that hold tokens. Slot 0 holds none yet.",
        "Count the tokens the planner's prompt shares with slot 1 from the start (template and words), "
        "divide by the prompt's length, and compare with 0.10.",
    ],
)
def second_agent_slot(answer: list[Any]) -> str:
    records = _first_requests()
    coder, planner = records["coder"], records["planner"]
    expected = [planner.slot_id, planner.cache_n]
    expect_two_whole(answer, "[slot, cache_n]")
    if answer == expected:
        return (
            f"{planner.cache_n} shared tokens out of {planner.prompt_tokens} is a similarity of "
            f"{planner.similarity:.2f}, above 0.10, so the planner lands on the coder's slot {planner.slot_id} "
            "although slot 0 is idle. The coder's next turn will find its slot taken."
        )
    slot, cache_n = answer
    if slot not in (0, 1):
        raise NotYet("The server has two slots, 0 and 1.")
    if slot != planner.slot_id:
        raise NotYet(
            f"An empty, idle slot looks like the obvious choice, but the server tries slot similarity first. "
            f"The coder is on slot {coder.slot_id}: how much of the planner's prompt does it share?"
        )
    if cache_n == 0:
        raise NotYet("Right slot. Does the planner's prompt really share nothing with what that slot holds?")
    raise NotYet("Right slot. Count the shared tokens again: the template's first tokens, then the words.")
