"""Notebook 06's checkers (hash chains): right answers pass, common wrong ones get a message naming the mistake."""

from __future__ import annotations

import kvlab.exercises as ex


def test_06_checkers_name_the_mistake():
    from kvlab.core.hashing import hash_block, none_hash

    assert ex.check("06.1", [1, 2]).right
    assert "parent of block 2" in ex.check("06.1", [1]).message
    assert "partial block" in ex.check("06.1", [1, 2, 3]).message
    assert "hashed before the edit" in ex.check("06.1", [0, 1, 2]).message

    def chain(tokens, block_size, chained=True):
        out, parent = [], none_hash()
        for start in range(0, len(tokens) - block_size + 1, block_size):
            parent = hash_block(parent if chained else none_hash(), tokens[start : start + block_size])
            out.append(parent)
        return out

    assert ex.check("06.2", chain).right
    assert "previous hash" in ex.check("06.2", lambda t, bs: chain(t, bs, chained=False)).message
    assert "full blocks" in ex.check("06.2", lambda t, bs: chain(t + [0] * bs, bs)).message
    assert ex.check("06.3", lambda n, bs: (n - 1) // bs * bs).right
    assert "last prompt token" in ex.check("06.3", lambda n, bs: n // bs * bs).message
