"""llama-server's slots and prompt cache (lesson example 10).

llama-server does not hash blocks. Each *slot* keeps the token list of the last
request it served, and the next request on that slot reuses the longest common
prefix (LCP) of that list and its own prompt. This model follows
``tools/server/server-context.cpp`` and ``server-task.cpp`` of llama.cpp:

* **What a slot keeps.** The prompt, plus every generated token except the last
  one sampled: a sampled token enters the KV cache only when the next decode step
  processes it, and the request stops right after sampling its last token. So
  after a reply of ``max_tokens`` tokens, the slot holds ``prompt + max_tokens - 1``.
  ``max_tokens=0`` (``n_predict: 0``) still samples one token (``n_generated`` 1, the
  server's ``predicted_n``), and the slot holds the prompt.
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
* **RAM prompt cache** (``--cache-ram`` MiB, default 8192, 0 turns it off, -1 has no byte
  limit and keeps at most the whole context's tokens, ``-c``; ``kvlab.server.prompt_cache``;
  an entry is ``state_header_bytes`` + ``state_bytes_per_token`` per token). When a slot is about to lose most of what it holds
  (chosen by LRU, or by similarity keeping under half, ``f_keep < 0.5``) its tokens are
  saved first and the best cached entry is loaded into it. After the task is launched,
  every idle slot is saved too (``--cache-idle-slots``, on with the RAM cache).
* **A prompt of ``n_ctx`` tokens or more** is refused (HTTP 400, ``exceed_context_size``)
  only after all of the above ran; the release stamps the slot as just used, so the next
  request may land on another slot. ``complete`` returns that refusal as a record with
  ``error`` set, as the server answers it, rather than raising.

Not modelled: ``--cache-reuse`` chunk shifting, context shift, speculative decoding,
multimodal chunks, a unified KV cache (``-np`` given: idle slots are saved, not cleared). Token ids are
whatever the caller passes; ``kvlab.core.chat_format`` gives a deterministic tokenizer
and ChatML template so conversations can be replayed (``kvlab.server.conversation.replay_chat``).

Kept as one module (just over 500 lines): slot choice, a request's life and the server's refusal
path all read and write the same slots; the RAM cache is its own module.

With ``record=True`` every operation adds a step to ``history``: a ``SlotServerState``
(``kvlab.core.snapshots``) and an ``Event`` of kind ``slots.init``, ``slots.place``,
``slots.finish``, ``slots.restore`` or ``slots.erase``; ``kvlab.views.text.slots`` words them.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from kvlab.core.snapshots import Event, History, RequestRecord, SlotServerState, SlotState
from kvlab.core.workloads import JavaRandom, java_list_hash
from kvlab.errors import (
    DuplicateRequestError,
    InvalidArgumentError,
    SlotBusyError,
    UnknownRequestError,
    brief,
    check_bool,
    check_int,
    check_size,
)
from kvlab.server.inputs import call_user, read_tokens
from kvlab.server.prompt_cache import PromptCache, _lcp, f32

MIB = 1 << 20
DEFAULT_CACHE_RAM_MIB = 8192
DEFAULT_SLOT_PROMPT_SIMILARITY = 0.10
# state bytes per token of the lesson's tiny model (4 layers, 2 KV heads x 32, F16): K and V
TINY_STATE_BYTES_PER_TOKEN = 1024
# state bytes per token are bounded at 1 GiB: an 8B Llama at F16 needs 128 KiB, the largest models a few MiB
MAX_STATE_BYTES_PER_TOKEN = 1 << 30
# request ids are names a client picks; 1,024 characters is more than any id scheme uses
MAX_REQUEST_ID_CHARS = 1024


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists (ids 0..MAX_TOKEN_ID, at most ``LIMITS.tokens`` each)."""
    return _lcp(read_tokens("a", a, allow_empty=True), read_tokens("b", b, allow_empty=True))


