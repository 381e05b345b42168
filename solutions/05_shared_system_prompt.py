"""Solutions for notebooks/05_shared_system_prompt.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "05.1": """\
# Request 3 = request 1's 90 tokens. Request 1's full blocks 0-4 were registered, and every one of
# them matches (same prefix), so request 3 reuses 80 tokens. Its last 10 tokens need a new block;
# blocks 0-8 are taken, so it gets block 9.
answer = [0, 1, 2, 3, 4, 9]
check("05.1", answer)
""",
    "05.2": """\
# 70 // 8 = 8 full blocks of system prompt = 64 tokens; block 8 (tokens 64-71) mixes the last
# 6 system-prompt tokens with the question and misses. 103 - 64 = 39 tokens computed.
answer = 39
check("05.2", answer)
""",
    "05.3": """\
def reused_tokens(system_len, block_size):
    # only full blocks made entirely of system-prompt tokens match
    return (system_len // block_size) * block_size


check("05.3", reused_tokens)
""",
}
