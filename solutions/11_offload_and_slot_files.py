"""Solutions for notebooks/11_offload_and_slot_files.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "11.1": """\
# Per token: K and V (2) x 28 layers x 4 KV heads x 128 values x 2 bytes = 57,344 B of KV,
# + 4 B token id + 12 B cell metadata = 57,360 B; x 2,000 tokens = 114,720,000 B.
# kvlab's fixed part: a 64-byte header + 8 bytes before each layer's K and V (16 x 28 = 448) = 512 B.
answer = 114_720_512
check("11.1", answer)
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
