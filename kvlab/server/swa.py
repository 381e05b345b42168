"""Prefix reuse on a sliding-window model: llama-server's SWA ring and context checkpoints (example 12).

Sliding-window layers only look at the last ``n_swa`` positions, so llama.cpp
gives them a small cache (``llama-kv-cache-iswa.cpp``): ``n_swa + n_ubatch``
cells, padded up to a multiple of 256 and capped at the context (768 cells for
window 128 at ``-c 4096``). ``--swa-full`` makes it as large as the context.
Cells are handed out from a moving head, like a ring; a taken cell may be
overwritten once its position is outside the window of everything cached
(``find_slot``: pos_max + 1 - pos >= n_swa), and overwriting a position also frees
every older one (``apply_ubatch`` keeps the held positions one unbroken run). After
a long prompt the ring holds only its last 768 positions.

To continue a cached prompt at ``n_past`` the local layers need the positions
from ``threshold = max(0, n_past - n_swa)`` on (one less when the whole prompt is
cached). llama-server's rule (``tools/server/server-context.cpp``), modelled here:

* If the ring's oldest position is at or above the threshold, the ring alone
  cannot continue there. The server looks through its **context checkpoints**
  (copies of the slot's SWA state, ``-ctxcp``/``--ctx-checkpoints``, default 32),
  newest first, for one that ends at or before ``n_past`` and starts below the
  threshold (or at 0). It restores the first such one and continues from
  ``min(n_past, max(pos_min + 1, pos_max))`` -- one less than the checkpoint's
  ``n_tokens`` -- or, with none, logs "forcing full prompt re-processing" and
  starts from 0.
* Checkpoints ending after the reuse point are erased as invalidated.
* If everything is cached, the last token is processed again (logits).

The comparisons are those of llama.cpp's current ``server-context.cpp``: the
search starts when ``pos_min >= threshold``, and the threshold is one lower when
the whole prompt is cached (``has_new_tokens``, PR 24110). Older versions used
``pos_min > threshold``. The two differ whenever the ring's oldest position equals
the threshold (after the lesson's 1,841-token prompt, reusing 1,201 tokens is
forced with ``>=`` and allowed with ``>``), and for a reuse point inside the first
``n_swa`` tokens (threshold 0), where a ring that still starts at position 0
triggers the search, and without a checkpoint ending by then the prompt is
processed from the start. The lesson's figures do not depend on it. With
``--swa-full`` the server uses a window of 0 for the threshold (``n_swa =
swa_full ? 0 : llama_model_n_swa``), so the threshold is the reuse point itself
and no search happens (checked against a real server, llama.cpp 0c1e57098).

A restored checkpoint holds only its last ``n_swa`` positions: the server's
``llama_kv_cache::state_write`` skips masked cells, although the checkpoint
records the ring's whole ``pos_min`` (the source's ``TAG_CHECKPOINTS_FIX_POS_MIN``).
``SwaRing.load`` keeps just those and places them as ``state_read_meta`` does, in
the copy's cell order from the head ``seq_rm`` left.

A new checkpoint first makes room (``create_checkpoint``): when the list is about
to be full (``-ctxcp``), checkpoints of earlier requests within
``--checkpoint-min-step`` tokens of the one kept before them are erased ("too
close"; with the default 8192 that is all of them but the first), then the oldest
go, and one at the same ``n_tokens`` is superseded.

Where checkpoints come from (same file, the prompt loop): the prompt is cut into
batches of at most ``n_batch`` tokens, and a batch also ends so that the last
``min(n_batch, 4 + n_ubatch)`` and the last ``min(n_batch, 4)`` tokens start new
batches (llama.cpp PR 20288), and where a user message starts (the chat endpoint
knows the message spans; always at the last user message, elsewhere only
``--checkpoint-min-step`` (8192) after the previous checkpoint). Before a batch is
decoded, a checkpoint of the state so far is taken when the batch starts the last
user message or a user message far enough on, or is near the end of the prompt
(fewer than ``n_ubatch`` tokens left after it). For a 1,841-token ``/completion``
prompt that gives checkpoints at 1,325 and 1,837 tokens, covering [557, 1324] and
[1069, 1836] -- the lesson's log lines.

Simplifications: one slot and one sequence; the full-attention layers are not
drawn (they keep every position); generated tokens are decoded one per step.
Checked request for request against a real llama-server by
``tools/conformance/llama_harness.py`` (``-ctxcp``, ``--checkpoint-min-step``,
``-b``/``-ub`` and ``--swa-full`` varied).

Kept as one module (just over 500 lines): the ring, the reuse test and the checkpoint rules
are one pass of the server's ``update_slots`` over the same slot state.

Every step is recorded in ``SwaSlot.history``: a ``SwaState`` (``kvlab.core.snapshots``, with
``Checkpoint`` and ``EMPTY``) and an ``Event`` of kind ``swa.init``, ``swa.reuse`` (what the
request could keep), ``swa.batch`` (one prompt batch, and the checkpoint taken before it) or
``swa.sample``; ``kvlab.views.text.swa`` words them. llama.cpp calls the ring the SWA part of
``llama_kv_cache_iswa`` and a checkpoint ``server_prompt_checkpoint``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.snapshots import EMPTY, Checkpoint, Event, HeldPositions, History, SwaState
from kvlab.errors import (
    LIMITS,
    InvalidArgumentError,
    KvlabError,
    cdiv,
    check_bool,
    check_int,
    check_size,
)
from kvlab.server.inputs import read_tokens
from kvlab.server.slots import _lcp


def swa_cache_cells(
    n_swa: int, n_ctx: int = 4096, n_ubatch: int = 512, n_seq: int = 1, *, swa_full: bool = False
) -> int:
    """Cells of llama.cpp's SWA cache: pad256(min(n_ctx, n_swa * n_seq + n_ubatch)), or n_ctx with --swa-full.

    Sizes are bounded by ``LIMITS.tokens`` and the sequences by ``LIMITS.slots``.
    """
    n_swa = check_size("n_swa", n_swa, "tokens", minimum=1)
    n_ctx = check_size("n_ctx", n_ctx, "tokens", minimum=1)
    n_ubatch = check_size("n_ubatch", n_ubatch, "tokens", minimum=1)
    n_seq = check_size("n_seq", n_seq, "slots", minimum=1)
    check_bool("swa_full", swa_full)
    if swa_full:
        return n_ctx
    need = min(n_ctx, n_swa * n_seq + n_ubatch)
    return cdiv(need, 256) * 256


@dataclass(frozen=True)
class SwaConfig:
    """Server and model settings that decide the ring and the checkpoints (llama-server defaults)."""

    n_swa: int = 128
    n_ctx: int = 4096
    n_ubatch: int = 512
    n_batch: int = 2048
    swa_full: bool = False
    ctx_checkpoints: int = 32
    checkpoint_min_step: int = 8192
    cache_prompt: bool = True

    def __post_init__(self) -> None:
        """Sizes are bounded by ``LIMITS.tokens``, the checkpoint count by ``LIMITS.count``."""
        for name, minimum in (
            ("n_swa", 1),
            ("n_ctx", 2),
            ("n_ubatch", 1),
            ("n_batch", 1),
            ("checkpoint_min_step", 0),
        ):
            object.__setattr__(self, name, check_size(name, getattr(self, name), "tokens", minimum=minimum))
        object.__setattr__(
            self, "ctx_checkpoints", check_size("ctx_checkpoints", self.ctx_checkpoints, "count", minimum=0)
        )
        check_bool("swa_full", self.swa_full)
        check_bool("cache_prompt", self.cache_prompt)
        if self.n_ubatch > self.n_batch:
            raise InvalidArgumentError(f"n_ubatch ({self.n_ubatch}) cannot exceed n_batch ({self.n_batch})")

    @property
    def cells(self) -> int:
        return swa_cache_cells(self.n_swa, self.n_ctx, self.n_ubatch, swa_full=self.swa_full)

    @property
    def makes_checkpoints(self) -> bool:
        return self.ctx_checkpoints > 0 and not self.swa_full


@dataclass(frozen=True)
class CheckpointCheck:
    """One checkpoint the server looked at, newest first, against the threshold."""

    pos_min: int
    pos_max: int
    threshold: int
    usable: bool


@dataclass(frozen=True)
class SwaRequestRecord:
    prompt_tokens: int
    common_prefix: int  # LCP of the slot's tokens and the prompt (n_past before the SWA check)
    threshold: int  # first position the local layers need to continue there
    ring_pos_min: int  # oldest position in the ring when the request arrived (-1 if empty)
    checks: tuple[CheckpointCheck, ...]
    restored: Checkpoint | None
    forced_full: bool  # "forcing full prompt re-processing"
    erased: tuple[Checkpoint, ...]
    cache_n: int
    prompt_n: int
    batches: tuple[tuple[int, int], ...]  # [start, end) of each prompt batch
    created: tuple[Checkpoint, ...]
    n_generated: int


class SwaRing(HeldPositions):
    """The SWA layers' cells, filled the way llama.cpp's ``find_slot`` fills them."""

    def __init__(self, size: int, n_swa: int) -> None:
        size = check_size("size", size, "tokens", minimum=1)
        n_swa = check_size("n_swa", n_swa, "tokens", minimum=1)
        self.cells = [EMPTY] * size
        self.head = 0
        self.n_swa = n_swa

    @property
    def used(self) -> int:
        return sum(1 for p in self.cells if p != EMPTY)

    def place(self, positions: Sequence[int]) -> None:
        """Store one ubatch (``find_slot`` then ``apply_ubatch``): each position takes the next empty cell
        or one that left the window; overwriting position p also frees every older position.

        ``apply_ubatch`` keeps "all positions between pos_min and pos_max present": when it overwrites
        cells it purges the sequence from its ``pos_min`` up to the newest position it overwrote.
        """
        positions = read_tokens("positions", positions, limit=len(self.cells), allow_empty=True)
        if not positions:
            return
        n, size = len(positions), len(self.cells)
        limit = self.pos_max + 1  # cells are masked against what was cached before this ubatch
        head = 0 if self.head > self.used + 2 * n else self.head
        idxs: list[int] = []
        tested = 0
        while len(idxs) < n:
            if tested >= size:
                raise KvlabError(f"the SWA cache ({size} cells) has no room for a ubatch of {n} tokens")
            if head >= size:
                head = 0
            p = self.cells[head]
            if p == EMPTY or limit - p >= self.n_swa:
                idxs.append(head)
            head += 1
            tested += 1
        overwritten = max((self.cells[i] for i in idxs), default=EMPTY)
        for i, pos in zip(idxs, positions, strict=True):
            self.cells[i] = pos
        if overwritten != EMPTY and self.pos_min <= overwritten:
            self.cells = [EMPTY if p != EMPTY and p <= overwritten else p for p in self.cells]
        self.head = idxs[-1] + 1

    def remove_from(self, p0: int) -> None:
        """``seq_rm(p0, end)``: free every cell at position >= p0; the head moves back to the first freed."""
        p0 = check_int("p0", p0)
        first = None
        for i, p in enumerate(self.cells):
            if p != EMPTY and p >= p0:
                self.cells[i] = EMPTY
                if first is None:
                    first = i
        if first is not None and first < self.head:
            self.head = first

    def load(self, cells: Sequence[int]) -> None:
        """Restore a checkpoint (``state_read_meta``): free the ring, then place the copy's unmasked cells.

        ``llama_kv_cache::state_write`` skips SWA-masked cells, so a checkpoint's data holds only its
        last ``n_swa`` positions, whatever ``pos_min`` it recorded (``TAG_CHECKPOINTS_FIX_POS_MIN`` in the
        server). They are read back in the copy's cell order and placed like a ubatch, from the head
        that ``seq_rm`` left (the first cell it freed, or 0 when the head is far past the used cells).
        """
        cells = read_tokens("cells", cells, limit=len(self.cells), allow_empty=True, in_range=False)
        if any(p < 0 and p != EMPTY for p in cells):
            raise InvalidArgumentError(f"cells must hold positions >= 0 or EMPTY ({EMPTY})")
        newest = max(cells, default=EMPTY)
        kept = [p for p in cells if p != EMPTY and newest - p < self.n_swa]
        self.remove_from(0)
        self.place(kept)


class SwaSlot:
    """One llama-server slot on a model with sliding-window layers; records every step in ``history``."""

    def __init__(self, config: SwaConfig | None = None) -> None:
        if config is None:
            config = SwaConfig()
        if not isinstance(config, SwaConfig):
            raise InvalidArgumentError(f"config must be a SwaConfig, got {type(config).__name__}")
        self.config = config
        self.ring = SwaRing(config.cells, config.n_swa)
        self.tokens: list[int] = []
        self.checkpoints: list[Checkpoint] = []
        self._owners: list[int] = []  # the request that created each checkpoint (``id_task``)
        self.records: list[SwaRequestRecord] = []
        self.history: History[SwaState] = History()
        self._snap(Event.of("swa.init", cells=config.cells))

    # ------------------------------------------------------------------ the request

    def complete(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = 1,
        user_starts: Sequence[int] = (),
        generated: Sequence[int] | None = None,
        cache_prompt: bool | None = None,
    ) -> SwaRequestRecord:
        """Serve one request: reuse what the rules allow, process the rest, sample ``max_tokens``.

        ``user_starts`` are the token positions where user messages start (the
        chat endpoint's message spans; empty for ``/completion``). The last sampled
        token is never cached, so with ``max_tokens=1`` the slot ends holding
        exactly the prompt.
        """
        cfg = self.config
        toks = read_tokens("prompt", prompt)
        max_tokens = check_size("max_tokens", max_tokens, "tokens")
        if cache_prompt is None:
            cache_prompt = cfg.cache_prompt
        check_bool("cache_prompt", cache_prompt)
        starts = read_tokens("user_starts", user_starts, allow_empty=True, in_range=False)
        if any(not 0 <= s < len(toks) for s in starts) or starts != sorted(set(starts)):
            raise InvalidArgumentError("user_starts must be increasing positions inside the prompt")
        if len(toks) >= cfg.n_ctx:
            raise InvalidArgumentError(f"the prompt has {len(toks)} tokens; the slot holds {cfg.n_ctx}")
        # n_predict 0 still samples one token (the limit is checked after sampling, ``process_token``);
        # it is never cached, so only the count shows it
        n_gen = min(max(max_tokens, 1), cfg.n_ctx - len(toks))
        gen = (
            list(range(1000, 1000 + n_gen))
            if generated is None
            else read_tokens("generated", generated, allow_empty=True)
        )
        if max_tokens == 0 and not gen:
            gen = [1000]  # the one token sampled and dropped: which one does not matter
        if len(gen) > n_gen or not gen:
            raise InvalidArgumentError(f"generated must hold 1 to {n_gen} tokens (max_tokens {max_tokens})")
        # The work of one request is bounded: every ubatch and every sampled token visits the ring's
        # cells, and every batch records a copy of them. Past LIMITS.total_tokens cell visits (134M,
        # about a minute of pure Python) the request is refused before anything changes.
        cells = len(self.ring.cells)
        work = (
            cdiv(len(toks), cfg.n_ubatch) + cdiv(len(toks), cfg.n_batch) + len(starts) + len(gen) + 4
        ) * cells
        if work > LIMITS.total_tokens:
            raise InvalidArgumentError(
                f"this request would visit about {work:,} ring cells ({cells:,} cells, n_ubatch {cfg.n_ubatch}, "
                f"n_batch {cfg.n_batch}), more than LIMITS.total_tokens ({LIMITS.total_tokens:,}): use larger "
                "batches, a smaller ring, or kvlab.errors.raised_limits(total_tokens=...)"
            )
        saved = (
            list(self.ring.cells),
            self.ring.head,
            list(self.tokens),
            list(self.checkpoints),
            list(self._owners),
            len(self.history),
        )
        try:
            return self._serve(toks, starts, gen, cache_prompt)
        except BaseException:  # a refusal halfway (the ring has no room) leaves the slot as it was
            self.ring.cells, self.ring.head, self.tokens, self.checkpoints, self._owners, steps = saved
            del self.history.steps[steps:]
            raise

    def _serve(
        self, toks: list[int], starts: list[int], gen: list[int], cache_prompt: bool
    ) -> SwaRequestRecord:
        cfg = self.config
        n = len(toks)
        n_past = _lcp(self.tokens, toks) if cache_prompt else 0
        lcp = n_past
        pos_next = n_past
        n_swa = 0 if cfg.swa_full else cfg.n_swa  # server-context.cpp: --swa-full keeps every position
        threshold = max(0, pos_next - n_swa - (0 if n_past < n else 1))
        ring_min = self.ring.pos_min
        checks: list[CheckpointCheck] = []
        restored = None
        forced = False
        if 0 < n_past <= len(self.tokens) and ring_min >= threshold:
            for cp in reversed(self.checkpoints):
                ok = cp.pos_max <= pos_next and (cp.pos_min < threshold or cp.pos_min == 0)
                checks.append(CheckpointCheck(cp.pos_min, cp.pos_max, threshold, ok))
                if ok:
                    restored = cp
                    break
            if restored is not None:
                self.ring.load(restored.cells)
                pos_next = min(pos_next, max(restored.pos_min + 1, restored.pos_max))
                n_past = min(pos_next, restored.n_tokens)
            else:
                forced = True
                pos_next = n_past = 0
        erased = tuple(cp for cp in self.checkpoints if cp.pos_max > pos_next)
        keep = [i for i, cp in enumerate(self.checkpoints) if cp.pos_max <= pos_next]
        self.checkpoints = [self.checkpoints[i] for i in keep]
        self._owners = [self._owners[i] for i in keep]
        if n_past == n:
            n_past -= 1
        cache_n = n_past
        self.tokens = toks[:n_past]
        self.ring.remove_from(n_past)
        self._snap(
            Event.of(
                "swa.reuse",
                common_prefix=lcp,
                threshold=threshold,
                forced_full=forced,
                restored=None if restored is None else restored.span,
                cache_n=cache_n,
            ),
            restored=restored,
        )

        batches, created = self._process_prompt(toks, starts)
        for t in gen[:-1]:  # each sampled token but the last is decoded in the next step
            self.ring.place([len(self.tokens)])
            self.tokens.append(t)
        if gen:
            self._snap(Event.of("swa.sample", n_sampled=len(gen), n_tokens=len(self.tokens)))
        rec = SwaRequestRecord(
            prompt_tokens=n,
            common_prefix=lcp,
            threshold=threshold,
            ring_pos_min=ring_min,
            checks=tuple(checks),
            restored=restored,
            forced_full=forced,
            erased=erased,
            cache_n=cache_n,
            prompt_n=n - cache_n,
            batches=tuple(batches),
            created=tuple(created),
            n_generated=len(gen),
        )
        self.records.append(rec)
        return rec

    def _process_prompt(
        self, toks: list[int], starts: list[int]
    ) -> tuple[list[tuple[int, int]], list[Checkpoint]]:
        cfg = self.config
        n = len(toks)
        user = set(starts)
        last_user = starts[-1] if starts else -1
        offsets = [min(cfg.n_batch, o) for o in (4 + cfg.n_ubatch, 4)]
        batches: list[tuple[int, int]] = []
        created: list[Checkpoint] = []
        while len(self.tokens) < n:
            do_checkpoint = cfg.makes_checkpoints
            start = len(self.tokens)
            end = start
            while end < n and end - start < cfg.n_batch:
                end += 1
                if do_checkpoint and end in user:
                    prev = self.checkpoints[-1].n_tokens if self.checkpoints else None
                    if end == last_user or prev is None or end > prev + cfg.checkpoint_min_step:
                        break
                if do_checkpoint and any(n == end + o for o in offsets):
                    break
            near_end = n < end + cfg.n_ubatch
            if end < n and start not in user and not near_end:
                do_checkpoint = False
            if self.ring.pos_min < 0:  # nothing to copy yet
                do_checkpoint = False
            if (
                do_checkpoint
                and self.checkpoints
                and not (
                    start == last_user
                    or near_end
                    or start > self.checkpoints[-1].n_tokens + cfg.checkpoint_min_step
                )
            ):
                do_checkpoint = False
            cp = None
            if do_checkpoint:  # taken before the batch is decoded, so the batch is not in it
                cp = self._create_checkpoint(start)
                created.append(cp)
            for u in range(start, end, cfg.n_ubatch):
                self.ring.place(range(u, min(end, u + cfg.n_ubatch)))
            self.tokens += toks[start:end]
            batches.append((start, end))
            self._snap(
                Event.of(
                    "swa.batch",
                    start=start,
                    end=end,
                    checkpoint=None if cp is None else (cp.pos_min, cp.pos_max, cp.n_tokens),
                ),
                batch=(start, end),
                created=cp,
            )
        return batches, created

    def _create_checkpoint(self, n_tokens: int) -> Checkpoint:
        """``create_checkpoint`` (``server-context.cpp``): make room, then copy the ring.

        While the list is about to be full, checkpoints of earlier requests that lie within
        ``checkpoint_min_step`` tokens of the checkpoint kept before them are erased ("too close to
        an earlier one"; the first one always stays), oldest first, and the scan stops as soon as
        there is room (the C++ loop tests the size on every step); then the oldest go until there
        is room; a checkpoint at the same ``n_tokens`` is superseded.
        """
        cfg = self.config
        task = len(self.records)  # the request being served
        last = -1  # n_tokens of the checkpoint kept before; the scan stops once the list has room
        i = 0
        while len(self.checkpoints) + 1 >= cfg.ctx_checkpoints and i < len(self.checkpoints):
            cp = self.checkpoints[i]
            if self._owners[i] != task and last >= 0 and cp.n_tokens <= last + cfg.checkpoint_min_step:
                del self.checkpoints[i], self._owners[i]
                continue
            last = cp.n_tokens
            i += 1
        while len(self.checkpoints) >= cfg.ctx_checkpoints:
            self.checkpoints.pop(0)
            self._owners.pop(0)
        same = [i for i, cp in enumerate(self.checkpoints) if cp.n_tokens == n_tokens]
        for i in reversed(same):
            del self.checkpoints[i], self._owners[i]
        cp = Checkpoint(self.ring.pos_min, self.ring.pos_max, n_tokens, tuple(self.ring.cells))
        self.checkpoints.append(cp)
        self._owners.append(task)
        return cp

    def _snap(self, event: Event, **kw: object) -> None:
        self.history.add(
            event,
            SwaState(tuple(self.ring.cells), self.ring.head, len(self.tokens), tuple(self.checkpoints), **kw),  # type: ignore[arg-type]
        )


def checkpoint_plan(
    n_tokens: int, config: SwaConfig | None = None, user_starts: Sequence[int] = ()
) -> list[Checkpoint]:
    """Checkpoints an empty slot creates while processing an ``n_tokens`` prompt (shorter than ``n_ctx``)."""
    n_tokens = check_size("n_tokens", n_tokens, "tokens", minimum=1)
    slot = SwaSlot(config)
    if n_tokens >= slot.config.n_ctx:
        raise InvalidArgumentError(f"the prompt has {n_tokens} tokens; the slot holds {slot.config.n_ctx}")
    return list(slot.complete(list(range(n_tokens)), max_tokens=0, user_starts=user_starts).created)


def checkpoint_usable(checkpoint: Checkpoint, n_past: int, n_swa: int) -> bool:
    """The lesson's rule: ends at or before n_past, and starts below max(0, n_past - n_swa) or at 0."""
    n_past = check_size("n_past", n_past, "tokens", minimum=0)
    n_swa = check_size("n_swa", n_swa, "tokens", minimum=1)
    if not isinstance(checkpoint, Checkpoint):
        raise InvalidArgumentError("checkpoint must be a Checkpoint")
    threshold = max(0, n_past - n_swa)
    return checkpoint.pos_max <= n_past and (checkpoint.pos_min < threshold or checkpoint.pos_min == 0)
