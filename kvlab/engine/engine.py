"""The tiny real engine: one request at a time, prefill then greedy decode, with a prefix cache.

Three ways to decide what a new request may reuse (``cache=``):

``"blocks"``
    vLLM's way: ``kvlab.models.prefix_cache.PrefixCache`` hashes the prompt's full
    blocks, reuses the longest cached run (at most ``prompt - 1`` tokens, in
    whole blocks), allocates the rest, and caches every block that fills up.
    ``cache_salt`` keeps tenants apart. A decoded token enters the cache (is
    ``append``-ed) only in the step that computes its K/V, so the last sampled
    token never does.
``"slot"``
    llama-server's way with one slot (``-np 1 --cache-ram 0``): the slot keeps
    the tokens of the last request -- its prompt and every sampled token but
    the last -- and the next prompt reuses their longest common prefix, token by
    token, capped at ``prompt - 1`` (see ``kvlab.server.slots``).
``"off"``
    No reuse: every prompt is computed in full on fresh blocks.

Reused tokens are not recomputed: their K/V are read from the pool where an
earlier request wrote them. ``GenerationResult`` reports the counters a server
would (``cache_n``, ``prompt_n``) and the time to first token, measured.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlab.core.chat_format import REPLY_WORDS, Tokenizer
from kvlab.engine.model import KVPool, ModelConfig, TinyTransformer
from kvlab.errors import (
    DuplicateRequestError,
    InvalidArgumentError,
    brief,
    cdiv,
    check_bool,
    check_choice,
    check_id,
    check_optional_str,
    check_size,
    check_tokens,
)
from kvlab.models.prefix_cache import PrefixCache
from kvlab.server.slots import common_prefix

CACHE_MODES = ("blocks", "slot", "off")
ATTENTIONS = ("auto", "reference", "torch", "triton")
WARM_UP_TOKENS = 256
"""Longest prompt the engine prefills once at start, so the first long request pays no one-time costs."""


@dataclass(frozen=True)
class GenerationResult:
    """One finished request: its counters, its sampled tokens and (if asked) the logits behind each."""

    request_id: str
    prompt_tokens: int
    cache_n: int
    output_tokens: tuple[int, ...]
    ttft_ms: float
    total_ms: float
    hit_block_ids: tuple[int, ...] = ()
    logits: tuple[torch.Tensor, ...] | None = None

    @property
    def prompt_n(self) -> int:
        """Prompt tokens the engine computed (llama-server's ``timings.prompt_n``)."""
        return self.prompt_tokens - self.cache_n


@dataclass(frozen=True)
class CacheState:
    """A saved copy of an engine's prefix cache (``cache="blocks"``): which blocks hold which prefixes.

    Made by ``Engine.save_cache_state`` and put back by ``Engine.restore_cache_state`` on the same
    engine only: the state names pool blocks whose K/V only that engine's pool holds.
    """

    owner: object
    prefix_cache: PrefixCache


class Engine:
    """A tiny model plus a paged KV pool, serving requests with the chosen reuse rule.

    ``max_model_len`` bounds prompt + generated tokens. The pool holds
    ``num_blocks`` blocks; by default four full-length sequences' worth in
    ``"blocks"`` mode (so earlier prompts stay cached a while), one otherwise.

    Bounds: ``max_model_len`` at most ``LIMITS.tokens``, ``block_size`` at most
    ``LIMITS.block_size``, ``num_blocks`` at most ``LIMITS.num_blocks``, and the pool's tensors at
    most ``kvlab.engine.model.MAX_MIB`` (``KVPool``).
    """

    def __init__(
        self,
        *,
        cache: str = "blocks",
        block_size: int = 16,
        max_model_len: int = 4096,
        num_blocks: int | None = None,
        config: ModelConfig | None = None,
        attention: str = "auto",
        device: str = "cpu",
        tokenizer: Tokenizer | None = None,
    ) -> None:
        cache = check_choice("cache", cache, CACHE_MODES, what="cache mode")
        block_size = check_size("block_size", block_size, "block_size", minimum=1)
        max_model_len = check_size("max_model_len", max_model_len, "tokens", minimum=2)
        blocks_per_seq = cdiv(max_model_len, block_size)
        if num_blocks is None:
            num_blocks = blocks_per_seq * (4 if cache == "blocks" else 1)
        num_blocks = check_size("num_blocks", num_blocks, "num_blocks", minimum=blocks_per_seq)
        attention = check_choice("attention", attention, ATTENTIONS)
        if config is not None and not isinstance(config, ModelConfig):
            raise InvalidArgumentError(f"config must be a ModelConfig, got {type(config).__name__}")
        if not isinstance(device, (str, torch.device)):
            raise InvalidArgumentError(
                f"device must be a string such as 'cpu' or 'cuda', got {brief(device)}"
            )
        if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
            raise InvalidArgumentError("tokenizer must be a kvlab.core.chat_format.Tokenizer")
        self.cache_mode = cache
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.attention = attention
        self.tokenizer = tokenizer or Tokenizer()
        output_ids = [self.tokenizer.encode(" " + w)[0] for w in REPLY_WORDS]
        self.model = TinyTransformer(config or ModelConfig(), output_ids, device=device)
        self.pool = KVPool(self.model.config, num_blocks, block_size, device=device)
        self.prefix_cache = PrefixCache(num_blocks, block_size) if cache == "blocks" else None
        self.slot_tokens: list[int] = []
        self._slot_table = torch.arange(blocks_per_seq, dtype=torch.int32)
        self._free = deque(range(num_blocks))
        self._next_id = 0
        self._used_ids: set[str] = set()
        self._owner = object()  # names this engine in the CacheStates it saves
        self._warm_up()

    def _warm_up(self) -> None:
        """Prefill a prompt of up to ``WARM_UP_TOKENS`` tokens and decode one step, as servers warm up at start.

        The first call of a torch kernel at a new size pays one-time costs (loading, picking BLAS
        kernels, growing the allocator); a one-token warm-up left them to the first long prefill,
        whose time to first token then measured them, not the prompt. The prompt is written into
        the first blocks of the still-empty pool; nothing refers to their contents afterwards: no
        request or cache entry exists yet.
        """
        n = min(self.max_model_len - 1, WARM_UP_TOKENS)
        table = self._table(range(cdiv(n + 1, self.block_size)))
        self.model.prefill([t % 97 for t in range(n)], 0, self.pool, table, impl=self.attention)
        self.model.decode(0, n, self.pool, table, impl=self.attention)

    # ------------------------------------------------------------------ public

    def generate(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = 8,
        cache_salt: str | None = None,
        request_id: str | None = None,
        record_logits: bool = False,
    ) -> GenerationResult:
        """Serve one request: reuse what the cache allows, prefill the rest, then sample ``max_tokens`` greedily."""
        toks = check_tokens("prompt", prompt)
        max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
        check_bool("record_logits", record_logits)
        if len(toks) + max_tokens > self.max_model_len:
            raise InvalidArgumentError(
                f"prompt ({len(toks)}) + max_tokens ({max_tokens}) exceed max_model_len {self.max_model_len}: "
                "shorten the prompt or build the Engine with a larger max_model_len"
            )
        cache_salt = check_optional_str("cache_salt", cache_salt)
        if cache_salt is not None and self.cache_mode == "slot":
            raise InvalidArgumentError("cache_salt needs cache='blocks': a llama-server slot has no salt")
        rid = self._request_id(request_id)
        start = time.perf_counter()
        table, cache_n, hits = self._admit(rid, toks, max_tokens, cache_salt)
        self._used_ids.add(rid)  # only once admitted: a refused request uses up no id
        if request_id is None:
            self._next_id = int(rid[4:]) + 1
        logits: list[torch.Tensor] = []
        out: list[int] = []
        try:
            step_logits = self.model.prefill(toks[cache_n:], cache_n, self.pool, table, impl=self.attention)
            logits.append(step_logits)
            out.append(self._sample(step_logits))
            ttft = time.perf_counter() - start
            for step in range(1, max_tokens):
                position = len(toks) + step - 1  # where the previous sampled token goes
                if self.prefix_cache is not None:
                    self.prefix_cache.append(rid, [out[-1]])
                    table = self._table(self.prefix_cache.block_table(rid))
                step_logits = self.model.decode(out[-1], position, self.pool, table, impl=self.attention)
                logits.append(step_logits)
                out.append(self._sample(step_logits))
        finally:
            self._release(rid, table, toks, out)
        return GenerationResult(
            request_id=rid,
            prompt_tokens=len(toks),
            cache_n=cache_n,
            output_tokens=tuple(out),
            ttft_ms=ttft * 1e3,
            total_ms=(time.perf_counter() - start) * 1e3,
            hit_block_ids=hits,
            logits=tuple(logits) if record_logits else None,
        )

    def decode_text(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens)

    def twin(self) -> Engine:
        """A new, empty engine built like this one: the same model (same seeded weights), pool and reuse rule.

        Requests served here are not in the twin's cache; ``run_chat`` plays one chat on several
        twins to time each turn repeatedly from the same cache state.
        """
        return Engine(
            cache=self.cache_mode,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            num_blocks=self.pool.num_blocks,
            config=self.model.config,
            attention=self.attention,
            device=str(self.model.device),
            tokenizer=self.tokenizer,
        )

    def save_cache_state(self) -> CacheState:
        """A copy of the prefix cache as it is now, for ``restore_cache_state`` on this engine.

        Only for ``cache="blocks"``: a slot's later requests overwrite its K/V in place. The pool's
        K/V are not copied, so restoring is exact as long as no request in between took (and
        overwrote) a block the saved state keeps cached, as when the pool has room to spare.
        """
        if self.prefix_cache is None:
            raise InvalidArgumentError(
                f"save_cache_state needs cache='blocks'; this engine's cache is {self.cache_mode!r}"
            )
        return CacheState(self._owner, copy.deepcopy(self.prefix_cache))

    def restore_cache_state(self, state: CacheState) -> None:
        """Put back a state saved by ``save_cache_state`` on this engine (the next request sees that cache)."""
        if not isinstance(state, CacheState):
            raise InvalidArgumentError(
                f"state must be a CacheState from save_cache_state, got {brief(state)}"
            )
        if state.owner is not self._owner:
            raise InvalidArgumentError(
                "this CacheState was saved on another engine: its blocks are not in this pool"
            )
        self.prefix_cache = copy.deepcopy(state.prefix_cache)

    # ------------------------------------------------------------------ internals

    def _request_id(self, request_id: str | None) -> str:
        """The request's id, not yet marked used (``generate`` marks it once the request is admitted)."""
        if request_id is None:
            n = self._next_id
            while f"req-{n}" in self._used_ids:
                n += 1
            return f"req-{n}"
        request_id = check_id("request_id", request_id)
        if request_id in self._used_ids:
            raise DuplicateRequestError(f"request id {request_id!r} was already used; pick a new one")
        return request_id

    @staticmethod
    def _table(block_ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(block_ids), dtype=torch.int32)

    def _admit(
        self, rid: str, toks: list[int], max_tokens: int, salt: str | None
    ) -> tuple[torch.Tensor, int, tuple[int, ...]]:
        """Decide the reuse and the block table; returns (table, cache_n, hit blocks)."""
        if self.prefix_cache is not None:
            res = self.prefix_cache.allocate(rid, toks, cache_salt=salt)
            return self._table(res.block_table), res.num_cached_tokens, res.hit_block_ids
        if self.cache_mode == "slot":
            n_past = common_prefix(self.slot_tokens, toks)
            if n_past == len(toks):  # evaluate at least one token to get logits
                n_past -= 1
            self.slot_tokens = self.slot_tokens[:n_past]
            return self._slot_table, n_past, ()
        needed = cdiv(len(toks) + max_tokens - 1, self.block_size)
        blocks = [self._free.popleft() for _ in range(needed)]
        return self._table(blocks), 0, ()

    def _release(self, rid: str, table: torch.Tensor, toks: list[int], out: list[int]) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.free(rid)
        elif self.cache_mode == "slot":
            self.slot_tokens = (
                toks + out[:-1] if out else []
            )  # the last sampled token never entered the cache
        else:
            self._free.extend(table.tolist())

    def _sample(self, logits: torch.Tensor) -> int:
        """Greedy: the output id with the highest logit (the first one on a tie)."""
        return self.model.output_ids[int(torch.argmax(logits))]
