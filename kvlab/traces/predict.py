"""Predict, request by request, what a server's cache should have reported for a trace, and explain gaps.

Two models, the ones the course teaches:

``"vllm"`` (block hashing, vLLM 0.33's KVCacheManager): ``kvlab.models.prefix_cache.PrefixCache``
    over ``num_blocks`` blocks of ``block_size`` tokens. Each request is allocated (its cached run of
    whole blocks, at most ``prompt - 1`` tokens: the last-token rule), its sampled tokens but the last
    are appended (each enters the cache in the step that computes its K/V), then it is freed.
``"llama"`` (llama-server's slots at llama.cpp 0c1e57098): ``kvlab.server.slots.SlotServer`` with
    ``slots`` slots; the request's own sampled tokens are fed back, so the slot holds what the real
    slot held. When the server put a request on another slot than the model would, the model follows
    the server (the request is replayed on the reported slot) so later predictions stay meaningful,
    and the row says so.

The requests are replayed one at a time, in the trace's order: a trace of overlapping requests can
differ where the real server ran them together. What the trace does not say (the pool size, the
block size, the slot count) is taken from ``TraceSettings`` and listed in ``TraceReport.assumptions``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import LIMITS, KvlabError, OutOfBlocksError, brief, cdiv, check_choice, check_int
from kvlab.models.prefix_cache import PrefixCache
from kvlab.server.slots import DEFAULT_SLOT_PROMPT_SIMILARITY, SlotServer
from kvlab.traces.explain import Seen, explain_blocks, explain_slot, mismatch_blocks
from kvlab.traces.read import Exchange, Trace, TraceError

SERVERS = ("auto", "llama", "vllm")
VLLM_DEFAULT_BLOCK_SIZE = 16  # vLLM 0.33's --block-size default on CUDA
VLLM_METRICS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


@dataclass(frozen=True)
class TraceSettings:
    """What the trace may not say; ``None`` means "take it from the trace or assume, and say so"."""

    server: str = "auto"
    block_size: int | None = None
    num_blocks: int | None = None
    slots: int | None = None
    n_ctx: int | None = None
    slot_prompt_similarity: float = DEFAULT_SLOT_PROMPT_SIMILARITY
    cache_ram_mib: int = 0

    def __post_init__(self) -> None:
        check_choice("server", self.server, SERVERS)
        for name, limit in (("block_size", "block_size"), ("num_blocks", "num_blocks"), ("slots", "slots")):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value, minimum=1, maximum=getattr(LIMITS, limit))
        if self.n_ctx is not None:
            check_int("n_ctx", self.n_ctx, minimum=2, maximum=LIMITS.tokens)
        check_int("cache_ram_mib", self.cache_ram_mib, minimum=-1, maximum=LIMITS.mib)  # -1: no limit


@dataclass(frozen=True)
class TraceRow:
    """One request: what the server reported, what kvlab predicts, whether they agree, and why."""

    index: int
    line: int
    reported: dict[str, Any] | None
    predicted: dict[str, Any]
    match: bool | None
    explanation: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "line": self.line,
            "reported": self.reported,
            "predicted": self.predicted,
            "match": self.match,
            "explanation": self.explanation,
        }


@dataclass(frozen=True)
class TraceReport:
    server: str
    rows: tuple[TraceRow, ...]
    checkpoints: tuple[TraceRow, ...] = ()
    assumptions: tuple[str, ...] = field(default=())

    @property
    def matched(self) -> int:
        return sum(1 for r in self.rows if r.match)

    @property
    def compared(self) -> int:
        return sum(1 for r in self.rows if r.match is not None)

    def as_json(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.rows]


def _choose_server(trace: Trace, server: str) -> str:
    if server != "auto":
        return server
    llama = [e for e in trace.exchanges if e.reported is not None and e.reported.prompt_n is not None]
    return "llama" if llama and len(llama) == sum(1 for e in trace.exchanges if e.reported) else "vllm"


def _sequence(ex: Exchange) -> list[int]:
    """What the cache holds after ``ex``: the prompt and every sampled token but the last."""
    return list(ex.prompt) + list(ex.output[:-1])


def _reported_dict(ex: Exchange) -> dict[str, Any] | None:
    r = ex.reported
    if r is None:
        return None
    if r.error is not None:
        return {"error": r.error}
    out: dict[str, Any] = {"prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens}
    if r.slot_id is not None:
        out["slot"] = r.slot_id
    return out


def _match(reported: dict[str, Any] | None, predicted: dict[str, Any]) -> bool | None:
    if reported is None:
        return None
    if "error" in reported or "error" in predicted:
        return ("error" in reported) == ("error" in predicted)
    keys = [
        k
        for k in ("cached_tokens", "prompt_tokens", "slot")
        if reported.get(k) is not None and k in predicted
    ]
    if not keys or reported.get("cached_tokens") is None:
        return None
    return all(reported[k] == predicted[k] for k in keys)


# ---------------------------------------------------------------- vLLM: block hashing


def _pool_size(trace: Trace, block_size: int) -> int:
    need = sum(cdiv(len(e.prompt) + len(e.output), block_size) for e in trace.exchanges) + 1
    return min(max(need, 1), LIMITS.num_blocks)


def _predict_blocks(trace: Trace, settings: TraceSettings, notes: list[str]) -> list[TraceRow]:
    bs = settings.block_size
    if bs is None:
        bs = VLLM_DEFAULT_BLOCK_SIZE
        notes.append(
            f"block size {bs} assumed (vLLM's default): give --block-size if the server used another"
        )
    num_blocks = settings.num_blocks
    if num_blocks is None:
        num_blocks = _pool_size(trace, bs)
        notes.append(
            f"no pool size given: a pool of {num_blocks} blocks assumed, enough for every request of the trace "
            "at once, so nothing is evicted; "
            "give --num-blocks (vLLM logs 'GPU KV cache size: N tokens' at start: N / block size)"
        )
    cache = PrefixCache(num_blocks, bs)
    unbounded = PrefixCache(_pool_size(trace, bs), bs) if settings.num_blocks is not None else None
    seen: list[Seen] = []
    rows = []
    for ex in trace.exchanges:
        rid = f"r{ex.index}"
        predicted = _run_blocks(cache, rid, ex)
        no_evict = _run_blocks(unbounded, rid, ex) if unbounded is not None else None
        reported = _reported_dict(ex)
        match = _match(reported, predicted)
        why = explain_blocks(ex, predicted, seen, bs, no_evict)
        if match is False:
            why += " " + mismatch_blocks(ex, predicted, reported, seen, bs, no_evict)
        rows.append(TraceRow(ex.index, ex.line, reported, predicted, match, why))
        seen.append(Seen(ex.index, ex.cache_salt, _sequence(ex)))
    return rows


def _run_blocks(cache: PrefixCache, rid: str, ex: Exchange) -> dict[str, Any]:
    try:
        res = cache.allocate(rid, list(ex.prompt), cache_salt=ex.cache_salt)
    except OutOfBlocksError:
        return {"error": "out_of_blocks", "prompt_tokens": len(ex.prompt)}
    try:
        for token in ex.output[:-1]:
            cache.append(rid, [token])
    except OutOfBlocksError:
        pass  # the request would be preempted; its full blocks stay cached
    cache.free(rid)
    return {"prompt_tokens": len(ex.prompt), "cached_tokens": res.num_cached_tokens}


def _check_metrics(trace: Trace, rows: list[TraceRow]) -> list[TraceRow]:
    """Compare vLLM's counters between two scrapes with the requests sent between them."""
    out = []
    scrapes = [c for c in trace.checkpoints if c.metrics is not None]
    for before, after in zip(scrapes, scrapes[1:], strict=False):
        assert before.metrics is not None and after.metrics is not None
        if not all(name in before.metrics and name in after.metrics for name in VLLM_METRICS):
            continue
        if not all(math.isfinite(scrape.metrics[n]) for scrape in (before, after) for n in VLLM_METRICS):
            why = "a prefix-cache counter is NaN or infinite in one of the scrapes: nothing to compare"
            out.append(TraceRow(-1, after.line, None, {}, None, why))
            continue
        queries, hits = (after.metrics[n] - before.metrics[n] for n in VLLM_METRICS)
        between = [r for r in rows[before.after : after.after] if "cached_tokens" in r.predicted]
        predicted = {
            "queries": sum(r.predicted["prompt_tokens"] for r in between),
            "hits": sum(r.predicted["cached_tokens"] for r in between),
        }
        reported = {"queries": queries, "hits": hits}
        if queries < 0 or hits < 0:
            why = "the counters went down: the server restarted between the scrapes (a counter reset)"
            out.append(TraceRow(-1, after.line, reported, predicted, None, why))
            continue
        match = queries == predicted["queries"] and hits == predicted["hits"]
        why = (
            f"requests {before.after}..{after.after - 1}: vLLM counts every prompt token as queried "
            "and every cached one as a hit"
        )
        if not match:
            why += (
                "; the scrapes disagree with the requests between them: other clients, preempted requests "
                "(queried again), or requests not in the trace"
            )
        out.append(TraceRow(-1, after.line, reported, predicted, match, why))
    return out


