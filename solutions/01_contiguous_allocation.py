"""Solutions for notebooks/01_contiguous_allocation.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "01.1": """\
# 8,192 // 1,500 = 5 regions, so all five requests fit;
# they hold 300 + 1,200 + 150 + 700 + 500 = 2,850 tokens -> 2,850 / 8,192 = 34.8%
answer = 34.8
check("01.1", answer)
""",
    "01.2": """\
# First fit puts q6's 500 slots at the start of the 600-slot gap (the lowest one that fits),
# leaving 100; the other two gaps are untouched.
answer = [100, 400, 892]
check("01.2", answer)
""",
    "01.3": """\
def wasted_slots(lengths, pool_size, max_len):
    placed = lengths[: pool_size // max_len]  # equal regions, none released: the first ones fit
    return len(placed) * max_len - sum(placed)


check("01.3", wasted_slots)
""",
    "01.4": """\
# Put the 600- and 400-slot requests side by side: when both finish, their
# regions merge into one 1,000-slot gap, which holds the 900-slot request.
answer = [1500, 600, 400, 1800, 2000, 1000]
check("01.4", answer)
""",
}
