"""Solutions for notebooks/10_llama_server_cache_n.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "10.1": """\
# After turn 4 the slot holds its 100-token prompt and 7 of the 8 sampled tokens: 107.
# Turn 5's prompt is 100 + 22 = 122 tokens, so prompt_n = 122 - 107 = 15, as on every append-only turn.
answer = [107, 15]
check("10.1", answer)
""",
    "10.2": """\
# The sampled token was never read back by the model, so the slot holds only the 60 prompt tokens.
# The match with the new prompt ends there; the sampled token is the first one processed.
answer = 60
check("10.2", answer)
""",
    "10.3": """\
# The planner's prompt shares <|im_start|>, system, \\n, You, are, a = 6 tokens with slot 1:
# 6 / 41 = 0.15 > 0.10, and slot 0 holds no tokens, so the similarity test picks slot 1.
answer = [1, 6]
check("10.3", answer)
""",
}