# ---------------------------------------------------------------- llama-server: slots


def _slot_count(trace: Trace, settings: TraceSettings, notes: list[str]) -> tuple[int, int]:
    dumps = [c.slots for c in trace.checkpoints if c.slots]
    n_slots, n_ctx = settings.slots, settings.n_ctx
    if dumps:
        n_slots = n_slots or len(dumps[0])
        ctx = dumps[0][0].get("n_ctx")
        if n_ctx is None and type(ctx) is int and not 2 <= ctx <= LIMITS.tokens:
            line = next(c.line for c in trace.checkpoints if c.slots)
            raise TraceError(f"line {line}: slots[0].n_ctx must be between 2 and {LIMITS.tokens:,} "
                             f"(LIMITS.tokens), got {brief(ctx)}; give --n-ctx to override it")  # fmt: skip
        n_ctx = n_ctx or (ctx if type(ctx) is int and ctx >= 2 else None)
    if n_slots is None:
        seen = [e.reported.slot_id for e in trace.exchanges if e.reported and e.reported.slot_id is not None]
        n_slots = max(seen, default=0) + 1
        notes.append(f"{n_slots} slot(s) assumed from the slots the responses name: give --slots (-np)")
    if n_ctx is None:
        longest = max((len(e.prompt) + len(e.output) for e in trace.exchanges), default=1)
        n_ctx = min(max(4096, longest + 1), LIMITS.tokens)
        notes.append(f"a context of {n_ctx} tokens per slot assumed: give n_ctx (-c / -np) if it matters")
    return n_slots, n_ctx


