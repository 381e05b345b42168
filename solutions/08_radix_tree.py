"""Solutions for notebooks/08_radix_tree.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "08.1": """\
# 1: [1..6], [10, 11] and [30, 31] match whole; 50 is not in the tree -> 6 + 2 + 2 = 10.
# 2: the match stops inside [1, 2, 3, 4, 5, 6] after 3 tokens (that node is split there) -> 3.
# 3: [1..6] whole, then 20 and 21 of [20, 21, 22]; 23 differs -> 6 + 2 = 8.
# 4: no child of the root starts with 7 -> 0 (a prefix must start at the first token).
answer = [10, 3, 8, 0]
check("08.1", answer)
""",
    "08.2": """\
# The unlocked leaves are only [30, 31]: it goes whole (2 tokens, fewer than 3).
# [10, 11] then has no children and no lock, so it is a leaf and goes next (4 tokens freed).
# [1..6] and [20, 21, 22] are locked by the running request and stay.
answer = [[30, 31], [10, 11]]
check("08.2", answer)
""",
    "08.3": """\
def stored_tokens(prompts):
    # each stored token ends one distinct prefix; shared beginnings are stored once
    prefixes = {tuple(p[:i]) for p in prompts for i in range(1, len(p) + 1)}
    return len(prefixes)


check("08.3", stored_tokens)
""",
    "08.4": """\
# Keys are cut to whole pages: the three prompts keep 8 tokens each, the request keeps
# [1, 2, 3, 4, 5, 6, 20, 21], which prompt 2 stored exactly -> 8 tokens matched.
# Prompts 1 and 2 share only the page [1, 2, 3, 4], so the tree holds [1, 2, 3, 4] with
# [5, 6, 10, 11] and [5, 6, 20, 21] below; prompt 3 adds nothing -> 4 + 4 + 4 = 12 stored.
answer = [8, 12]
check("08.4", answer)
""",
}
