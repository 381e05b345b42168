"""Exercises of notebook 14, real paged attention (lesson examples 2 and 10, lesson 002's "what a hit saves").

The expected answers come from ``kvlab.engine`` (slot mapping, the KV pool's
tensors, the reference attention kernel, the tiny engine's counters); nothing
here states them. torch is imported inside the checkers, so importing
``kvlab.exercises`` stays fast and works without the engine extra.
"""

from __future__ import annotations

import math
import random
from functools import cache
from typing import Any

from kvlab.errors import cdiv
from kvlab.exercises.core import NotYet, call, exercise, expect_two_whole

# exercise 14.1: a sequence's block table, the block size and the token the kernel reads
TABLE = [13, 4, 21, 8]
BLOCK = 16
POSITION = 50
# exercise 14.2: one sequence of the tiny engine's model, in 16-token blocks
SEQ_TOKENS = 1000
# exercise 14.4: the notebook's chat, one more turn
TURNS = 5
MAX_TOKENS = 8
CHAT_BLOCK = 16


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise NotYet(
            "This exercise needs torch: pip install 'kvlab[engine]', then restart the kernel."
        ) from None
    return torch


@exercise(
    "14.1",
    title="Which row does the kernel read?",
    assesses="following the paged kernel's address computation: block table entry, offset, row of the flat pool",
    minutes=4,
    answer_type="int",
    points=1,
    difficulty="intro",
    prerequisites=["02.3"],
    hints=[
        "The kernel finds token p in physical block table[p // block_size], at offset p % block_size inside it.",
        "Viewed as one long list of rows, the pool puts physical block b's offset o at row b * block_size + o.",
    ],
)
def row_read(answer: int) -> str:
    torch = _torch()
    from kvlab.engine import slot_mapping

    table = torch.tensor(TABLE, dtype=torch.int32)
    expected = int(slot_mapping(table, torch.tensor([POSITION]), BLOCK)[0])
    logical, offset = divmod(POSITION, BLOCK)
    physical = TABLE[logical]
    if answer == expected:
        return (
            f"Token {POSITION} is logical block {logical}, offset {offset}; the table sends the kernel to physical "
            f"block {physical}, row {physical} × {BLOCK} + {offset} = {expected} of the flat pool."
        )
    if answer == POSITION:
        raise NotYet(
            "That is the token's position in its sequence; in the pool it lives where its block table says."
        )
    if answer == physical:
        raise NotYet("That is the physical block; the row also counts the offset inside the block.")
    if answer == physical * BLOCK:
        raise NotYet("That is the first row of the right block; add the token's offset inside the block.")
    if answer in {b * BLOCK + offset for b in TABLE}:
        raise NotYet(
            "Right offset, wrong block: which entry of the block table holds the token's logical block?"
        )
    block, row_offset = divmod(answer, BLOCK) if isinstance(answer, int) and answer >= 0 else (-1, -1)
    if block == physical:
        raise NotYet(
            f"Right block: physical block {physical} is rows {physical * BLOCK} to {physical * BLOCK + BLOCK - 1}. "
            f"Row {answer} is offset {row_offset} inside it; which offset does token {POSITION} have in its block?"
        )
    if block in TABLE:
        raise NotYet(
            f"Row {answer} is in physical block {block}, entry {TABLE.index(block)} of the table, which holds this "
            f"sequence's tokens {TABLE.index(block) * BLOCK} to {TABLE.index(block) * BLOCK + BLOCK - 1}. "
            f"Which entry holds token {POSITION}?"
        )
    raise NotYet(
        f"Row {answer} is not in any of this sequence's blocks {TABLE}: find the table entry for token "
        f"{POSITION} first (position // block size), then the row."
    )


