"""llama-server's RAM prompt cache (``--cache-ram``): slot states kept in host memory, oldest first.

Follows ``server_prompt_cache`` in ``tools/server/server-task.cpp`` at llama.cpp 0c1e57098:

* ``alloc`` (``save`` here): a prompt some entry already contains is not saved; a state larger than
  the whole limit is not stored at all ("exceeds cache size limit, skipping") and the entries stay;
  entries the new prompt contains are dropped; then the oldest entries are dropped until the new
  one fits (room is made at save time, before the server looks for an entry to load).
* ``load``: the entry that beats the slot on both the kept fraction (``f_keep``) and the similarity
  to the new prompt moves into the slot and leaves the cache; entries that would keep under a
  quarter of themselves are skipped ("don't trash large prompts"). The fractions are C ``float``.
* ``update``: the oldest entries go while the cache is over its byte limit, then while it holds
  more tokens than its token limit. The token limit is the server's whole context (``-c``, every
  slot together); with a byte limit it is raised to what the bytes hold, so only
  ``--cache-ram -1`` (no byte limit) makes it bind.

An entry's size is what ``llama_state_seq_get_size_ext`` reports: a fixed header
(``state_header_bytes``: 132 + 4 x n_parallel bytes for the tiny model of the harness, measured
with two slot saves) plus ``state_bytes_per_token`` per token. On sliding-window models an entry
also carries its slot's checkpoints; kvlab leaves those out (``SlotServer`` models a model without
a window).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvlab.core.snapshots import RamEntry


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Longest common prefix of two checked token lists (``kvlab.server.slots.common_prefix`` checks them)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def f32(x: float) -> float:
    """``x`` rounded to a C ``float``, as the server computes its fractions."""
    return float(np.float32(x))


class PromptCache:
    """The RAM cache's entries (oldest first), its byte limit (0: none) and its token limit (0: none)."""

    def __init__(
        self, limit_bytes: int, state_bytes_per_token: int, *, limit_tokens: int = 0, header_bytes: int = 0
    ) -> None:
        self.limit_bytes = limit_bytes
        self.limit_tokens = limit_tokens
        self.state_bytes_per_token = state_bytes_per_token
        self.header_bytes = header_bytes
        self.entries: list[RamEntry] = []

    def size(self) -> int:
        return sum(e.size_bytes for e in self.entries)

    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def entry_size(self, n_tokens: int) -> int:
        """Bytes of a saved slot state of ``n_tokens`` tokens (``llama_state_seq_get_size_ext``)."""
        return self.header_bytes + n_tokens * self.state_bytes_per_token

    def save(self, tokens: Sequence[int]) -> bool:
        """``server_prompt_cache::alloc`` and the copy after it; True when an entry was stored."""
        if not tokens:
            return False
        toks = tuple(tokens)
        if any(_lcp(e.tokens, toks) == len(toks) for e in self.entries):
            return False  # already in the cache
        size = self.entry_size(len(toks))
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
        f_keep_best = (
            f32(f32(lcp) / f32(len(slot_tokens))) if slot_tokens else -1.0
        )  # an empty slot: any entry wins
        sim_best = f32(f32(lcp) / f32(len(prompt)))
        best = None
        for i, e in enumerate(self.entries):
            lcp_cur = _lcp(e.tokens, prompt)
            f_keep_cur = f32(f32(lcp_cur) / f32(len(e.tokens)))
            sim_cur = f32(f32(lcp_cur) / f32(len(prompt)))
            if f_keep_cur < 0.25:  # don't trash large prompts
                continue
            if f_keep_best < f_keep_cur and sim_best < sim_cur:
                f_keep_best, sim_best, best = f_keep_cur, sim_cur, i
        if best is None:
            return None
        return list(self.entries.pop(best).tokens)

    def update(self) -> None:
        """``server_prompt_cache::update``: drop the oldest entries while over the byte limit, then the tokens'."""
        if self.limit_bytes > 0:
            while self.entries and self.size() > self.limit_bytes:
                self.entries.pop(0)
        if self.limit_tokens > 0:
            per_token = max(1.0, f32(f32(self.size()) / f32(max(1, self.n_tokens()))))
            limit = (
                max(self.limit_tokens, int(f32(f32(self.limit_bytes) / per_token)))
                if self.limit_bytes > 0
                else self.limit_tokens
            )
            while self.entries and self.n_tokens() > limit:
                self.entries.pop(0)
