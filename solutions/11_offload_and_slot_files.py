"""Solutions for notebooks/11_offload_and_slot_files.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "11.1": """\
# A restore puts back the slot's tokens (and their KV): the next request is served as on a slot that
# had just processed them. It reuses the longest common prefix, but always evaluates at least one
# token, the last, to get the logits it samples from.
def after_restore(saved, prompt):
    common = 0
    while common < min(len(saved), len(prompt)) and saved[common] == prompt[common]:
        common += 1
    cache_n = min(common, len(prompt) - 1)
    return [cache_n, len(prompt) - cache_n]


check("11.1", after_restore)
""",
    "11.2": """\
# Both costs grow with the tokens, so the length cancels. Per token the file holds 131,072 B, and
# recomputing takes 2 x 8.03e9 FLOP / (0.5 x 165.2e12 FLOP/s) = 0.1944 ms.
# 131,072 B / 0.1944 ms = 0.674 GB/s: a slower disk loses to the GPU.
answer = 0.674
check("11.2", answer)
""",
    "11.3": """\
# 1-3 restore fine: the name, the slot and what the slot held do not matter.
# 4 does not fit a 512-token slot; 5 has another shape (equal bytes per token are not enough);
# 6 fails the checksum.
answer = [4, 5, 6]
check("11.3", answer)
""",
}
