"""llama-server's slots and prompt cache (lesson example 10).

llama-server does not hash blocks. Each *slot* keeps the token list of the last
request it served, and the next request on that slot reuses the longest common
prefix (LCP) of that list and its own prompt. This model follows
``tools/server/server-context.cpp`` and ``server-task.cpp`` of llama.cpp:

* **What a slot keeps.** The prompt, plus every generated token except the last
  one sampled: a sampled token enters the KV cache only when the next decode step
  processes it, and the request stops right after sampling its last token. So
  after a reply of ``max_tokens`` tokens, the slot holds ``prompt + max_tokens - 1``.
* **Reuse** (``cache_prompt``, on by default): ``cache_n`` = LCP(slot tokens,
  prompt). If that is the whole prompt, one token is taken back
  (``n_past--``): the server must evaluate at least one token to get logits, so
  ``cache_n <= prompt_tokens - 1`` always. ``prompt_n = prompt_tokens - cache_n``.
* **Slot choice** (``get_available_slot``) with ``-np N``: among idle slots that
  hold tokens, the one whose LCP is the largest fraction of the new prompt, if
  that fraction is strictly above ``--slot-prompt-similarity`` (default 0.10;
  0 turns this step off). Otherwise the idle slot used least recently; on a tie
  (for instance at start-up, when no slot was used yet) the *last* such slot wins,
  because the server compares with ``<=``.
* **RAM prompt cache** (``--cache-ram`` MiB, default 8192, 0 turns it off), a
  second level behind the slots. When a slot is about to lose most of what it
  holds -- it was chosen by LRU, or by similarity while keeping under half of its
  tokens (``f_keep < 0.5``) -- its tokens are saved to the cache first; then the
  cache entry that keeps more of itself and matches more of the new prompt than
  the slot does (and keeps at least a quarter of itself) is moved into the slot.
  Saving skips a prompt some entry already contains, and drops entries the new
  one contains. Over the size limit, the oldest saved entries go first (the
  newest one always stays); as a loaded entry leaves the cache and comes back
  when saved again, this is least-recently-used order.

Not modelled: ``--cache-reuse`` chunk shifting, context shift, the RAM cache's
token-count limit, speculative decoding, multimodal chunks. Token ids are
whatever the caller passes; ``kvlab.core.chat_format`` gives a deterministic tokenizer
and ChatML template so conversations can be replayed (``kvlab.server.conversation.replay_chat``).

With ``record=True`` every operation adds a step to ``history``: a ``SlotServerState``
(``kvlab.core.snapshots``) and an ``Event`` of kind ``slots.init``, ``slots.place``,
``slots.finish``, ``slots.restore`` or ``slots.erase``; ``kvlab.views.text.slots`` words them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kvlab.core.snapshots import Event, History, RamEntry, RequestRecord, SlotServerState, SlotState
from kvlab.core.workloads import JavaRandom, java_list_hash
from kvlab.errors import (
    DuplicateRequestError,
    InvalidArgumentError,
    KvlabError,
    SlotBusyError,
    UnknownRequestError,
    brief,
    check_bool,
    check_int,
    check_tokens,
)

MIB = 1 << 20
DEFAULT_CACHE_RAM_MIB = 8192
DEFAULT_SLOT_PROMPT_SIMILARITY = 0.10
# state bytes per token of the lesson's tiny model (4 layers, 2 KV heads x 32, F16): K and V
TINY_STATE_BYTES_PER_TOKEN = 1024


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def default_reply(prompt: Sequence[int], n: int) -> list[int]:
    """Deterministic stand-in for greedy sampling: ``n`` ids seeded by the prompt's list hash."""
    rnd = JavaRandom(java_list_hash(list(prompt)))
    return [1000 + rnd.next_int(30000) for _ in range(n)]


@dataclass
class _Slot:
    slot_id: int
    tokens: list[int]
    request_id: str | None = None
    t_last_used: int = -1
    pending: tuple[list[int], list[int]] | None = None  # (prompt, generated) of the running request


