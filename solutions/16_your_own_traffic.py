"""Solutions for notebooks/16_your_own_traffic.ipynb: exercise id -> the source of its solved cell."""

SOLUTIONS = {
    "16.1": """\
# A prediction earns its points for being made before the reveal. Reasoning for one: turn 1 left its
# 132-token prompt and its 13-token reply but the reply's last token in the cache: 144 tokens. Turn 2
# repeats all of them before its new question, so all 9 of those whole 16-token blocks are reused
# (the last-token cap, (162 - 1) // 16 blocks = 160 tokens, is not what limits it).
answer = 144
predict("16.1", answer)
""",
    "16.2": """\
# Consecutive prompts first differ at token 21 or 22 (the timestamp's minutes), inside the second block, so each
# turn finds only its first 16-token block; the first turn finds nothing: 47 x 16 = 752.
prediction = 752
check("16.2", prediction)
""",
    "16.3": """\
# A frozen front (system prompt, tools in one order, task), then every call appended. Every 12 turns the
# results older than the last 5 become a one-line stub, all at once: the prompt changes early only on
# those turns, and stays far shorter than append-only's.
def layout(session, turn):
    step, keep = 12, 5
    front = session.system + "\\n" + "\\n".join(session.tools)
    messages = [{"role": "system", "content": front}, {"role": "user", "content": session.task}]
    cut = step * ((turn - keep) // step) if turn > keep else 0
    for i, call in enumerate(session.calls[:turn]):
        messages.append({"role": "assistant", "content": call.arguments})
        messages.append({"role": "tool", "content": call.result if i >= cut else f"[result {i} dropped]"})
    return messages


check("16.3", layout)
""",
    "16.4": """\
# The replica with the most cached tokens for this prompt, among those that stay within 1.10 times the
# mean load once this request is counted; ties go to the least loaded. Greedy routing without the bound
# piles everyone onto one replica; a hash of the user ignores what is cached, and no router that keeps each
# user on one replica can balance 13 users over 3 replicas.
def router(request, replicas):
    bound = 1.10 * (sum(r.requests for r in replicas) + 1) / len(replicas)
    allowed = [r for r in replicas if r.requests + 1 <= bound] or list(replicas)
    return max(allowed, key=lambda r: (r.cached_tokens, -r.requests, -r.index)).index


check("16.4", router)
""",
}
