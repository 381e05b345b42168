"""A tiny decoder-only transformer with seeded random weights, run over a paged KV pool.

Llama-shaped: token embedding, then ``num_layers`` pre-norm blocks of RMSNorm ->
grouped-query attention with rotary position embeddings (RoPE) -> residual,
RMSNorm -> SwiGLU feed-forward -> residual, and a final RMSNorm. The weights are
random (``torch.Generator`` seeded by ``config.seed``), so the replies are
nonsense, but every number is computed for real: what a prefix cache saves is
real work, and a reused prefix must give the same logits as a recomputed one.

Two simplifications keep it small and faithful to the course's tokenizer
(``kvlab.core.chat_format``), whose ids are 31-bit hashes of the text pieces:

* the embedding has ``embedding_rows`` rows and id ``t`` uses row
  ``t % embedding_rows`` (the hashing trick), so no vocabulary file is needed;
* the output head scores a fixed list of ``output_ids`` (the course's reply
  words, each one token with its leading space), so a reply's text tokenizes
  back to the same ids when it is sent again inside the history.

Keys and values live in a ``KVPool``: per layer, ``[num_blocks, block_size,
num_kv_heads, head_dim]`` tensors that ``paged_prefill`` writes through the slot
mapping and decode reads through the block table (``plan_decode`` once a step, then
``DecodePlan.attend`` in every layer: ``paged_attention``'s answer, the tables checked once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvlab.engine.attention import (
    DECODE_IMPLS,
    PREFILL_IMPLS,
    flex_views,
    paged_prefill,
    plan_decode,
    pool_tensors,
    refuse_triton_off_gpu,
    write_kv_cache,
)
from kvlab.engine.attention import slot_mapping as compute_slots
from kvlab.errors import (
    InvalidArgumentError,
    brief,
    check_choice,
    check_int,
    check_size,
    check_tokens,
)

MAX_DIM = 1 << 16
"""Largest width of the tiny model (d_model, ffn_dim, heads, embedding rows): 16x Llama-3-8B's d_model."""
MAX_LAYERS = 1024
"""Most layers of the tiny model (Llama-3-405B has 126)."""
MAX_MIB = 16 << 10
"""Most MiB of real tensor memory one ``ModelConfig``'s weights or one ``KVPool`` may take (16 GiB):
the engine runs on a laptop CPU or one GPU, and torch would otherwise try any size."""

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