class SlotServer:
    """A llama-server with ``n_slots`` slots (``-np``) serving one request at a time per slot."""

    def __init__(
        self,
        n_slots: int = 1,
        *,
        n_ctx: int = 4096,
        cache_prompt: bool = True,
        slot_prompt_similarity: float = DEFAULT_SLOT_PROMPT_SIMILARITY,
        cache_ram_mib: int = DEFAULT_CACHE_RAM_MIB,
        state_bytes_per_token: int = TINY_STATE_BYTES_PER_TOKEN,
        reply: Callable[[Sequence[int], int], Sequence[int]] | None = None,
        record: bool = True,
    ) -> None:
        check_int("n_slots", n_slots, minimum=1)
        check_int("n_ctx", n_ctx, minimum=2)
        check_int("cache_ram_mib", cache_ram_mib, minimum=0)
        check_int("state_bytes_per_token", state_bytes_per_token, minimum=1)
        check_bool("cache_prompt", cache_prompt)
        check_bool("record", record)
        if isinstance(slot_prompt_similarity, bool) or not isinstance(slot_prompt_similarity, (int, float)):
            raise InvalidArgumentError("slot_prompt_similarity must be a number between 0 and 1")
        if not 0.0 <= slot_prompt_similarity <= 1.0:
            raise InvalidArgumentError(
                f"slot_prompt_similarity must be between 0 and 1 (0 turns similarity off), got {slot_prompt_similarity}"
            )
        if reply is not None and not callable(reply):
            raise InvalidArgumentError("reply must be a callable (prompt tokens, n) -> n token ids")
        self.n_ctx = n_ctx
        self.cache_prompt = cache_prompt
        self.slot_prompt_similarity = float(slot_prompt_similarity)
        self.ram_limit_bytes = cache_ram_mib * MIB
        self.state_bytes_per_token = state_bytes_per_token
        self.reply = reply or default_reply
        self._slots = [_Slot(i, []) for i in range(n_slots)]
        self._ram: list[RamEntry] = []
        self._clock = 0
        self._ids = itertools.count()
        self._records: dict[str, RequestRecord] = {}
        self.history: History[SlotServerState] | None = History() if record else None
        self._snap(Event.of("slots.init", n_slots=n_slots))

    # ------------------------------------------------------------------ queries

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    @property
    def ram_enabled(self) -> bool:
        return self.ram_limit_bytes > 0

    @property
    def records(self) -> list[RequestRecord]:
        """Every request so far, in arrival order (finished or still running)."""
        return list(self._records.values())

    def slot_tokens(self, slot_id: int) -> tuple[int, ...]:
        """The token ids slot ``slot_id`` holds in its KV cache."""
        return tuple(self._slot(slot_id).tokens)

    def state(self) -> SlotServerState:
        last = next(reversed(self._records.values()), None) if self._records else None
        return SlotServerState(
            slots=tuple(
                SlotState(s.slot_id, tuple(s.tokens), s.request_id, s.t_last_used) for s in self._slots
            ),
            ram_cache=tuple(self._ram),
            ram_limit_bytes=self.ram_limit_bytes,
            last=last,
        )

    # ------------------------------------------------------------------ requests

    def complete(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = 16,
        generated: Sequence[int] | None = None,
        id_slot: int = -1,
        cache_prompt: bool | None = None,
        request_id: str | None = None,
    ) -> RequestRecord:
        """Serve one request start to finish and return its record (``start`` then ``finish``)."""
        rec = self.start(
            prompt,
            max_tokens=max_tokens,
            generated=generated,
            id_slot=id_slot,
            cache_prompt=cache_prompt,
            request_id=request_id,
        )
        return self.finish(rec.request_id)

    def start(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = 16,
        generated: Sequence[int] | None = None,
        id_slot: int = -1,
        cache_prompt: bool | None = None,
        request_id: str | None = None,
    ) -> RequestRecord:
        """Place a request on a slot and process its prompt; the slot stays busy until ``finish``.

        ``generated`` are the tokens the model will sample (the last one is never
        cached); by default ``max_tokens`` tokens come from the server's ``reply``
        function (llama-server's own default is no limit; kvlab needs a number). A prompt must be shorter than the slot context ``n_ctx``; the
        reply stops when the slot is full, as llama-server stops without context shift.
        """
        toks = check_tokens("prompt", prompt)
        check_int("max_tokens", max_tokens, minimum=0)
        check_int("id_slot", id_slot, minimum=-1)
        if cache_prompt is None:
            cache_prompt = self.cache_prompt
        check_bool("cache_prompt", cache_prompt)
        if id_slot >= self.n_slots:
            raise InvalidArgumentError(
                f"id_slot {id_slot} does not exist: this server has {self.n_slots} slot(s)"
            )
        if len(toks) >= self.n_ctx:
            raise InvalidArgumentError(
                f"the prompt has {len(toks)} tokens but a slot holds {self.n_ctx}: shorten it or raise n_ctx"
            )
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
            while request_id in self._records:
                request_id = f"req-{next(self._ids)}"
        elif not isinstance(request_id, str) or not request_id:
            raise InvalidArgumentError("request_id must be a non-empty string")
        elif request_id in self._records:
            raise DuplicateRequestError(f"request id {request_id!r} was already used; pick a new one")
        n_gen = min(max_tokens, self.n_ctx - len(toks))
        if generated is None:
            gen = [int(t) for t in self.reply(toks, n_gen)]
            if len(gen) != n_gen:
                raise KvlabError(f"the reply function returned {len(gen)} tokens, expected {n_gen}")
        else:
            gen = check_tokens("generated", generated, allow_empty=True)
            if len(gen) > n_gen:
                raise InvalidArgumentError(
                    f"generated has {len(gen)} tokens but this request can sample at most {n_gen} "
                    f"(max_tokens {max_tokens}, room left in the slot {self.n_ctx - len(toks)})"
                )
            if max_tokens > 0 and not gen:
                raise InvalidArgumentError(
                    "generated is empty: a request with max_tokens > 0 samples at least one token"
                )
        if id_slot != -1 and self._slots[id_slot].request_id is not None:
            raise SlotBusyError(
                f"slot {id_slot} is busy with {self._slots[id_slot].request_id}; finish it first"
            )
        if all(s.request_id is not None for s in self._slots):
            raise SlotBusyError(
                f"all {self.n_slots} slots are busy; finish a request first (the server would wait)"
            )

        # ---- validated; from here on the state changes
        slot, selected_by, similarity, update_cache = self._select_slot(toks, id_slot)
        saved = loaded = False
        if update_cache and self.ram_enabled:
            saved = self._ram_save(slot)
            loaded = self._ram_load(slot, toks)
            self._ram_update()
        n_past = common_prefix(slot.tokens, toks) if cache_prompt else 0
        if n_past == len(toks):  # evaluate at least one token to get logits
            n_past -= 1
        slot.tokens = list(toks)
        slot.request_id = request_id
        slot.pending = (list(toks), gen)
        rec = RequestRecord(
            request_id=request_id,
            slot_id=slot.slot_id,
            selected_by=selected_by,
            similarity=similarity,
            prompt_tokens=len(toks),
            cache_n=n_past,
            prompt_n=len(toks) - n_past,
            max_tokens=max_tokens,
            ram_saved=saved,
            ram_loaded=loaded,
        )
        self._records[request_id] = rec
        self._snap(
            Event.of(
                "slots.place",
                request_id=request_id,
                slot_id=slot.slot_id,
                selected_by=selected_by,
                cache_n=n_past,
                prompt_n=rec.prompt_n,
            )
        )
        return rec

    def finish(self, request_id: str) -> RequestRecord:
        """Generate the reply of a running request and release its slot."""
        rec = self._records.get(request_id) if isinstance(request_id, str) else None
        if rec is None:
            raise UnknownRequestError(f"no request {brief(request_id)}; start it first")
        if rec.finished:
            raise InvalidArgumentError(f"request {request_id!r} has already finished")
        slot = self._slots[rec.slot_id]
        assert slot.pending is not None
        prompt, gen = slot.pending
        slot.tokens = prompt + gen[:-1]  # the last sampled token is never decoded
        slot.request_id = None
        slot.pending = None
        slot.t_last_used = self._clock
        self._clock += 1
        rec = replace(rec, n_generated=len(gen), finished=True)
        self._records[request_id] = rec
        self._snap(
            Event.of(
                "slots.finish",
                request_id=request_id,
                slot_id=slot.slot_id,
                n_generated=len(gen),
                n_tokens=len(slot.tokens),
            )
        )
        return rec

    # ------------------------------------------------------------------ slot actions (example 11)

    def load_tokens(self, slot_id: int, tokens: Sequence[int]) -> None:
        """Replace an idle slot's contents (what ``/slots/N?action=restore`` does after reading a file)."""
        slot = self._slot(slot_id)
        toks = check_tokens("tokens", tokens, allow_empty=True)
        if slot.request_id is not None:
            raise SlotBusyError(f"slot {slot_id} is busy with {slot.request_id}; restore it when idle")
        if len(toks) > self.n_ctx:
            raise InvalidArgumentError(f"{len(toks)} tokens do not fit a slot of {self.n_ctx}")
        slot.tokens = toks
        self._snap(Event.of("slots.restore", slot_id=slot_id, n_tokens=len(toks)))

    def erase(self, slot_id: int) -> int:
        """Empty an idle slot (``/slots/N?action=erase``); returns how many tokens it held."""
        slot = self._slot(slot_id)
        if slot.request_id is not None:
            raise SlotBusyError(f"slot {slot_id} is busy with {slot.request_id}; erase it when idle")
        n = len(slot.tokens)
        slot.tokens = []
        self._snap(Event.of("slots.erase", slot_id=slot_id, n_tokens=n))
        return n

    # ------------------------------------------------------------------ internals

    def _slot(self, slot_id: int) -> _Slot:
        check_int("slot_id", slot_id, minimum=0)
        if slot_id >= self.n_slots:
            raise InvalidArgumentError(
                f"slot {slot_id} does not exist: this server has {self.n_slots} slot(s)"
            )
        return self._slots[slot_id]

    def _select_slot(self, prompt: list[int], id_slot: int) -> tuple[_Slot, str, float | None, bool]:
        """``get_available_slot``: named slot, else best LCP fraction above the threshold, else LRU."""
        ret: _Slot | None = self._slots[id_slot] if id_slot != -1 else None
        selected_by = "id" if ret is not None else ""
        similarity: float | None = None
        update_cache = False
        if self.slot_prompt_similarity != 0.0:
            sim_best = 0.0
            for s in self._slots:
                if (id_slot != -1 and s.slot_id != id_slot) or s.request_id is not None or not s.tokens:
                    continue
                sim = common_prefix(s.tokens, prompt) / len(prompt)
                if sim > sim_best and sim > self.slot_prompt_similarity:
                    sim_best, ret = sim, s
                    selected_by, similarity = ("id" if id_slot != -1 else "lcp"), sim
            if ret is not None and ret.tokens:
                f_keep = sim_best * len(prompt) / len(ret.tokens)
                update_cache = f_keep < 0.5  # about to lose most of the slot: save it first
        if ret is None:
            for s in self._slots:
                if s.request_id is None and (ret is None or s.t_last_used <= ret.t_last_used):
                    ret = s
            assert ret is not None  # start() checked that a slot is idle
            selected_by, update_cache = "lru", True
        return ret, selected_by, similarity, update_cache

    def _entry_size(self, n_tokens: int) -> int:
        return n_tokens * self.state_bytes_per_token

    def _ram_save(self, slot: _Slot) -> bool:
        """``prompt_save``: copy the slot's tokens into the RAM cache (unless already contained)."""
        toks = slot.tokens
        if not toks:
            return False
        if any(common_prefix(e.tokens, toks) == len(toks) for e in self._ram):
            return False
        self._ram = [e for e in self._ram if common_prefix(e.tokens, toks) != len(e.tokens)]
        self._ram.append(RamEntry(tuple(toks), self._entry_size(len(toks))))
        return True

    def _ram_load(self, slot: _Slot, prompt: list[int]) -> bool:
        """``server_prompt_cache::load``: move in the entry that beats the slot on both f_keep and sim."""
        lcp = common_prefix(slot.tokens, prompt)
        f_keep_best = lcp / len(slot.tokens) if slot.tokens else -1.0
        sim_best = lcp / len(prompt)
        best = None
        for i, e in enumerate(self._ram):
            lcp_cur = common_prefix(e.tokens, prompt)
            f_keep_cur = lcp_cur / len(e.tokens)
            sim_cur = lcp_cur / len(prompt)
            if f_keep_cur < 0.25:  # don't trash large prompts
                continue
            if f_keep_best < f_keep_cur and sim_best < sim_cur:
                f_keep_best, sim_best, best = f_keep_cur, sim_cur, i
        if best is None:
            return False
        slot.tokens = list(self._ram.pop(best).tokens)
        return True

    def _ram_update(self) -> None:
        while len(self._ram) > 1 and sum(e.size_bytes for e in self._ram) > self.ram_limit_bytes:
            self._ram.pop(0)

    def _snap(self, event: Event) -> None:
        if self.history is not None:
            self.history.add(event, self.state())
