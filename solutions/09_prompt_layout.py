"""Solutions for notebooks/09_prompt_layout.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "09.1": """\
# Fixed parts first, then the history, then the new message, and the timestamp last of all: next turn's
# prompt repeats everything up to and including this turn's message (it moves into the history), so only
# the timestamp and what follows it are new. Before the message it would cost one message more per turn.
answer = ["system prompt", "tools", "history", "new message", "timestamp"]
check("09.1", answer)
""",
    "09.2": """\
# Why: sorted Z to A, the tools come in the same order every turn; the cache only compares a
# prompt with earlier prompts, so the counts are the stable layout's, whatever fixed order it is.
answer = 85.4
check("09.2", answer)
""",
    "09.3": """\
# Turn index 9 sent 830 + 120 * 9 = 1,910 tokens: 119 full blocks = 1,904 cached tokens (6 left over).
# Turn index 10 sends 2,030 tokens, so 2,030 - 1,904 = 126 are computed.
answer = 126
check("09.3", answer)
""",
}