def _predict_slots(trace: Trace, settings: TraceSettings, notes: list[str]) -> list[TraceRow]:
    n_slots, n_ctx = _slot_count(trace, settings, notes)
    if settings.cache_ram_mib == 0:
        notes.append("the RAM prompt cache is assumed off (--cache-ram 0); give cache_ram_mib to model it")
    server = SlotServer(
        n_slots,
        n_ctx=n_ctx,
        slot_prompt_similarity=settings.slot_prompt_similarity,
        cache_ram_mib=settings.cache_ram_mib,
        record=False,
    )
    rows = []
    for ex in trace.exchanges:
        if ex.id_slot >= n_slots:
            raise TraceError(
                f"line {ex.line}: the request names slot {ex.id_slot}, but {n_slots} slot(s) are modelled"
            )
        before = {s: server.slot_tokens(s) for s in range(n_slots)}
        trial = copy.deepcopy(server)
        record = _run_slot(trial, ex, ex.id_slot)
        reported = _reported_dict(ex)
        followed = None
        real_slot = ex.reported.slot_id if ex.reported else None
        if (
            record.error is None
            and real_slot is not None
            and 0 <= real_slot < n_slots
            and real_slot != record.slot_id
        ):
            followed = real_slot
            server_record = _run_slot(server, ex, real_slot)  # follow the server from here on
        else:
            server, server_record = trial, record
        predicted: dict[str, Any]
        if record.error is not None:
            predicted = {"error": record.error}
        else:
            predicted = {
                "prompt_tokens": record.prompt_tokens,
                "cached_tokens": record.cache_n,
                "slot": record.slot_id,
            }
        match = _match(reported, predicted)
        why = explain_slot(ex, record, before, followed, server_record)
        rows.append(TraceRow(ex.index, ex.line, reported, predicted, match, why))
    return rows


