"""Solutions for notebooks/00_start_here.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "00.1": """\
# 8,192 slots / 2,048 slots per request = 4 requests
answer = 4
check("00.1", answer)
""",
}