@exercise(
    "14.2",
    title="Bytes of KV for one sequence",
    assesses="sizing the paged KV cache: bytes per token from the model's shape, whole blocks per sequence",
    minutes=5,
    answer_type="int",
    points=2,
    difficulty="core",
    prerequisites=["14.1"],
    hints=[
        "One token stores a key and a value, in every layer, for every KV head, head_dim numbers each, "
        "4 bytes per float32 number.",
        "The tiny model: 4 layers, 2 KV heads of 32 numbers. The sequence holds whole 16-token blocks: "
        "round 1,000 up to a multiple of 16 first.",
    ],
)
def kv_bytes(answer: int) -> str:
    _torch()
    from kvlab.engine import KVPool, ModelConfig

    config = ModelConfig()
    blocks = cdiv(SEQ_TOKENS, BLOCK)
    pool = KVPool(config, num_blocks=blocks, block_size=BLOCK)  # exactly the blocks this sequence holds
    expected = pool.keys.nbytes + pool.values.nbytes
    per_token = config.kv_bytes_per_token()
    if answer == expected:
        return (
            f"{blocks} blocks × {BLOCK} slots × {per_token:,} bytes per token = {expected:,} bytes; "
            f"{blocks * BLOCK - SEQ_TOKENS} slots of the last block hold nothing yet."
        )
    if answer == SEQ_TOKENS * per_token:
        raise NotYet("That is the exact size of 1,000 tokens; the pool hands out whole 16-token blocks.")
    if answer * 2 == expected:
        raise NotYet(
            "Half of it: count both the key and the value of each token (or all 4 bytes of a float32)."
        )
    if answer * config.num_layers == expected:
        raise NotYet("That is one layer's share; every layer keeps its own keys and values.")
    if answer * config.num_kv_heads == expected:
        raise NotYet("That is one KV head's share; the model has 2 KV heads per layer.")
    if answer == expected * config.num_heads // config.num_kv_heads:
        raise NotYet(
            "The cache keeps the 2 KV heads, not the 8 query heads: that is what grouped-query attention saves."
        )
    if answer == SEQ_TOKENS * per_token * config.num_heads // config.num_kv_heads:
        raise NotYet(
            "Two slips: the cache keeps the 2 KV heads, not the 8 query heads, and it holds whole 16-token "
            "blocks, not exactly 1,000 tokens."
        )
    raise NotYet(f"{answer:,} bytes is not what a KV pool holding this sequence's blocks takes.")


