"""Solutions for notebooks/06_hash_chains.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "06.1": """\
# Token 6 is in block 6 // 4 = 1, so block 1's hash changes, and block 2's too because it covers
# block 1's hash. Block 0 comes before the edit; tokens 12-13 form a partial block with no hash.
answer = [1, 2]
check("06.1", answer)
""",
    "06.2": """\
from kvlab.core.hashing import hash_block, none_hash


def chain(tokens, block_size):
    hashes = []
    parent = none_hash()  # the fixed seed block 0 hangs from
    for start in range(0, len(tokens) - block_size + 1, block_size):  # full blocks only
        parent = hash_block(parent, tokens[start : start + block_size])
        hashes.append(parent)
    return hashes


check("06.2", chain)
""",
    "06.3": """\
def max_cached_tokens(prompt_len, block_size):
    # the last prompt token is always computed, and hits are whole blocks
    return (prompt_len - 1) // block_size * block_size


check("06.3", max_cached_tokens)
""",
}