# attend(q, k, v, key_cache, value_cache) -> attention output: one layer's K/V write and attention
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the tiny model; the defaults are the course's (4 layers, d_model 256, 8 query / 2 KV heads)."""

    num_layers: int = 4
    d_model: int = 256
    num_heads: int = 8
    num_kv_heads: int = 2
    ffn_dim: int = 688
    embedding_rows: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("num_layers", "d_model", "num_heads", "num_kv_heads", "ffn_dim", "embedding_rows"):
            bound = MAX_LAYERS if name == "num_layers" else MAX_DIM
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=1, maximum=bound))
        object.__setattr__(self, "seed", check_int("seed", self.seed, minimum=0, maximum=2**63 - 1))
        object.__setattr__(self, "dtype", check_choice("dtype", self.dtype, tuple(DTYPES)))
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise InvalidArgumentError(
                f"d_model {self.d_model} must split into {self.num_heads} heads of an even size (RoPE rotates pairs)"
            )
        if self.num_heads % self.num_kv_heads:
            raise InvalidArgumentError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            ok = not isinstance(value, bool) and isinstance(value, (int, float))
            if ok and isinstance(value, int):
                ok = 0 < value < 2**53  # a huge int would overflow the float the model computes with
            if not ok or not math.isfinite(value) or value <= 0:
                raise InvalidArgumentError(f"{name} must be a positive finite number, got {brief(value)}")
        params = (
            self.embedding_rows * self.d_model
            + self.num_layers * (2 * self.d_model * (self.num_heads + self.num_kv_heads) * self.head_dim
                                 + 3 * self.d_model * self.ffn_dim)
        )  # fmt: skip
        mib = params * DTYPES[self.dtype].itemsize / 2**20
        if mib > MAX_MIB:
            raise InvalidArgumentError(
                f"this model's weights would take {mib:,.0f} MiB, more than {MAX_MIB:,} (kvlab's MAX_MIB "
                "for the tiny engine); use fewer layers or narrower ones"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token takes in the pool, all layers together."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.torch_dtype.itemsize


class KVPool:
    """The paged KV cache: per layer a key and a value tensor of ``num_blocks`` blocks.

    Each layer's tensors are [num_blocks, block_size, num_kv_heads, head_dim] in ``layout``,
    as ``layer_pool`` lays one out: "auto" is head-major on the CPU (as vLLM 0.33's CPU backend
    stores its pool), token-major on a GPU; ``impl="flex"`` needs "token-major".
    """

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        device: str | torch.device = "cpu",
        *,
        layout: str = "auto",
    ):
        if not isinstance(config, ModelConfig):
            raise InvalidArgumentError(f"config must be a ModelConfig, got {type(config).__name__}")
        num_blocks = check_size("num_blocks", num_blocks, "num_blocks", minimum=1)
        block_size = check_size("block_size", block_size, "block_size", minimum=1)
        mib = num_blocks * block_size * config.kv_bytes_per_token() / 2**20
        if mib > MAX_MIB:
            raise InvalidArgumentError(
                f"a KV pool of {num_blocks:,} blocks of {block_size} tokens would take {mib:,.0f} MiB, more than "
                f"{MAX_MIB:,} (kvlab's MAX_MIB for the tiny engine); use fewer or smaller blocks"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        c = config
        self.keys, self.values = pool_tensors(
            (c.num_layers,),
            num_blocks,
            block_size,
            c.num_kv_heads,
            c.head_dim,
            dtype=c.torch_dtype,
            device=device,
            layout=layout,
            max_mib=MAX_MIB,  # counted again from the sizes: a config's own figure is not trusted
        )

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s key and value tensors (0 .. num_layers - 1; no counting from the end)."""
        i = check_int("layer", i, minimum=0, maximum=self.keys.shape[0] - 1)
        return self.keys[i], self.values[i]


def _decode_impl(impl: object, pool: KVPool) -> str:
    """``impl`` checked against the pool before a decode writes anything, so a refused step changes no slot."""
    impl = check_choice("impl", impl, DECODE_IMPLS)
    keys, values = pool.layer(0)
    refuse_triton_off_gpu(impl, keys.device)
    if impl == "flex":
        flex_views(keys, values)
    return impl


def _prefill_impl(impl: object) -> str:
    """A prefill's implementation: a prefill one as named; a decode-only one (triton, flex) prefills with "auto"."""
    impl = check_choice("impl", impl, DECODE_IMPLS)
    return impl if impl in PREFILL_IMPLS else "auto"


class TinyTransformer:
    """The model: weights drawn from ``config.seed``; ``prefill`` and ``decode`` read and write a ``KVPool``."""

    def __init__(
        self, config: ModelConfig, output_ids: Sequence[int], device: str | torch.device = "cpu"
    ) -> None:
        if not isinstance(config, ModelConfig):
            raise InvalidArgumentError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.output_ids = tuple(check_tokens("output_ids", output_ids))
        if len(set(self.output_ids)) != len(self.output_ids):
            raise InvalidArgumentError("output_ids must not repeat an id")
        self.config = config
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(config.seed)
        c = config

        def weight(*shape: int, fan_in: int) -> torch.Tensor:
            w = torch.randn(*shape, generator=gen, dtype=torch.float64) / fan_in**0.5
            return w.to(device=self.device, dtype=c.torch_dtype)

        self.embedding = weight(c.embedding_rows, c.d_model, fan_in=1)
        self.layers = [
            {
                "wq": weight(c.d_model, c.num_heads * c.head_dim, fan_in=c.d_model),
                "wk": weight(c.d_model, c.num_kv_heads * c.head_dim, fan_in=c.d_model),
                "wv": weight(c.d_model, c.num_kv_heads * c.head_dim, fan_in=c.d_model),
                "wo": weight(c.num_heads * c.head_dim, c.d_model, fan_in=c.num_heads * c.head_dim),
                "w_gate": weight(c.d_model, c.ffn_dim, fan_in=c.d_model),
                "w_up": weight(c.d_model, c.ffn_dim, fan_in=c.d_model),
                "w_down": weight(c.ffn_dim, c.d_model, fan_in=c.ffn_dim),
            }
            for _ in range(c.num_layers)
        ]
        self.lm_head = weight(len(self.output_ids), c.d_model, fan_in=c.d_model)
        half = c.head_dim // 2
        self.inv_freq = 1.0 / (
            c.rope_theta ** (torch.arange(half, dtype=torch.float64, device=self.device) / half)
        )

    # ------------------------------------------------------------------ pieces

    def _rms_norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.config.norm_eps)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate each (i, i + half) pair of every head by position * inv_freq[i] (the rotate-half form)."""
        angles = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        cos = angles.cos().to(x.dtype)[:, None, :]
        sin = angles.sin().to(x.dtype)[:, None, :]
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    def _rows(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding[tokens % self.config.embedding_rows]

    def _layers(
        self, ids: torch.Tensor, positions: torch.Tensor, pool: KVPool, attend: Attend
    ) -> torch.Tensor:
        """Every layer over the packed new tokens; ``attend`` writes K/V and attends as its caller needs."""
        c = self.config
        n = ids.shape[0]
        h = self._rows(ids)
        for i, w in enumerate(self.layers):
            x = self._rms_norm(h)
            q = self._rope((x @ w["wq"]).view(n, c.num_heads, c.head_dim), positions)
            k = self._rope((x @ w["wk"]).view(n, c.num_kv_heads, c.head_dim), positions)
            v = (x @ w["wv"]).view(n, c.num_kv_heads, c.head_dim)
            key_cache, value_cache = pool.layer(i)
            attn = attend(q, k, v, key_cache, value_cache)
            h = h + attn.reshape(n, c.num_heads * c.head_dim) @ w["wo"]
            x = self._rms_norm(h)
            h = h + (torch.nn.functional.silu(x @ w["w_gate"]) * (x @ w["w_up"])) @ w["w_down"]
        return h

    def _forward(
        self, tokens: list[int], start: int, pool: KVPool, block_table: torch.Tensor, impl: str, decode: bool
    ):
        n = len(tokens)
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        positions = torch.arange(start, start + n, device=self.device)
        table = block_table.to(device=self.device, dtype=torch.int32)
        seq_lens = torch.tensor([start + n], dtype=torch.int32, device=self.device)
        query_lens = torch.tensor([n], dtype=torch.int32, device=self.device)
        slots = compute_slots(table, positions, pool.block_size) if decode else None
        # the step's tables, checked once for every layer (vLLM builds its attention metadata once a step)
        plan = plan_decode(table[None, :], seq_lens, pool.layer(0)[0]) if decode else None

        def attend(q, k, v, key_cache, value_cache):
            if plan is not None:
                write_kv_cache(k, v, key_cache, value_cache, slots)
                return plan.attend(q, key_cache, value_cache, impl=impl)
            return paged_prefill(
                q, k, v, key_cache, value_cache, table[None, :], seq_lens, query_lens, impl=impl
            )

        h = self._layers(ids, positions, pool, attend)
        return self._rms_norm(h[-1]) @ self.lm_head.T

    # ------------------------------------------------------------------ public

    def _check_call(self, tokens: object, start: object, pool: object, block_table: object) -> list[int]:
        toks = check_tokens("tokens", tokens)
        check_int("start", start, minimum=0)
        if not isinstance(pool, KVPool):
            raise InvalidArgumentError(f"pool must be a KVPool, got {type(pool).__name__}")
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 1:
            raise InvalidArgumentError("block_table must be a 1-D tensor of block ids")
        if (start + len(toks)) > block_table.shape[0] * pool.block_size:  # type: ignore[operator]
            raise InvalidArgumentError(
                f"positions up to {start + len(toks)} do not fit a block table of {block_table.shape[0]} blocks "
                f"of {pool.block_size} tokens"
            )
        return toks

    @torch.inference_mode()
    def prefill(
        self,
        tokens: Sequence[int],
        start: int,
        pool: KVPool,
        block_table: torch.Tensor,
        *,
        impl: str = "auto",
    ) -> torch.Tensor:
        """Compute ``tokens`` at positions ``start..``, whose first ``start`` positions are cached already.

        Writes their K/V into the pool and returns the logits after the last one
        (over ``output_ids``).
        """
        toks = self._check_call(tokens, start, pool, block_table)
        return self._forward(toks, start, pool, block_table, _prefill_impl(impl), decode=False)

    @torch.inference_mode()
    def decode(
        self, token: int, position: int, pool: KVPool, block_table: torch.Tensor, *, impl: str = "auto"
    ) -> torch.Tensor:
        """One decode step: ``token`` at ``position`` attends over the cache through one ``DecodePlan`` for every layer."""
        toks = self._check_call([token], position, pool, block_table)
        return self._forward(toks, position, pool, block_table, _decode_impl(impl, pool), decode=True)

    @torch.inference_mode()
    def decode_batch(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        pool: KVPool,
        block_tables: torch.Tensor,
        *,
        impl: str = "auto",
    ) -> torch.Tensor:
        """One decode step for many sequences in ONE forward pass (continuous batching).

        Sequence ``s`` feeds ``tokens[s]`` at ``positions[s]``; row ``s`` of
        ``block_tables`` (int, ``[num_seqs, max_blocks]``, padded with any valid
        id) names its blocks. Every layer runs one matmul over the whole batch
        and one ``DecodePlan.attend`` over all sequences (the step's one plan). Returns logits
        ``[num_seqs, len(output_ids)]``.
        """
        toks = check_tokens("tokens", tokens)
        if not isinstance(positions, Sequence) or len(positions) != len(toks):
            raise InvalidArgumentError(f"positions must be a list of {len(toks)} positions, one per token")
        pos = [check_int(f"positions[{i}]", p, minimum=0) for i, p in enumerate(positions)]
        if not isinstance(pool, KVPool):
            raise InvalidArgumentError(f"pool must be a KVPool, got {type(pool).__name__}")
        if not isinstance(block_tables, torch.Tensor) or tuple(block_tables.shape[:1]) != (len(toks),):
            raise InvalidArgumentError(
                f"block_tables must be a [{len(toks)}, max_blocks] tensor of block ids"
            )
        if block_tables.dim() != 2 or max(pos) >= block_tables.shape[1] * pool.block_size:
            raise InvalidArgumentError(
                f"positions up to {max(pos)} do not fit block tables of {block_tables.shape[-1]} blocks "
                f"of {pool.block_size} tokens"
            )
        return self._forward_batch(toks, pos, pool, block_tables, _decode_impl(impl, pool))

    @torch.inference_mode()
    def prefill_batch(
        self,
        prompts: Sequence[Sequence[int]],
        starts: Sequence[int],
        pool: KVPool,
        block_tables: torch.Tensor,
        *,
        impl: str = "auto",
    ) -> torch.Tensor:
        """Prefill several sequences in ONE forward pass: their new tokens packed, as vLLM batches prefills.

        Sequence ``s`` computes ``prompts[s]`` at positions ``starts[s]..`` (its first
        ``starts[s]`` tokens are cached already) in the blocks of row ``s`` of
        ``block_tables``. Each layer runs one matmul over all the new tokens and one
        ``paged_prefill`` call. Returns the logits after each sequence's last token,
        ``[num_seqs, len(output_ids)]``.
        """
        if not isinstance(prompts, Sequence) or not prompts or len(starts) != len(prompts):
            raise InvalidArgumentError("prompts must be a non-empty list of token lists, with one start each")
        if not isinstance(block_tables, torch.Tensor) or block_tables.dim() != 2:
            raise InvalidArgumentError("block_tables must be a [num_seqs, max_blocks] tensor of block ids")
        if block_tables.shape[0] != len(prompts):
            raise InvalidArgumentError(f"block_tables needs one row per sequence ({len(prompts)})")
        toks = [
            self._check_call(p, s, pool, block_tables[i])
            for i, (p, s) in enumerate(zip(prompts, starts, strict=True))
        ]
        return self._prefill_batch(toks, [int(s) for s in starts], pool, block_tables, _prefill_impl(impl))

    def _prefill_batch(
        self, prompts: list[list[int]], starts: list[int], pool: KVPool, block_tables: torch.Tensor, impl: str
    ) -> torch.Tensor:
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=self.device)
        pos = torch.cat(
            [torch.arange(s, s + len(p), device=self.device) for p, s in zip(prompts, starts, strict=True)]
        )
        tables = block_tables.to(device=self.device, dtype=torch.int32)
        query_lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32, device=self.device)
        seq_lens = torch.tensor([s + len(p) for p, s in zip(prompts, starts, strict=True)], dtype=torch.int32,
                                device=self.device)  # fmt: skip
        last = torch.cumsum(query_lens.to(torch.int64), 0) - 1

        def attend(q, k, v, key_cache, value_cache):
            return paged_prefill(q, k, v, key_cache, value_cache, tables, seq_lens, query_lens, impl=impl)

        h = self._layers(ids, pos, pool, attend)
        return self._rms_norm(h[last]) @ self.lm_head.T

    def _forward_batch(
        self, tokens: list[int], positions: list[int], pool: KVPool, block_tables: torch.Tensor, impl: str
    ) -> torch.Tensor:
        n = len(tokens)
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)
        tables = block_tables.to(device=self.device, dtype=torch.int32)
        seq_lens = (pos + 1).to(torch.int32)
        bs = pool.block_size
        rows = torch.arange(n, device=self.device)
        slots = tables.to(torch.int64)[rows, pos // bs] * bs + pos % bs
        plan = plan_decode(tables, seq_lens, pool.layer(0)[0])  # checked once for every layer

        def attend(q, k, v, key_cache, value_cache):
            write_kv_cache(k, v, key_cache, value_cache, slots)
            return plan.attend(q, key_cache, value_cache, impl=impl)

        h = self._layers(ids, pos, pool, attend)
        return self._rms_norm(h) @ self.lm_head.T
