"""Solutions for notebooks/04_copy_on_write.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "04.1": """\
# 50 tokens: blocks 0, 1, 2 are full, block 3 holds 2 tokens; position 50 falls in block 3.
# Samples 0, 1, 2 each find block 3 shared and copy it to 4, 5, 6; sample 3 is then its
# only holder and writes in place.
answer = [[0, 1, 2, 4], [0, 1, 2, 5], [0, 1, 2, 6], [0, 1, 2, 3]]
check("04.1", answer)
""",
    "04.2": """\
def entries_copied(prompt_len, n, block_size):
    in_last_block = prompt_len % block_size  # 0 when the prompt fills its last block: the write opens a new one
    return (n - 1) * in_last_block  # every sample but the last to write copies the partial block


check("04.2", entries_copied)
""",
    "04.3": """\
# Sample 0 held [0, 1, 3]. Blocks 0 and 1 drop from 3 to 2 holders; block 3 was sample 0's
# private copy, so it drops to 0 and returns to the free list. Blocks 2 and 4 are untouched.
answer = {0: 2, 1: 2, 2: 1, 4: 1}
check("04.3", answer)
""",
}
