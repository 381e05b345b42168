"""Continuous batching over the tiny engine: many requests share the paged pool, one decode pass per step.

``Scheduler`` is the serving loop's brain (vLLM: ``vllm/v1/core/sched/scheduler.py``).
Requests are ``submit``-ted into a FIFO waiting queue; each ``step``:

1. frees the blocks of requests that were cancelled (a client that went away);
2. runs the deferred control actions whose moment has come (slot save/restore/erase
   when the slot is idle, a prefix-cache reset when nothing runs);
3. **admits** waiting requests in arrival order while ``max_num_seqs`` and the pool
   allow, and runs their prefills packed into one forward pass
   (``TinyTransformer.prefill_batch``; reused tokens are not recomputed), sampling each
   one's first token;
4. advances every other running request by one token in **one** batched forward pass
   (``TinyTransformer.decode_batch``: one matmul per layer for the whole batch, one
   attention call over all their block tables, through the step's one ``DecodePlan``);
5. finishes the requests that reached ``max_tokens``.

**Waiting, not preemption.** A request is admitted only when the pool can hold it to its
last token *and* every running request to its last token: ``max_tokens`` is known and
greedy decoding never stops early, so kvlab reserves the growth up front and never has to
preempt. The first waiting request that does not fit blocks the ones behind it (first come,
first served, as vLLM's FCFS policy does). vLLM v1 admits optimistically instead and, when
a decode step cannot get a block, *preempts* the most recently admitted request and later
recomputes it (``PreemptionMode.RECOMPUTE``, the only mode v1 has); kvlab's
``num_preemptions`` therefore stays 0.

**Cache decisions are the models' decisions**, so a notebook can predict every counter:

* ``cache="blocks"``: ``kvlab.models.prefix_cache.PrefixCache`` (vLLM's block pool)
  allocates the prompt, ``append``-s each sampled token in the step that computes its K/V,
  and frees in reverse order; ``cache_n`` is its ``num_cached_tokens``. The prefix-cache
  counters (``prefix_cache_queries`` / ``prefix_cache_hits``, in tokens) grow by the prompt
  length and the hit once per admitted request (vLLM counts a request again each time the
  scheduler retries it; kvlab counts it when admitted).
* ``cache="slot"``: ``kvlab.server.slots.SlotServer`` with ``n_slots`` slots and no RAM
  prompt cache (``--cache-ram 0``) picks the slot and ``cache_n`` (llama-server's rules);
  slot ``i`` owns a fixed run of ``max_model_len`` tokens' blocks in the pool, and after a
  request the slot holds its prompt and every sampled token but the last.
* ``cache="off"``: fresh blocks for every request, freed at the end.

Outputs are the same tokens ``Engine.generate`` gives one request at a time (greedy).

Not thread-safe by itself: one thread calls ``step``; other threads use only ``submit``,
``cancel`` and ``defer`` (they take a lock and only touch the inbox).

Kept as one module (over 500 lines with its docstring): admission, the batched decode and the three cache modes'
bookkeeping read and write the same running set and the same pool.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from kvlab.engine.engine import Engine
from kvlab.errors import (
    InvalidArgumentError,
    KvlabError,
    SlotBusyError,
    cdiv,
    check_bool,
    check_int,
    check_optional_str,
    check_size,
    check_tokens,
)
from kvlab.models.prefix_cache import PrefixCache
from kvlab.server.slot_files import ModelShape, SlotData, read_slot_file, slot_file_size, write_slot_file
from kvlab.server.slots import SlotServer

DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's default ``--max-num-seqs`` on most GPUs."""
MAX_SLOTS = 64
"""Most llama-server slots (``--slots``): each owns a full context's blocks in the pool."""

_SLOT_DTYPES = {torch.float16: "f16", torch.float32: "f32"}


