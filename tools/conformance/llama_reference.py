"""A line-by-line Python transcription of llama-server's slot + RAM prompt cache logic at 0c1e57098.

Not part of kvlab: a yardstick for ``llama_harness.py --against reference``. If this model
agrees with the real server on every request, the differences kvlab shows are explained by the
rules written here, each tagged with the C++ function it follows:

* ``server_context::get_available_slot`` (tools/server/server-context.cpp): id, then LCP
  similarity (float32 fractions), then LRU with ``<=``; ``update_cache`` when chosen by LRU,
  or by similarity/id with ``f_keep < 0.5``; then ``prompt_save``, ``prompt_load`` and
  ``prompt_cache->update()``.
* ``process_single_task`` after ``launch_slot_with_task``: with ``--cache-idle-slots`` (on by
  default, off when ``--cache-ram 0``) every idle slot is saved (``prompt_save``) and the
  cache updated; no clearing, the KV cache is not unified when ``-np`` is given.
* ``update_slots`` (SLOT_STATE_STARTED): a prompt of ``n_ctx`` tokens or more is refused *after*
  all of the above; ``slot.release()`` stamps ``t_last_used`` (the slot keeps whatever the load
  put in it). Otherwise ``n_past`` = LCP, minus one when it is the whole prompt.
* ``server_prompt_cache::alloc`` (server-task.cpp): skip a prompt an entry contains; skip a state
  larger than the limit; drop entries the new one contains; drop the oldest until the new one
  fits; append. Entry size = ``llama_state_seq_get_size_ext`` = fixed + per_token x n.
* ``server_prompt_cache::load``: the entry with f_keep >= 0.25 beating the slot on both f_keep
  and f_sim is moved into the slot. ``update``: oldest out while over the size limit, then
  the token limit (``n_ctx`` of the context, raised to limit_size / bytes per token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

MIB = 1 << 20


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def f32(x: float) -> np.float32:
    return np.float32(x)


@dataclass
class Slot:
    id: int
    tokens: list[int] = field(default_factory=list)
    t_last_used: int = -1


class ReferenceServer:
    def __init__(self, n_slots: int, *, n_ctx_slot: int, sim: float, cache_ram_mib: int,
                 per_token: int, fixed: int, cache_idle_slots: bool = True,
                 revert: frozenset[str] = frozenset()) -> None:  # fmt: skip
        # ``revert``: rules to put back the way kvlab has them, to see which family a difference is:
        # "idle" (no idle-slot saves), "refusal" (refuse before slot selection), "oversize"
        # (store a state over the limit), "room" (evict after the load, newest entry kept),
        # "header" (no fixed part in an entry's size), "float" (float64 fractions)
        self.revert = revert
        if "header" in revert:
            fixed = 0
        self.slots = [Slot(i) for i in range(n_slots)]
        self.n_ctx_slot = n_ctx_slot
        self.sim = f32(sim)
        self.ram_on = cache_ram_mib != 0
        self.limit_size = MIB * max(0, cache_ram_mib)
        self.limit_tokens = n_ctx_slot * n_slots  # server_prompt_cache(cache_ram_mib, n_ctx)
        self.per_token, self.fixed = per_token, fixed
        self.idle = cache_idle_slots and self.ram_on
        self.states: list[tuple[list[int], int]] = []  # (tokens, size), oldest first
        self.clock = 0

    # --------------------------------------------------------------- prompt cache
    def _size(self) -> int:
        return sum(s for _, s in self.states)

    def _n_tokens(self) -> int:
        return sum(len(t) for t, _ in self.states)

    def save(self, slot: Slot) -> bool:
        toks = slot.tokens
        if not toks:
            return False
        if any(lcp(t, toks) == len(toks) for t, _ in self.states):
            return False
        new = self.fixed + self.per_token * len(toks)
        if self.limit_size > 0 and new > self.limit_size and "oversize" not in self.revert:
            return False
        self.states = [(t, s) for t, s in self.states if lcp(t, toks) != len(t)]
        if self.limit_size > 0 and "room" not in self.revert:
            while self.states and self._size() + new > self.limit_size:
                self.states.pop(0)
        self.states.append((list(toks), new))
        return True

    def load(self, slot: Slot, prompt: list[int]) -> None:
        best = lcp(slot.tokens, prompt)
        f_keep_best = f32(best) / f32(len(slot.tokens)) if slot.tokens else f32(-1.0)
        f_sim_best = f32(best) / f32(len(prompt))
        it = None
        for i, (t, _) in enumerate(self.states):
            cur = lcp(t, prompt)
            f_keep_cur = f32(cur) / f32(len(t))
            f_sim_cur = f32(cur) / f32(len(prompt))
            if f_keep_cur < f32(0.25):
                continue
            if f_keep_best < f_keep_cur and f_sim_best < f_sim_cur:
                f_keep_best, f_sim_best, it = f_keep_cur, f_sim_cur, i
        if it is not None:
            slot.tokens = self.states.pop(it)[0]

    def update(self) -> None:
        keep = 1 if ("room" in self.revert or "oversize" in self.revert) else 0
        if self.limit_size > 0:
            while len(self.states) > keep and self._size() > self.limit_size:
                self.states.pop(0)
        spt = max(1.0, float(f32(self._size()) / f32(max(1, self._n_tokens()))))
        cur = max(self.limit_tokens, int(self.limit_size / spt)) if self.limit_size > 0 else self.limit_tokens
        if self.limit_tokens > 0:
            while self.states and self._n_tokens() > cur:
                self.states.pop(0)

    # --------------------------------------------------------------- a request
    def select(self, prompt: list[int], id_slot: int) -> Slot:
        ret = self.slots[id_slot] if id_slot != -1 else None
        update_cache = False
        if self.sim != 0:
            f_sim_best = f32(0)
            for s in self.slots:
                if id_slot != -1 and s.id != id_slot:
                    continue
                if not s.tokens:
                    continue
                f = f32(lcp(s.tokens, prompt)) / f32(len(prompt))
                if f > f_sim_best and f > self.sim:
                    f_sim_best, ret = f, s
            if ret is not None and ret.tokens:
                f_keep = (f_sim_best * f32(len(prompt))) / f32(len(ret.tokens))
                update_cache = bool(f_keep < f32(0.5))
        if ret is None:
            t_last = -1
            for s in self.slots:
                if ret is None or s.t_last_used <= t_last:
                    t_last, ret = s.t_last_used, s
            update_cache = True
        if update_cache and self.ram_on:
            self.save(ret)
            self.load(ret, prompt)
            self.update()
        return ret

    def complete(
        self, prompt: list[int], n_predict: int, id_slot: int, generated: Sequence[int] | None
    ) -> dict:
        if "refusal" in self.revert and len(prompt) >= self.n_ctx_slot:
            return {"refused": True, "error": "before selection"}
        slot = self.select(prompt, id_slot)
        if self.idle and "idle" not in self.revert:
            for s in self.slots:
                if s is not slot and self.save(s):
                    self.update()
        self.clock += 1
        if len(prompt) >= self.n_ctx_slot:
            slot.t_last_used = self.clock
            return {"refused": True, "error": "exceed_context_size_error", "slot": slot.id}
        n_past = lcp(slot.tokens, prompt)
        if n_past == len(prompt):
            n_past -= 1
        gen = list(generated or [])
        slot.tokens = list(prompt) + (gen[:-1] if n_predict > 0 else [])
        slot.t_last_used = self.clock
        return {"refused": False, "slot": slot.id, "cache_n": n_past, "prompt_n": len(prompt) - n_past}