def _run_slot(server: SlotServer, ex: Exchange, id_slot: int):
    n_gen = max(0, min(ex.max_tokens, server.n_ctx - len(ex.prompt)))
    generated = list(ex.output[:n_gen]) if ex.output else None
    if generated is not None and not generated and n_gen:
        generated = None
    try:
        return server.complete(
            list(ex.prompt),
            max_tokens=n_gen if generated is None else len(generated),
            generated=generated,
            id_slot=id_slot,
            cache_prompt=ex.cache_prompt,
        )
    except KvlabError as exc:
        raise TraceError(f"line {ex.line}: kvlab's slot model refused this request: {exc}") from None


def _check_slot_dumps(trace: Trace, rows: list[TraceRow]) -> list[TraceRow]:
    """Each slot of a ``/slots`` dump against the last predicted request on that slot before the dump."""
    out = []
    for cp in trace.checkpoints:
        if not cp.slots:
            continue
        last: dict[int, TraceRow] = {}
        for row in rows[: cp.after]:
            slot = (row.reported or {}).get("slot", row.predicted.get("slot"))
            if isinstance(slot, int):
                last[slot] = row
        for s in cp.slots:
            sid, cache = s.get("id"), s.get("n_prompt_tokens_cache")
            if type(sid) is not int or sid not in last or type(cache) is not int:
                continue
            row = last[sid]
            predicted = {"slot": sid, "cached_tokens": row.predicted.get("cached_tokens")}
            reported = {"slot": sid, "cached_tokens": cache}
            match = predicted["cached_tokens"] == cache
            why = f"slot {sid} in GET /slots: its last task was request {row.index}"
            out.append(TraceRow(-1, cp.line, reported, predicted, match, why))
    return out


# ---------------------------------------------------------------- the entry point


def predict_trace(trace: Trace, settings: TraceSettings | None = None, **options: Any) -> TraceReport:
    """Replay ``trace`` through the model of its server; one ``TraceRow`` per request, plus checkpoints."""
    if not isinstance(trace, Trace):
        raise TraceError(f"predict_trace needs a Trace from kvlab.traces.read_trace, got {brief(trace)}")
    if settings is None:
        settings = TraceSettings(**options)
    elif options:
        raise TraceError("give either settings or keyword options, not both")
    elif not isinstance(settings, TraceSettings):
        raise TraceError(f"settings must be a TraceSettings, got {brief(settings)}")
    server = _choose_server(trace, settings.server)
    notes = list(trace.notes)
    kvlab_tokenized = {e.tokenized_by for e in trace.exchanges if e.tokenized_by.startswith("kvlab")}
    if kvlab_tokenized and trace.reported_by != "a transcript":
        notes.append(
            "some prompts were tokenized by kvlab's tokenizer: exact for kvlab serve; for another server "
            "send token ids (or ask for return_token_ids / return_tokens) so kvlab sees the server's ids"
        )
    if server == "vllm":
        rows = _predict_blocks(trace, settings, notes)
        checks = _check_metrics(trace, rows)
    else:
        rows = _predict_slots(trace, settings, notes)
        checks = _check_slot_dumps(trace, rows)
    return TraceReport(server, tuple(rows), tuple(checks), tuple(notes))
