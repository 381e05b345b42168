"""Solutions for notebooks/03_utilization.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "03.1": """\
# blocks * 16 - length: 17 -> 2 blocks, 15 empty; 32 -> 2 blocks, 0; 100 -> 7 blocks, 12;
# 1500 -> 94 blocks, 4; 9 -> 1 block, 7.  15 + 0 + 12 + 4 + 7 = 38
answer = 38
check("03.1", answer)
""",
    "03.2": """\
# 32 blocks of 256 slots. The first requests (1187, 1392, 174, 324, 1406, 905, 1354, ...) take
# 5 + 6 + 1 + 2 + 6 + 4 + 6 = 30 blocks for seven requests; the eighth (791 tokens) needs 4 more, and 2 are left.
answer = 7
check("03.2", answer)
""",
    "03.3": """\
def paged_fill(lengths, pool_size, block_size):
    free_blocks = pool_size // block_size
    requests = tokens_stored = wasted_slots = 0
    for length in lengths:
        need = -(-length // block_size)  # ceil(length / block_size)
        if need > free_blocks:
            break  # first come, first served: the queue stops at the first request that does not fit
        free_blocks -= need
        requests += 1
        tokens_stored += length
        wasted_slots += need * block_size - length
    return requests, tokens_stored, wasted_slots


check("03.3", paged_fill)
""",
}