@dataclass
class ServeRequest:
    """One request's life in the scheduler; ``on_token`` / ``on_finish`` run on the scheduler's thread."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    cache_salt: str | None = None
    id_slot: int = -1
    cache_prompt: bool = True
    on_token: Callable[[ServeRequest, int], None] | None = None
    on_finish: Callable[[ServeRequest], None] | None = None
    status: str = "waiting"  # waiting -> running -> finished | cancelled
    output: list[int] = field(default_factory=list)
    cache_n: int = 0
    slot_id: int = -1
    block_table: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    t_arrival: float = 0.0
    t_admitted: float = 0.0
    t_first_token: float = 0.0
    t_finished: float = 0.0
    cancelled: bool = False

    @property
    def prompt_n(self) -> int:
        """Prompt tokens computed (llama-server's ``timings.prompt_n``)."""
        return len(self.prompt) - self.cache_n

    @property
    def tokens_cached(self) -> int:
        """Tokens whose K/V the request left in the cache: the prompt and every sampled token but the last."""
        return len(self.prompt) + max(len(self.output) - 1, 0)


@dataclass
class Counters:
    """Totals a ``/metrics`` page reports (vLLM's names without the ``vllm:`` prefix)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    request_success: int = 0
    request_aborted: int = 0
    num_preemptions: int = 0
    steps: int = 0
    decode_steps: int = 0
    decoded_sequences: int = 0
    ttft_seconds: list[float] = field(default_factory=list)


@dataclass
class _Deferred:
    """A control action run on the scheduler's thread once ``ready()`` holds."""

    run: Callable[[], object]
    ready: Callable[[], bool]
    blocks_admission: bool
    future: Future


class Scheduler:
    """Continuous batching over one ``Engine``'s model and pool (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        slots: int = 1,
    ) -> None:
        if not isinstance(engine, Engine):
            raise InvalidArgumentError(f"engine must be a kvlab Engine, got {type(engine).__name__}")
        self.max_num_seqs = check_size("max_num_seqs", max_num_seqs, "count", minimum=1)
        slots = check_int("slots", slots, minimum=1, maximum=MAX_SLOTS)
        self.engine = engine
        self.mode = engine.cache_mode
        self.block_size = engine.block_size
        self.num_blocks = engine.pool.num_blocks
        self.blocks_per_seq = cdiv(engine.max_model_len, engine.block_size)
        self.slot_server: SlotServer | None = None
        if self.mode == "slot":
            if slots * self.blocks_per_seq > self.num_blocks:
                raise InvalidArgumentError(
                    f"{slots} slots of {engine.max_model_len} tokens need {slots * self.blocks_per_seq} blocks, "
                    f"but the pool has {self.num_blocks}; build the Engine with num_blocks >= that"
                )
            self.slot_server = SlotServer(
                slots, n_ctx=engine.max_model_len, cache_ram_mib=0, cache_idle_slots=False, record=False
            )
        elif slots != 1:
            raise InvalidArgumentError("slots is for cache='slot' (llama-server's -np); leave it at 1")
        self.n_slots = slots
        self._free_off: deque[int] = deque(range(self.num_blocks))
        self.waiting: deque[ServeRequest] = deque()
        self.running: list[ServeRequest] = []
        self.counters = Counters()
        self._inbox: deque[ServeRequest] = deque()
        self._cancels: set[str] = set()
        self._deferred: list[_Deferred] = []
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.wakeup = threading.Event()

    # ------------------------------------------------------------------ any thread

    def submit(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = 16,
        cache_salt: str | None = None,
        id_slot: int = -1,
        cache_prompt: bool = True,
        on_token: Callable[[ServeRequest, int], None] | None = None,
        on_finish: Callable[[ServeRequest], None] | None = None,
    ) -> ServeRequest:
        """Queue a request (validated now, so a refused one changes nothing); returns its record."""
        toks = check_tokens("prompt", prompt)
        max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
        if len(toks) + max_tokens > self.engine.max_model_len:
            raise InvalidArgumentError(
                f"prompt ({len(toks)} tokens) + max_tokens ({max_tokens}) exceed the model's context "
                f"max_model_len={self.engine.max_model_len}; shorten the prompt or ask for fewer tokens"
            )
        cache_salt = check_optional_str("cache_salt", cache_salt)
        if cache_salt is not None and self.mode == "slot":
            raise InvalidArgumentError("cache_salt needs --cache blocks: a llama-server slot has no salt")
        id_slot = check_int("id_slot", id_slot, minimum=-1)
        if self.mode == "slot" and id_slot >= self.n_slots:
            raise InvalidArgumentError(
                f"id_slot {id_slot} does not exist: this server has {self.n_slots} slot(s)"
            )
        check_bool("cache_prompt", cache_prompt)
        req = ServeRequest(
            request_id=f"req-{next(self._ids)}",
            prompt=toks,
            max_tokens=max_tokens,
            cache_salt=cache_salt,
            id_slot=id_slot,
            cache_prompt=cache_prompt,
            on_token=on_token,
            on_finish=on_finish,
            t_arrival=time.perf_counter(),
        )
        with self._lock:
            self._inbox.append(req)
        self.wakeup.set()
        return req

    def cancel(self, request_id: str) -> None:
        """Stop a request (its client went away); its blocks are freed at the next step."""
        with self._lock:
            self._cancels.add(request_id)
        self.wakeup.set()

    def defer(
        self,
        run: Callable[[], object],
        *,
        ready: Callable[[], bool] | None = None,
        blocks_admission: bool = False,
    ) -> Future:
        """Run ``run`` on the scheduler's thread at the start of the first step where ``ready()`` holds.

        ``blocks_admission`` holds back new admissions until it ran (a reset waits for the
        running requests to finish, and no new one starts meanwhile).
        """
        fut: Future = Future()
        with self._lock:
            self._deferred.append(_Deferred(run, ready or (lambda: True), blocks_admission, fut))
        self.wakeup.set()
        return fut

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._inbox or self._cancels or self._deferred or self.waiting or self.running)

    # ------------------------------------------------------------------ the scheduler's thread

    def step(self) -> None:
        """One scheduling step (see the module docstring)."""
        with self._lock:
            self.waiting.extend(self._inbox)
            self._inbox.clear()
            cancels, self._cancels = self._cancels, set()
        self.counters.steps += 1
        self._cancel(cancels)
        self._run_deferred()
        admitted = self._admit()
        batch = [r for r in self.running if r not in admitted]
        if batch:
            self._decode(batch)
        for req in [r for r in self.running if len(r.output) >= r.max_tokens]:
            self._finish(req, "length")

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        """Step until every queued request finished (for tests and in-process use)."""
        for _ in range(max_steps):
            if not self.has_work():
                return
            self.step()
        raise KvlabError(f"the scheduler did not go idle in {max_steps} steps")

    # ------------------------------------------------------------------ queries

    def kv_cache_usage(self) -> float:
        """Fraction of the pool in use (vLLM's ``kv_cache_usage_perc``: cached-but-free blocks count as free)."""
        if self.mode == "blocks":
            used = self.num_blocks - self._prefix_cache.num_free_blocks
        elif self.mode == "off":
            used = self.num_blocks - len(self._free_off)
        else:
            assert self.slot_server is not None
            busy = {r.slot_id: len(r.prompt) + len(r.output) for r in self.running}
            used = sum(
                cdiv(busy.get(i, len(self.slot_server.slot_tokens(i))), self.block_size)
                for i in range(self.n_slots)
            )
        return used / self.num_blocks

    @property
    def _prefix_cache(self) -> PrefixCache:
        pc = self.engine.prefix_cache
        assert pc is not None
        return pc

    def slot_blocks(self, slot_id: int) -> list[int]:
        """The pool blocks slot ``slot_id`` owns (cache='slot')."""
        return list(range(slot_id * self.blocks_per_seq, (slot_id + 1) * self.blocks_per_seq))

    def slot_busy(self, slot_id: int) -> bool:
        return any(r.slot_id == slot_id for r in self.running)

    # ------------------------------------------------------------------ steps' parts

    def _cancel(self, ids: set[str]) -> None:
        if not ids:
            return
        for req in [r for r in self.waiting if r.request_id in ids]:
            self.waiting.remove(req)
            self._end(req, "abort")
        for req in [r for r in self.running if r.request_id in ids]:
            self._finish(req, "abort")

    def _run_deferred(self) -> None:
        with self._lock:
            todo = list(self._deferred)
        for item in todo:
            if not item.ready():
                continue
            with self._lock:
                self._deferred.remove(item)
            try:
                item.future.set_result(item.run())
            except Exception as exc:  # the caller's future carries the refusal; the loop goes on
                item.future.set_exception(exc)

    def _admit(self) -> list[ServeRequest]:
        admitted: list[ServeRequest] = []
        with self._lock:
            if any(d.blocks_admission for d in self._deferred):
                return admitted
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if not self._allocate(req):
                break  # first come, first served: the head waits, so do the ones behind it
            self.waiting.popleft()
            req.status = "running"
            req.t_admitted = time.perf_counter()
            self.running.append(req)
            admitted.append(req)
        if admitted:
            self._prefill(admitted)
        return admitted

    def _growth(self, req: ServeRequest) -> int:
        """Blocks ``req`` still needs to reach its last token (prompt + max_tokens - 1 tokens cached)."""
        total = cdiv(len(req.prompt) + req.max_tokens - 1, self.block_size)
        return total - max(len(req.block_table), cdiv(len(req.prompt), self.block_size))

    def _allocate(self, req: ServeRequest) -> bool:
        """Give ``req`` its block table if the pool can hold it and every running request to the end."""
        if self.mode == "blocks":
            pc = self._prefix_cache
            probe = pc.lookup(req.prompt, req.cache_salt)
            free_hits = sum(1 for b in probe.hit_block_ids if pc.ref_count(b) == 0)
            new = cdiv(len(req.prompt), self.block_size) - len(probe.hit_block_ids)
            reserved = sum(self._growth(r) for r in self.running)
            if new + free_hits + self._growth(req) + reserved > pc.num_free_blocks:
                return False
            res = pc.allocate(req.request_id, req.prompt, cache_salt=req.cache_salt)
            req.block_table = list(res.block_table)
            req.cache_n = res.num_cached_tokens
            self.counters.prefix_cache_queries += len(req.prompt)
            self.counters.prefix_cache_hits += req.cache_n
            return True
        if self.mode == "off":
            need = cdiv(len(req.prompt) + req.max_tokens - 1, self.block_size)
            if need > len(self._free_off):
                return False
            req.block_table = [self._free_off.popleft() for _ in range(need)]
            req.cache_n = 0
            return True
        assert self.slot_server is not None
        if req.id_slot >= 0 and self.slot_busy(req.id_slot):
            return False
        if len(self.running) >= self.n_slots:
            return False
        try:
            rec = self.slot_server.start(
                req.prompt,
                max_tokens=req.max_tokens,
                generated=[0] * req.max_tokens,  # the real tokens are loaded back at the end
                id_slot=req.id_slot,
                cache_prompt=req.cache_prompt,
                request_id=req.request_id,
            )
        except SlotBusyError:
            return False
        req.slot_id = rec.slot_id
        req.cache_n = rec.cache_n
        req.block_table = self.slot_blocks(rec.slot_id)
        self.counters.prefix_cache_queries += len(req.prompt)
        self.counters.prefix_cache_hits += req.cache_n
        return True

    def _prefill(self, batch: list[ServeRequest]) -> None:
        """The admitted requests' prompts (what the cache did not hold) in one packed forward pass."""
        eng = self.engine
        news = [r.prompt[r.cache_n :] for r in batch]
        starts = [r.cache_n for r in batch]
        logits = eng.model.prefill_batch(news, starts, eng.pool, self._tables(batch), impl=eng.attention)
        picks = torch.argmax(logits, dim=-1).tolist()
        now = time.perf_counter()
        for req, pick in zip(batch, picks, strict=True):
            self.counters.prompt_tokens += len(req.prompt)
            req.t_first_token = now
            self.counters.ttft_seconds.append(now - req.t_arrival)
            self._emit(req, eng.model.output_ids[pick])

    @staticmethod
    def _tables(batch: list[ServeRequest]) -> torch.Tensor:
        """The batch's block tables as one int tensor, short rows padded with block 0 (never read)."""
        width = max(len(r.block_table) for r in batch)
        tables = torch.zeros((len(batch), width), dtype=torch.int32)
        for i, req in enumerate(batch):
            tables[i, : len(req.block_table)] = torch.tensor(req.block_table, dtype=torch.int32)
        return tables

    def _decode(self, batch: list[ServeRequest]) -> None:
        eng = self.engine
        tokens, positions = [], []
        for req in batch:
            last = req.output[-1]
            if self.mode == "blocks":
                self._prefix_cache.append(req.request_id, [last])  # never refused: the growth was reserved
                req.block_table = list(self._prefix_cache.block_table(req.request_id))
            tokens.append(last)
            positions.append(len(req.prompt) + len(req.output) - 1)
        logits = eng.model.decode_batch(tokens, positions, eng.pool, self._tables(batch), impl=eng.attention)
        picks = torch.argmax(logits, dim=-1).tolist()
        self.counters.decode_steps += 1
        self.counters.decoded_sequences += len(batch)
        for req, pick in zip(batch, picks, strict=True):
            self._emit(req, eng.model.output_ids[pick])

    def _emit(self, req: ServeRequest, token: int) -> None:
        req.output.append(token)
        self.counters.generation_tokens += 1
        if req.on_token is not None:
            req.on_token(req, token)

    def _finish(self, req: ServeRequest, reason: str) -> None:
        self.running.remove(req)
        if self.mode == "blocks":
            self._prefix_cache.free(req.request_id)
        elif self.mode == "off":
            self._free_off.extend(req.block_table)
        else:
            assert self.slot_server is not None
            self.slot_server.finish(req.request_id)
            # the slot holds what the engine really computed: the prompt and every sampled token but the last
            self.slot_server.load_tokens(req.slot_id, req.prompt + req.output[:-1])
        self._end(req, reason)

    def _end(self, req: ServeRequest, reason: str) -> None:
        req.status = "cancelled" if reason == "abort" else "finished"
        req.finish_reason = reason
        req.t_finished = time.perf_counter()
        if reason == "abort":
            self.counters.request_aborted += 1
        else:
            self.counters.request_success += 1
        if req.on_finish is not None:
            req.on_finish(req)

    # ------------------------------------------------------------------ control actions (scheduler's thread)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; only when no request holds blocks (vLLM refuses otherwise too)."""
        if self.running:
            return False
        if self.mode == "blocks":
            self.engine.prefix_cache = PrefixCache(self.num_blocks, self.block_size)
        elif self.mode == "slot":
            assert self.slot_server is not None
            for i in range(self.n_slots):
                self.slot_server.erase(i)
        return True

    def slot_shape(self) -> ModelShape:
        """The slot file shape of this engine's KV (its dtype must be float16 or float32)."""
        c = self.engine.model.config
        dtype = _SLOT_DTYPES.get(c.torch_dtype)
        if dtype is None:
            raise InvalidArgumentError(f"slot files hold float16 or float32 KV; this model is {c.dtype}")
        return ModelShape(c.num_layers, c.num_kv_heads, c.head_dim, dtype)

    def _slot_kv(self, slot_id: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The K/V of the slot's first ``n`` tokens, as (layers, n, kv_heads, head_dim) arrays."""
        pool = self.engine.pool
        flat = torch.tensor(self.slot_blocks(slot_id), dtype=torch.int64)
        keys = pool.keys[:, flat].flatten(1, 2)[:, :n]
        values = pool.values[:, flat].flatten(1, 2)[:, :n]
        return keys.cpu().numpy().copy(), values.cpu().numpy().copy()

    def save_slot(self, slot_id: int, filename: str, directory: str) -> dict[str, object]:
        """Write slot ``slot_id``'s tokens and real K/V to ``directory/filename`` (slot must be idle)."""
        server = self._slot_server_or_refuse()
        tokens = server.slot_tokens(slot_id)
        if self.slot_busy(slot_id):
            raise SlotBusyError(f"slot {slot_id} is busy; save it when idle")
        shape = self.slot_shape()
        keys, values = self._slot_kv(slot_id, len(tokens))
        n_bytes = write_slot_file(directory, filename, SlotData(shape, tokens, keys, values))
        return {"id_slot": slot_id, "filename": filename, "n_saved": len(tokens), "n_written": n_bytes}

    def restore_slot(self, slot_id: int, filename: str, directory: str) -> dict[str, object]:
        """Load a slot file's tokens and K/V into idle slot ``slot_id``; a refused file changes nothing."""
        server = self._slot_server_or_refuse()
        server.slot_tokens(slot_id)  # validates the id
        if self.slot_busy(slot_id):
            raise SlotBusyError(f"slot {slot_id} is busy; restore it when idle")
        shape = self.slot_shape()
        data = read_slot_file(directory, filename, shape)
        n = data.n_tokens
        if n > self.engine.max_model_len:
            raise InvalidArgumentError(
                f"the file holds {n} tokens but a slot holds {self.engine.max_model_len}"
            )
        pool = self.engine.pool
        blocks = self.slot_blocks(slot_id)
        for p0 in range(0, n, self.block_size):
            b, m = blocks[p0 // self.block_size], min(self.block_size, n - p0)
            pool.keys[:, b, :m] = torch.from_numpy(data.keys[:, p0 : p0 + m]).to(pool.keys)
            pool.values[:, b, :m] = torch.from_numpy(data.values[:, p0 : p0 + m]).to(pool.values)
        server.load_tokens(slot_id, data.tokens)
        return {"id_slot": slot_id, "filename": filename, "n_restored": n, "n_read": slot_file_size(shape, n)}

    def erase_slot(self, slot_id: int) -> dict[str, object]:
        server = self._slot_server_or_refuse()
        server.slot_tokens(slot_id)
        if self.slot_busy(slot_id):
            raise SlotBusyError(f"slot {slot_id} is busy; erase it when idle")
        return {"id_slot": slot_id, "n_erased": server.erase(slot_id)}

    def _slot_server_or_refuse(self) -> SlotServer:
        if self.slot_server is None:
            raise InvalidArgumentError("slot actions need --cache slot (llama-server's slots)")
        return self.slot_server
