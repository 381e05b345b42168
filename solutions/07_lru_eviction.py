"""Solutions for notebooks/07_lru_eviction.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "07.1": """\
# D's table is [2, 4, 3]; it is released last block first (3, 4, 2), each to the back,
# behind the blocks that were already free.
answer = [5, 1, 0, 3, 4, 2]
check("07.1", answer)
""",
    "07.2": """\
# a1 is a hit: block 0 is touched out of [5, 1, 0, 3, 4, 2], leaving [5, 1, 3, 4, 2].
# F's two new blocks come from the front: block 5 (held c3) and block 1 (held a2).
answer = ["c3", "a2"]
check("07.2", answer)
""",
    "07.3": """\
# P (10 tokens) gets blocks 0, 1 (full, hashed) and 2 (2 tokens, no hash); Q (6 tokens) gets 3 (hashed)
# and 4 (no hash). The queue is then [5, 6, 7].
# P finishes: 2 to the front, then 1, 0 to the back -> [2, 5, 6, 7, 1, 0]
# Q finishes: 4 to the front, 3 to the back         -> [4, 2, 5, 6, 7, 1, 0, 3]
answer = [4, 2, 5, 6, 7, 1, 0, 3]
check("07.3", answer)
""",
    "07.4": """\
def release(free_queue, block_table, ref_counts, hashed):
    # last block first; a block is free once no other request holds it
    freed = [b for b in reversed(block_table) if ref_counts[b] == 1]
    front = [b for b in freed if b not in hashed]  # no hash: can never be hit, reuse first
    back = [b for b in freed if b in hashed]  # cached: least recently used order
    return front + list(free_queue) + back


check("07.4", release)
""",
}