def default_reply(prompt: Sequence[int], n: int) -> list[int]:
    """Deterministic stand-in for greedy sampling: ``n`` ids (at most ``LIMITS.tokens``) seeded by the prompt's list hash."""
    toks = read_tokens("prompt", prompt, allow_empty=True)
    n = check_size("n", n, "tokens")
    rnd = JavaRandom(java_list_hash(toks))
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
        state_header_bytes: int = 0,
        reply: Callable[[Sequence[int], int], Sequence[int]] | None = None,
        cache_idle_slots: bool = True,
        record: bool = True,
    ) -> None:
        # bounds: LIMITS.slots slots, LIMITS.tokens per slot, LIMITS.mib of RAM cache (kvlab.errors.Limits)
        n_slots = check_size("n_slots", n_slots, "slots", minimum=1)
        n_ctx = check_size("n_ctx", n_ctx, "tokens", minimum=2)
        if not (
            isinstance(cache_ram_mib, int) and not isinstance(cache_ram_mib, bool) and cache_ram_mib == -1
        ):
            cache_ram_mib = check_size("cache_ram_mib", cache_ram_mib, "mib", minimum=0)  # -1: no byte limit
        state_header_bytes = check_int(
            "state_header_bytes", state_header_bytes, minimum=0, maximum=MAX_STATE_BYTES_PER_TOKEN
        )
        state_bytes_per_token = check_int(
            "state_bytes_per_token", state_bytes_per_token, minimum=1, maximum=MAX_STATE_BYTES_PER_TOKEN
        )
        check_bool("cache_prompt", cache_prompt)
        check_bool("cache_idle_slots", cache_idle_slots)
        check_bool("record", record)
        self.cache_idle_slots = cache_idle_slots
        ok = not isinstance(slot_prompt_similarity, bool) and isinstance(slot_prompt_similarity, (int, float))
        similarity = float(slot_prompt_similarity) if ok and abs(slot_prompt_similarity) <= 1 else math.nan
        if not 0.0 <= similarity <= 1.0:  # NaN, a huge int, a string: all refused here
            raise InvalidArgumentError(
                f"slot_prompt_similarity must be a number between 0 and 1 (0 turns similarity off), got {brief(slot_prompt_similarity)}"
            )
        if reply is not None and not callable(reply):
            raise InvalidArgumentError("reply must be a callable (prompt tokens, n) -> n token ids")
        self.n_ctx = n_ctx
        self.cache_prompt = cache_prompt
        self.slot_prompt_similarity = similarity
        self.cache_ram_mib = cache_ram_mib
        self.ram_limit_bytes = max(0, cache_ram_mib) * MIB  # 0 with -1: no byte limit
        self.state_bytes_per_token = state_bytes_per_token
        self.state_header_bytes = state_header_bytes
        self.reply = reply or default_reply
        self._slots = [_Slot(i, []) for i in range(n_slots)]
        # server_prompt_cache(cache_ram_mib, n_ctx): the token limit is the whole context, every slot
        self.prompt_cache = PromptCache(
            self.ram_limit_bytes,
            state_bytes_per_token,
            limit_tokens=n_ctx * n_slots,
            header_bytes=state_header_bytes,
        )
        self._clock = 0
        self._ids = itertools.count()
        self._records: dict[str, RequestRecord] = {}
        self._in_user_code = False  # True while ``reply`` runs: the server refuses calls from inside it
        self.history: History[SlotServerState] | None = History() if record else None
        self._snap(Event.of("slots.init", n_slots=n_slots))

    # ------------------------------------------------------------------ queries

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    @property
    def ram_enabled(self) -> bool:
        return self.cache_ram_mib != 0

    @property
    def records(self) -> list[RequestRecord]:
        """Every request so far, in arrival order (finished or still running)."""
        return list(self._records.values())

    # ------------------------------------------------------------------ all or nothing

    @contextmanager
    def all_or_nothing(self) -> Iterator[SlotServer]:
        """A block of calls that either all happen or, if any raises, leave the server as it was.

        ``replay_chat`` and ``run_agent`` run their turns inside one, so a turn refused halfway
        through a conversation does not leave the earlier turns in the slots and the history.
        """
        saved = self._save()
        try:
            yield self
        except BaseException:
            self._restore(saved)
            raise

    def _save(self) -> tuple[object, ...]:
        ids = copy.copy(self._ids)  # itertools.count copies its position
        steps = len(self.history) if self.history is not None else 0
        return (
            copy.deepcopy(self._slots),
            list(self.prompt_cache.entries),
            self._clock,
            ids,
            dict(self._records),
            steps,
        )

    def _restore(self, saved: tuple[object, ...]) -> None:
        slots, ram, clock, ids, records, steps = saved
        self._slots, self.prompt_cache.entries, self._clock = slots, ram, clock  # type: ignore[assignment]
        self._ids, self._records = ids, records  # type: ignore[assignment]
        if self.history is not None:
            del self.history.steps[steps:]  # type: ignore[misc]

    def _check_not_in_user_code(self) -> None:
        if self._in_user_code:
            raise InvalidArgumentError(
                "the server's reply function called the server; a reply must only return token ids"
            )

    # ------------------------------------------------------------------ queries

    def slot_tokens(self, slot_id: int) -> tuple[int, ...]:
        """The token ids slot ``slot_id`` holds in its KV cache."""
        return tuple(self._slot(slot_id).tokens)

    def state(self) -> SlotServerState:
        last = next(reversed(self._records.values()), None) if self._records else None
        return SlotServerState(
            slots=tuple(
                SlotState(s.slot_id, tuple(s.tokens), s.request_id, s.t_last_used) for s in self._slots
            ),
            ram_cache=tuple(self.prompt_cache.entries),
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
        return rec if rec.error else self.finish(rec.request_id)

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
        self._check_not_in_user_code()
        toks = read_tokens("prompt", prompt)
        max_tokens = check_size("max_tokens", max_tokens, "tokens")
        id_slot = check_int("id_slot", id_slot, minimum=-1)
        if cache_prompt is None:
            cache_prompt = self.cache_prompt
        check_bool("cache_prompt", cache_prompt)
        if id_slot >= self.n_slots:
            raise InvalidArgumentError(
                f"id_slot {id_slot} does not exist: this server has {self.n_slots} slot(s)"
            )
        too_long = len(toks) >= self.n_ctx  # refused by the server, but only after slot choice
        if request_id is not None:
            if not isinstance(request_id, str) or not request_id:
                raise InvalidArgumentError(f"request_id must be a non-empty string, got {brief(request_id)}")
            request_id = str.__str__(request_id)  # a str subclass keeps no __eq__/__hash__ of its own
            if len(request_id) > MAX_REQUEST_ID_CHARS:
                raise InvalidArgumentError(
                    f"request_id has {len(request_id):,} characters; kvlab allows {MAX_REQUEST_ID_CHARS:,}"
                )
            if request_id in self._records:
                raise DuplicateRequestError(f"request id {request_id!r} was already used; pick a new one")
        # n_predict 0 still samples one token: the server checks the limit after sampling
        # (``process_token``: ``n_gen > 0 && !has_budget()``); the token is never cached
        n_gen = max(0, min(max(max_tokens, 1), self.n_ctx - len(toks)))
        if too_long:
            gen = []
        elif generated is None:
            gen = self._reply(toks, n_gen)
        else:
            gen = read_tokens("generated", generated, allow_empty=True)
            if max_tokens == 0 and not gen:
                gen = default_reply(toks, n_gen)  # the dropped token: only its count shows
            if len(gen) > n_gen:
                raise InvalidArgumentError(
                    f"generated has {len(gen)} tokens but this request can sample at most {n_gen} "
                    f"(max_tokens {max_tokens}, room left in the slot {self.n_ctx - len(toks)})"
                )
            if max_tokens > 0 and not gen and not too_long:
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

        # ---- validated; from here on the state changes (an automatic id is drawn only now)
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
            while request_id in self._records:
                request_id = f"req-{next(self._ids)}"
        slot, selected_by, similarity, update_cache = self._select_slot(toks, id_slot)
        saved = loaded = False
        if update_cache and self.ram_enabled:
            saved = self.prompt_cache.save(slot.tokens)
            better = self.prompt_cache.load(slot.tokens, toks)
            loaded = better is not None
            if better is not None:
                slot.tokens = better
            self.prompt_cache.update()
        if self.cache_idle_slots and self.ram_enabled:  # after launch: every idle slot goes to RAM too
            for other in self._slots:
                if other is not slot and other.request_id is None and self.prompt_cache.save(other.tokens):
                    self.prompt_cache.update()
        if too_long:
            return self._refuse_too_long(
                slot, request_id, toks, selected_by, similarity, max_tokens, saved, loaded
            )
        n_past = _lcp(slot.tokens, toks) if cache_prompt else 0
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

    def _refuse_too_long(
        self,
        slot: _Slot,
        request_id: str,
        toks: list[int],
        selected_by: str,
        similarity: float | None,
        max_tokens: int,
        saved: bool,
        loaded: bool,
    ) -> RequestRecord:
        """llama-server's ``update_slots`` refuses a prompt of ``n_ctx`` tokens or more (HTTP 400,
        ``exceed_context_size``) only after ``get_available_slot`` and the launch ran; ``release()``
        then stamps the slot's last-used time, so the next request may land elsewhere."""
        slot.t_last_used = self._clock
        self._clock += 1
        rec = RequestRecord(request_id=request_id, slot_id=slot.slot_id, selected_by=selected_by,
                            similarity=similarity, prompt_tokens=len(toks), cache_n=0, prompt_n=0,
                            max_tokens=max_tokens, ram_saved=saved, ram_loaded=loaded, finished=True,
                            error="exceed_context_size")  # fmt: skip
        self._records[request_id] = rec
        self._snap(Event.of("slots.refuse", request_id=request_id, slot_id=slot.slot_id,
                            prompt_tokens=len(toks), n_ctx=self.n_ctx))  # fmt: skip
        return rec

    def _reply(self, prompt: list[int], n: int) -> list[int]:
        """The ``reply`` function's ``n`` tokens for ``prompt``, checked: exactly ``n`` integer ids in range."""
        self._in_user_code = True
        try:
            out = call_user("the reply function", self.reply, list(prompt), n)
        finally:
            self._in_user_code = False
        try:
            limit = None if isinstance(out, (list, tuple)) else n  # a generator is read no further than n + 1
            gen = read_tokens("the reply function's result", out, limit=limit, allow_empty=True)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f"the reply function returned {brief(out)}, not {n} token ids: {exc}"
            ) from None
        if len(gen) != n:
            raise InvalidArgumentError(f"the reply function returned {len(gen)} tokens, expected {n}")
        return gen

    def finish(self, request_id: str) -> RequestRecord:
        """Generate the reply of a running request and release its slot."""
        self._check_not_in_user_code()
        rec = self._records.get(str.__str__(request_id)) if isinstance(request_id, str) else None
        if rec is None:
            raise UnknownRequestError(f"no request {brief(request_id)}; start it first")
        request_id = rec.request_id
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
        self._check_not_in_user_code()
        slot = self._slot(slot_id)
        toks = read_tokens("tokens", tokens, allow_empty=True)
        if slot.request_id is not None:
            raise SlotBusyError(f"slot {slot_id} is busy with {slot.request_id}; restore it when idle")
        if len(toks) > self.n_ctx:
            raise InvalidArgumentError(f"{len(toks)} tokens do not fit a slot of {self.n_ctx}")
        slot.tokens = toks
        self._snap(Event.of("slots.restore", slot_id=slot.slot_id, n_tokens=len(toks)))

    def erase(self, slot_id: int) -> int:
        """Empty an idle slot (``/slots/N?action=erase``); returns how many tokens it held."""
        self._check_not_in_user_code()
        slot = self._slot(slot_id)
        if slot.request_id is not None:
            raise SlotBusyError(f"slot {slot_id} is busy with {slot.request_id}; erase it when idle")
        n = len(slot.tokens)
        slot.tokens = []
        self._snap(Event.of("slots.erase", slot_id=slot.slot_id, n_tokens=n))
        return n

    # ------------------------------------------------------------------ internals

    def _slot(self, slot_id: int) -> _Slot:
        slot_id = check_int("slot_id", slot_id, minimum=0)
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
            threshold = f32(self.slot_prompt_similarity)  # the server's fractions are C floats
            sim_best = 0.0
            for s in self._slots:
                if (id_slot != -1 and s.slot_id != id_slot) or s.request_id is not None or not s.tokens:
                    continue
                lcp = _lcp(s.tokens, prompt)
                sim = f32(f32(lcp) / f32(len(prompt)))
                if sim > sim_best and sim > threshold:
                    sim_best, ret = sim, s
                    selected_by, similarity = ("id" if id_slot != -1 else "lcp"), lcp / len(prompt)
            if ret is not None and ret.tokens:
                f_keep = f32(f32(sim_best * f32(len(prompt))) / f32(len(ret.tokens)))
                update_cache = f_keep < 0.5  # about to lose most of the slot: save it first
        if ret is None:
            for s in self._slots:
                if s.request_id is None and (ret is None or s.t_last_used <= ret.t_last_used):
                    ret = s
            assert ret is not None  # start() checked that a slot is idle
            selected_by, update_cache = "lru", True
        return ret, selected_by, similarity, update_cache

    def _snap(self, event: Event) -> None:
        if self.history is not None:
            self.history.add(event, self.state())
