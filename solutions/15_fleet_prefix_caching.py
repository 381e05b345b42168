"""Solutions for notebooks/15_fleet_prefix_caching.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "15.1": """\
# A prediction earns its points for being made before the reveal. Reasoning for one: before the
# message, the stamp only changes blocks that are new on this turn anyway, and it then stays in the
# history the next turn resends unchanged. So almost all of the reuse should survive: about 92%.
answer = 92
predict("15.1", answer)
""",
    "15.2": """\
# Without a salt the 1,200-token system prompt is computed once for the whole fleet; with a salt per
# tenant once per tenant: 9 extra computations, 9 x 1,200 = 10,800 tokens. The rest of the 24,672
# extra tokens (13,872) is history evicted because the 10 copies take 9 x 75 more blocks of the cache.
answer = [9 * 1200, 24_672 - 9 * 1200]
check("15.2", answer)
""",
    "15.3": """\
# Round-robin sends request i to replica i % replicas, whoever sent it. A request finds its history
# when the user's previous request went to that same replica.
def lands_with_history(users, replicas):
    last_replica = {}
    out = []
    for i, user in enumerate(users):
        replica = i % replicas
        out.append(last_replica.get(user) == replica)
        last_replica[user] = replica
    return out


check("15.3", lands_with_history)
""",
    "15.4": """\
# At most 1,999 tokens could come from the cache (the last one must run), and only whole blocks:
# 1,999 // 16 = 124 blocks = 1,984 tokens cached, 16 computed (the first request computed 2,000).
import random

from kvlab.models.prefix_cache import PrefixCache

rng = random.Random(0)
prompt = [rng.randrange(50_000) for _ in range(2000)]
pool = PrefixCache(num_blocks=256, block_size=16)
first = pool.allocate("first", prompt)
pool.free("first")
second = pool.allocate("second", prompt)
print("first: ", first.num_cached_tokens, "cached,", first.num_computed_tokens, "computed")
print("second:", second.num_cached_tokens, "cached,", second.num_computed_tokens, "computed")
answer = [second.num_cached_tokens, second.num_computed_tokens]
check("15.4", answer)
""",
}
