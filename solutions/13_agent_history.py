"""Solutions for notebooks/13_agent_history.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "13.1": """\
# Turns 1-3 only append: 2,400 + 400 + 400 = 3,200.
# Turns 4-20 (17 turns) each drop the oldest result, so all 3 kept results
# (1,200 tokens) after the 2,000-token prefix are processed again: 17 x 1,200 = 20,400.
answer = 23600
check("13.1", answer)
""",
    "13.2": """\
# Clock after token 100: turn k processes its whole prompt after token 100,
# 2,010 + 400k - 100 (turn 1: all 2,410) -> 100 + sum of (1,910 + 400k) for k = 1..20 = 122,300.
# Clock last: turn 1 processes 2,410, every later turn the new result and the new clock,
# 410 -> 2,410 + 19 x 410 = 10,200.
answer = [122300, 10200]
check("13.2", answer)
""",
    "13.3": """\
def policy(prefix, results):
    # Append-only, except every 7 results: a summary replaces all but the newest
    # 3 results at once. Each summary is written once and then kept unchanged,
    # so the prompt grows only at its end until the next compaction.
    step, keep = 7, 3
    cut = step * ((len(results) - keep) // step) if len(results) > keep else 0
    summary = list(range(900_000 + 1_000 * cut, 900_000 + 1_000 * cut + 300)) if cut else []
    return [*prefix, *summary, *(t for r in results[cut:] for t in r)]


check("13.3", policy)
""",
}
