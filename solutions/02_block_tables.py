"""Solutions for notebooks/02_block_tables.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "02.1": """\
# Token 30 is logical block 30 // 16 = 1, offset 30 % 16 = 14.
# A's table [7, 2, 9] maps logical block 1 to physical block 2: slot 2 * 16 + 14 = 46.
answer = 46
check("02.1", answer)
""",
    "02.2": """\
# ceil(length / 16): 1 token still takes a block, 16 and 64 fill theirs exactly,
# 17 spills one token into a second block, 100 = 6 * 16 + 4 needs 7, 2048 = 128 * 16.
answer = [1, 1, 2, 4, 7, 128]
check("02.2", answer)
""",
    "02.3": """\
def slot_mapping(block_table, block_size, num_tokens):
    # position p -> logical block p // block_size, offset p % block_size -> physical * block_size + offset
    return [block_table[p // block_size] * block_size + p % block_size for p in range(num_tokens)]


check("02.3", slot_mapping)
""",
    "02.4": """\
# Slot 37 is physical block 37 // 16 = 2, offset 37 % 16 = 5. Block 2 is entry 1 of A's table
# [7, 2, 9], so it is A's logical block 1: position 1 * 16 + 5 = 21.
answer = ["A", 21]
check("02.4", answer)
""",
}
