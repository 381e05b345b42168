"""llama-server's RAM prompt cache (``--cache-ram``): slot states kept in host memory, oldest first.

Follows ``server_prompt_cache`` in ``tools/server/server-task.cpp`` at llama.cpp 0c1e57098:

* ``alloc`` (``save`` here): a prompt some entry already contains is not saved; a state larger than
  the whole limit is not stored at all ("exceeds cache size limit, skipping") and the entries stay;
  entries the new prompt contains are dropped; then the oldest entries are dropped until the new
  one fits (room is made at save time, before the server looks for an entry to load).
* ``load``: the entry that beats the slot on both the kept fraction (``f_keep``) and the similarity
  to the new prompt moves into the slot and leaves the cache; entries that would keep under a
  quarter of themselves are skipped ("don't trash large prompts").
* ``update``: the oldest entries go while the cache is over its limit.

An entry's size is ``state_bytes_per_token`` per token. The real size also carries a fixed header
(about 124 + 4 x n_parallel bytes for the tiny model, measured) and, on sliding-window models, the
checkpoints' sizes: kvlab leaves both out, which only matters within a token of the limit. The
token-count limit (``--cache-ram -1``) is not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.core.snapshots import RamEntry


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Longest common prefix of two checked token lists (``kvlab.server.slots.common_prefix`` checks them)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PromptCache:
    """The RAM cache's entries (oldest first) and its byte limit (0: off)."""

    def __init__(self, limit_bytes: int, state_bytes_per_token: int) -> None:
        self.limit_bytes = limit_bytes
        self.state_bytes_per_token = state_bytes_per_token
        self.entries: list[RamEntry] = []

    def size(self) -> int:
        return sum(e.size_bytes for e in self.entries)

    def save(self, tokens: Sequence[int]) -> bool:
        """``server_prompt_cache::alloc`` and the copy after it; True when an entry was stored."""
        if not tokens:
            return False
        toks = tuple(tokens)
        if any(_lcp(e.tokens, toks) == len(toks) for e in self.entries):
            return False  # already in the cache
        size = len(toks) * self.state_bytes_per_token
        if self.limit_bytes > 0 and size > self.limit_bytes:
            return False  # over the whole limit: skipped, the cache is not disturbed
        self.entries = [e for e in self.entries if _lcp(e.tokens, toks) != len(e.tokens)]
        if self.limit_bytes > 0:
            while self.entries and self.size() + size > self.limit_bytes:
                self.entries.pop(0)  # make room first
        self.entries.append(RamEntry(toks, size))
        return True

    def load(self, slot_tokens: Sequence[int], prompt: Sequence[int]) -> list[int] | None:
        """``server_prompt_cache::load``: the tokens of the entry to move into the slot, or None."""
        lcp = _lcp(slot_tokens, prompt)
        f_keep_best = lcp / len(slot_tokens) if slot_tokens else -1.0  # an empty slot: any entry wins
        sim_best = lcp / len(prompt)
        best = None
        for i, e in enumerate(self.entries):
            lcp_cur = _lcp(e.tokens, prompt)
            f_keep_cur = lcp_cur / len(e.tokens)
            sim_cur = lcp_cur / len(prompt)
            if f_keep_cur < 0.25:  # don't trash large prompts
                continue
            if f_keep_best < f_keep_cur and sim_best < sim_cur:
                f_keep_best, sim_best, best = f_keep_cur, sim_cur, i
        if best is None:
            return None
        return list(self.entries.pop(best).tokens)

    def update(self) -> None:
        """``server_prompt_cache::update``: drop the oldest entries while over the limit."""
        if self.limit_bytes > 0:
            while self.entries and self.size() > self.limit_bytes:
                self.entries.pop(0)