@cache  # the same three batches for every try; the student's function gets copies
def _merge_cases(torch: Any, rng: random.Random | None = None) -> list[tuple[str, tuple[Any, ...], Any]]:
    """(name, (out_a, lse_a, out_b, lse_b), full attention) for a few ragged batches split at a block boundary.

    Both parts and the whole come from ``paged_attention(impl="reference")``; the
    parts' log-sum-exps are the log of each part's softmax denominator. With ``rng``, two
    more batches of random shapes are added (the grader's hidden cases).
    """
    from kvlab.engine import paged_attention
    from kvlab.engine.attention import gather_sequence

    specs = [
        ("3 sequences, 16-token blocks, 8 query / 2 KV heads", [20, 45, 129], 16, 8, 2, 1.0, 0),
        ("2 sequences, 4-token blocks, 4 query / 4 KV heads", [9, 33], 4, 4, 4, 1.0, 1),
        ("large scores (each log-sum-exp near 10^3)", [40, 70], 16, 4, 2, 300.0, 2),
    ]
    for k in range(2 if rng else 0):
        block = rng.choice([2, 4, 8, 16])
        kv_heads = rng.choice([1, 2, 4])
        lens = [rng.randint(block + 1, 6 * block) for _ in range(rng.randint(1, 4))]  # two blocks at least
        specs.append((f"hidden batch {k + 1}", lens, block, kv_heads * rng.choice([1, 2, 4]), kv_heads,
                      rng.choice([1.0, 40.0]), rng.randrange(10**6)))  # fmt: skip
    cases = []
    for name, lens, block, heads, kv_heads, q_scale, seed in specs:
        gen = torch.Generator().manual_seed(seed)
        dim = 16
        blocks = [cdiv(n, block) for n in lens]
        num_blocks = sum(blocks)
        kc = torch.randn(num_blocks, block, kv_heads, dim, generator=gen, dtype=torch.float64)
        vc = torch.randn(num_blocks, block, kv_heads, dim, generator=gen, dtype=torch.float64)
        query = torch.randn(len(lens), heads, dim, generator=gen, dtype=torch.float64) * q_scale
        order = torch.randperm(num_blocks, generator=gen).tolist()
        rows, start = [], 0
        for b in blocks:
            rows.append(order[start : start + b])
            start += b
        cut = [(b + 1) // 2 for b in blocks]  # part a: the first half of the blocks, part b: the rest
        part_a = ([r[:c] for r, c in zip(rows, cut, strict=True)], [c * block for c in cut])
        part_b = (
            [r[c:] for r, c in zip(rows, cut, strict=True)],
            [n - c * block for n, c in zip(lens, cut, strict=True)],
        )
        parts = []
        for tables, part_lens in (part_a, part_b):
            width = max(len(t) for t in tables)
            bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
            sl = torch.tensor(part_lens, dtype=torch.int32)
            out = paged_attention(query, kc, vc, bt, sl, impl="reference")
            group = heads // kv_heads
            lse = torch.stack([
                torch.logsumexp(
                    torch.einsum(
                        "hd,thd->ht", query[s],
                        gather_sequence(kc, bt[s], n).repeat_interleave(group, dim=1),
                    ) / math.sqrt(dim),
                    dim=-1,
                )
                for s, n in enumerate(part_lens)
            ])  # fmt: skip
            parts += [out, lse]
        full_tables = torch.tensor([r + [0] * (max(blocks) - len(r)) for r in rows], dtype=torch.int32)
        full = paged_attention(
            query, kc, vc, full_tables, torch.tensor(lens, dtype=torch.int32), impl="reference"
        )
        cases.append((name, tuple(parts), full))
    return cases


@exercise(
    "14.3",
    title="Merge two partial attention results",
    assesses="the online-softmax merge behind split-K decode kernels: rescaling partial results by their log-sum-exp",
    minutes=12,
    answer_type="function",
    cases=lambda rng: _merge_cases(_torch(), rng),
    points=3,
    difficulty="stretch",
    prerequisites=["14.1"],
    hints=[
        "Each part's output is already divided by its own softmax denominator, exp(lse). "
        "The whole output weights each part by its share of the total denominator.",
        "Share of part a = exp(lse_a) / (exp(lse_a) + exp(lse_b)). Subtract max(lse_a, lse_b) inside both "
        "exponentials first so that large scores cannot overflow; add [..., None] to broadcast over head_dim.",
    ],
)
def merge_partials(answer: Any, cases: list[tuple[str, tuple[Any, ...], Any]]) -> str:
    torch = _torch()
    for name, (out_a, lse_a, out_b, lse_b), full in cases:
        got = call(answer, out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone())
        if isinstance(got, tuple):
            raise NotYet(
                "Return only the merged output tensor, [num_seqs, num_heads, head_dim], not a tuple."
            )
        if not isinstance(got, torch.Tensor):
            raise NotYet(f"Return a torch tensor like out_a; got {type(got).__name__}.")
        if tuple(got.shape) != tuple(full.shape):
            raise NotYet(
                f"For {name} the merged output should have shape {tuple(full.shape)} like out_a; got {tuple(got.shape)}."
            )
        got = got.to(torch.float64)
        if not bool(torch.isfinite(got).all()):
            raise NotYet(
                f"For {name} your merge gives inf or nan: exp of a log-sum-exp near 10^3 overflows. "
                "Subtract the larger lse before exponentiating; the shares do not change."
            )
        err = float((got - full).abs().max())
        if err <= 1e-9:
            continue
        if torch.allclose(got, (out_a + out_b) / 2, atol=1e-9):
            raise NotYet(
                "A plain average treats both parts alike; weight each by how much softmax mass it holds (its exp(lse))."
            )
        wa, wb = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]
        if torch.allclose(got, (wb * out_a + wa * out_b) / (wa + wb), atol=1e-9):
            raise NotYet("The weights are swapped: part a's output goes with part a's lse.")
        raise NotYet(
            f"For {name} your merge differs from attention over the whole sequence by up to {err:.2e}."
        )
    return (
        "It equals attention over the whole sequence on every batch, large scores included: this is how a "
        "split-K kernel (one that splits a sequence's keys and values into pieces worked on in parallel, as "
        "flash-decoding does) combines its pieces; kvlab's compiled CPU kernel merges its chunks of 48 or 64 tokens and "
        "the Triton kernel its split path the same way."
    )


