"""Hostile checks of the CPU (numpy) table/length validation and the hashing fast path.

Only cases verified to fail are tests here. What held (not tests): uint8/int8/int16/int32/int64
tables and lengths, seq_lens in a different int dtype than block_tables, unsigned 16/32/64 and bool
refused, int64 extremes (2**63-1, -2**63) as lengths and as block ids in used columns (refused) and
unused columns (ignored), zero-column tables, torch._neg_view tables and lengths (and negated values
refused), transposed / strided / flipped / zero-stride expanded tables and lengths, a width of 2**40
via expand with short sequences, lengths 0 / negative / capacity / capacity+1, num_seqs 1, fp16 /
bf16 / fp64 caches, nan/inf in unwritten slots of partial last blocks (walk and compiled path: the
compiled path falls back to the walk; flex refuses), full last blocks (early return), a mix of full
and partial last blocks, a block that is one sequence's partial last block and another's full block,
the compiled decode with int16 / negated / expanded / transposed tables and bad ids only in unused
columns, paged_prefill with the same dtypes and layouts (refusals leave the cache unchanged);
block_hashes with lists and tuples (both schemes, salted), bools, numpy ints / bools / floats, huge
ints, nested and self-containing lists, int subclasses (one whose __index__ raises), ~3,200 distinct
lengths past the 1,024-entry Struct cache compared against _chain over check_tokens' plain ints, and
LIMITS.tokens and LIMITS.tokens + 1.
"""

from __future__ import annotations

import pytest
import torch

from kvlab.engine import paged_attention, paged_prefill
from kvlab.errors import InvalidArgumentError


def _cache(block_size: int = 1):
    torch.manual_seed(0)
    return torch.randn(4, block_size, 1, 4), torch.randn(4, block_size, 1, 4)


@pytest.mark.parametrize("impl", ["torch", "reference", "flex"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_huge_expanded_table_and_length_is_refused(impl, dtype):
    """seq_lens [2**62] over a (1, 2**62) expanded table: numpy's ValueError ('array is too big') escapes from _check_host_tables; should be InvalidArgumentError before any allocation."""
    k, v = _cache()
    q = torch.randn(1, 1, 4)
    table = torch.zeros(1, 1, dtype=dtype).expand(1, 2**62)
    with pytest.raises(InvalidArgumentError):
        paged_attention(q, k, v, table, torch.tensor([2**62]), impl=impl)


def test_length_near_int64_max_does_not_try_exabytes():
    """seq_lens [2**63-1] at block_size 16 over a (1, 2**59) expanded table: MemoryError (4 EiB np.arange, and lens + 15 wraps in int64); should be InvalidArgumentError."""
    k, v = _cache(16)
    q = torch.randn(1, 1, 4)
    table = torch.zeros(1, 1, dtype=torch.int64).expand(1, 2**59)
    with pytest.raises(InvalidArgumentError):
        paged_attention(q, k, v, table, torch.tensor([2**63 - 1]), impl="torch")


def test_prefill_huge_expanded_table_and_length_is_refused():
    """paged_prefill with seq_lens [2**62] over a (1, 2**62) expanded table: numpy's ValueError escapes; should be InvalidArgumentError, cache unchanged."""
    kc, vc = _cache()
    k0, v0 = kc.clone(), vc.clone()
    q, key, val = torch.randn(1, 1, 4), torch.randn(1, 1, 4), torch.randn(1, 1, 4)
    table = torch.zeros(1, 1, dtype=torch.int64).expand(1, 2**62)
    with pytest.raises(InvalidArgumentError):
        paged_prefill(q, key, val, kc, vc, table, torch.tensor([2**62]), torch.tensor([1]), impl="torch")
    assert torch.equal(kc, k0) and torch.equal(vc, v0)


def test_a_batch_whose_tables_reach_too_many_entries_is_refused_before_reading_them():
    """Five 4M-token sequences in 1-token blocks reach 20M table entries: refused by the lengths alone."""
    k, v = _cache()
    lens = torch.full((5,), 4 << 20)
    table = torch.zeros(1, 1, dtype=torch.int64).expand(5, 4 << 20)
    with pytest.raises(InvalidArgumentError, match="entries, more than the 16,777,216 one call reads"):
        paged_attention(torch.randn(5, 1, 4), k, v, table, lens, impl="torch")
