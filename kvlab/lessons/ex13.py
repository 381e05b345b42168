"""Lesson example 13: three agent history policies over 20 turns, and what each costs the cache.

The lesson's agent has a 2,000-token prefix and adds a 400-token tool result
every turn. Keeping every result (append-only) processes 10,000 tokens over the
run; keeping only the last five rewrites everything after the prefix every turn
(34,000); summarizing once after twelve results costs one rewrite (10,300).
The policies and the turn loop are ``kvlab.server.agents``.
"""

from __future__ import annotations

from kvlab.server.agents import AgentRun, AppendOnly, HistoryPolicy, KeepLast, SummarizeOnce, run_agent
from kvlab.server.slots import SlotServer


def example_13(server_ctx: int | None = None) -> dict[str, AgentRun]:
    """The lesson's three policies over 20 turns (2,000-token prefix, 400-token results).

    With ``server_ctx`` each policy runs through its own one-slot ``SlotServer`` of that context size.
    """
    policies: list[HistoryPolicy] = [AppendOnly(), KeepLast(5), SummarizeOnce(12)]
    runs = {}
    for p in policies:
        server = None if server_ctx is None else SlotServer(1, n_ctx=server_ctx, cache_ram_mib=0)
        run = run_agent(p, server=server)
        runs[run.name] = run
    return runs
