"""Solutions for notebooks/15_fleet_prefix_caching.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "15.1": """\
# Before the message, the stamp only changes blocks that are new on this turn anyway, and it then stays
# in the history: the next turn resends it unchanged. So almost all of the reuse survives (92.7%,
# against 92.8% with no timestamp and 0.0% with it at the top).
from kvlab.fleet import FleetConfig, simulate

result = simulate(FleetConfig(header="before-message"))
answer = round(100 * result.hit_rate, 1)
check("15.1", answer)
""",
    "15.2": """\
# 10 salts instead of 200: the system prompt is computed once per tenant, and its 10 copies take
# 750 blocks instead of 15,000. 91.8%, one point below no salt and 35 above a salt per user.
from kvlab.fleet import FleetConfig, simulate

result = simulate(FleetConfig(salt="tenant", tenants=10))
answer = round(100 * result.hit_rate, 1)
check("15.2", answer)
""",
    "15.3": """\
# Round-robin: a user's next turn usually lands on a replica without its history (65.9%).
# User hash: every turn of a conversation goes to the same replica (92.1%), nearly one big cache.
from kvlab.fleet import FleetConfig, chat_traffic, simulate

traffic = chat_traffic()  # draw the lesson's requests once for both runs
answer = {
    routing: round(100 * simulate(FleetConfig(replicas=4, routing=routing), traffic=traffic).hit_rate, 1)
    for routing in ("round-robin", "user-hash")
}
check("15.3", answer)
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