def _chat_counters(cache: str) -> list[Any]:
    """The notebook's chat (the lesson's system prompt) for ``TURNS`` turns, on a small model of the same engine.

    The counters do not depend on the weights: every reply is ``MAX_TOKENS``
    one-token words, so a smaller model gives the notebook's prompt sizes faster.
    """
    torch = _torch()
    from kvlab.engine import Engine, ModelConfig, run_chat
    from kvlab.engine.chat import context_needed

    small = ModelConfig(num_layers=1, d_model=16, num_heads=2, num_kv_heads=1, ffn_dim=16, embedding_rows=64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead
    try:
        engine = Engine(
            cache=cache,
            block_size=CHAT_BLOCK,
            max_model_len=context_needed(TURNS, MAX_TOKENS, 0),
            config=small,
        )
        return run_chat(engine, turns=TURNS, max_tokens=MAX_TOKENS)
    finally:
        torch.set_num_threads(threads)


@exercise(
    "14.4",
    title="Predict the next turn's cache_n",
    assesses="predicting reuse on a real engine: the slot rule (previous + max_tokens - 1) against whole cached blocks",
    minutes=6,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["10.1"],
    hints=[
        "Slot mode keeps the previous prompt and every sampled token but the last. Blocks mode caches a block "
        "once it is full, prompt or reply, and can only reuse whole blocks.",
        "Start from turn 4's line in part seven: how many tokens did the slot hold once turn 4 ended? "
        "Then ask how many of those same tokens fill whole 16-token blocks.",
    ],
)
def next_turn(answer: list[Any]) -> str:
    expect_two_whole(answer, "[cache_n in slot mode, cache_n in blocks mode]")
    slot, blocks = _chat_counters("slot"), _chat_counters("blocks")
    fourth, expected = slot[TURNS - 2], [slot[-1].cache_n, blocks[-1].cache_n]
    if answer == expected:
        return (
            f"The slot reuses turn 4's {fourth.prompt_tokens} prompt tokens and {MAX_TOKENS - 1} reply tokens: "
            f"{expected[0]}. The prefix cache holds the same tokens but hits whole blocks only: "
            f"{expected[0] // CHAT_BLOCK} × {CHAT_BLOCK} = {expected[1]}."
        )
    s, b = answer
    if s == fourth.prompt_tokens + MAX_TOKENS:
        raise NotYet(
            "Slot mode: the last sampled token was never fed back through the model, so it has no KV."
        )
    if s == fourth.prompt_tokens:
        raise NotYet("Slot mode: the reply tokens the model read back while decoding are in the slot too.")
    if s != expected[0]:
        raise NotYet(f"Slot mode: {s} is not how many tokens of turn 5's prompt the slot holds.")
    if b == expected[0]:
        raise NotYet("Blocks mode reuses whole blocks only; the partial last block is never hashed.")
    if b == fourth.prompt_tokens // CHAT_BLOCK * CHAT_BLOCK:
        raise NotYet(
            "Blocks mode: the reply's tokens fill blocks too, and a block is cached as soon as it is full."
        )
    if b % CHAT_BLOCK:
        raise NotYet("Blocks mode: a hit is always a whole number of blocks, a multiple of 16.")
    raise NotYet(f"Blocks mode: {b} tokens is not the run of full cached blocks turn 5's prompt starts with.")
