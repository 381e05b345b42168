"""Solutions for notebooks/14_paged_attention.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "14.1": """\
# Token 50 is logical block 50 // 16 = 3, offset 50 % 16 = 2. Entry 3 of the table [13, 4, 21, 8] is
# physical block 8, so the kernel reads row 8 * 16 + 2 = 130 of the flat pool.
answer = 130
check("14.1", answer)
""",
    "14.2": """\
# Per token: K and V (2) x 4 layers x 2 KV heads x 32 numbers x 4 bytes = 2,048 bytes.
# 1,000 tokens need ceil(1000 / 16) = 63 blocks = 1,008 slots: 1,008 x 2,048 = 2,064,384 bytes.
answer = 2_064_384
check("14.2", answer)
""",
    "14.3": """\
import torch


def merge(out_a, lse_a, out_b, lse_b):
    # Each part is normalised by its own sum exp(lse); the whole weights each part by its share of the
    # total. Subtracting the larger lse first keeps every exponential <= 1, so nothing overflows.
    top = torch.maximum(lse_a, lse_b)
    weight_a = torch.exp(lse_a - top)[..., None]
    weight_b = torch.exp(lse_b - top)[..., None]
    return (weight_a * out_a + weight_b * out_b) / (weight_a + weight_b)


check("14.3", merge)
""",
    "14.4": """\
# Turn 4 had 109 prompt tokens and sampled 8; the slot keeps all but the last sampled one: 109 + 8 - 1 = 116.
# The prefix cache holds the same 116 tokens, but only full blocks are hashed: 116 // 16 = 7 blocks = 112.
answer = [116, 112]
check("14.4", answer)
""",
}
