"""Solutions for notebooks/12_sliding_window_checkpoints.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "12.1": """\
# A: ends at 1,324 <= 1,400 and starts at 557 < 1,400 - 128 = 1,272 -> usable
# B: ends at 1,836, after 1,400 -> not usable
# C: ends at 344 <= 350 and starts at 0 -> usable
# D: ends at 349 <= 350 but starts at 300, not below 350 - 128 = 222 -> not usable
answer = [True, False, True, False]
check("12.1", answer)
""",
    "12.2": """\
def decide(n_past, oldest_held, checkpoints, n_swa):
    threshold = max(0, n_past - n_swa)  # the local layers need positions threshold .. n_past - 1
    if oldest_held < threshold:  # strictly below: llama.cpp 0c1e57098 (the lesson's follow-up line uses <=)
        return "cells"
    for pos_min, pos_max in reversed(checkpoints):  # newest first
        if pos_max <= n_past and (pos_min < threshold or pos_min == 0):
            return (pos_min, pos_max)
    return "start over"


check("12.2", decide)
""",
    "12.3": """\
# 3,000 - 4 - 512 = 2,484 and 3,000 - 4 = 2,996: the prompt is split there, and a
# checkpoint of the SWA cells is taken just before each of those two batches.
answer = [2484, 2996]
check("12.3", answer)
""",
    "12.4": """\
# Newest first: [1028, 1795] and [516, 1283] end after 400; [0, 344] (taken at 345 tokens,
# where the user message starts) ends by 400 and starts at 0, so it is restored.
# The server restarts at its last position, 344: cache_n 344, prompt_n 420 - 344 = 76.
answer = [344, 76]
check("12.4", answer)
""",
}
