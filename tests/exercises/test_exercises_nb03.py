"""Notebook 03's checkers (utilization): right answers pass, common wrong ones get a message naming the mistake."""

from __future__ import annotations

import kvlab.exercises as ex


def test_03_checkers_name_the_mistake():
    assert ex.check("03.1", 38).right
    assert "wastes 0, not 16" in ex.check("03.1", 54).message
    assert "empty slots there" in ex.check("03.1", 26).message
    assert ex.check("03.2", 7).right
    assert "16-token blocks" in ex.check("03.2", 8).message

    def paged_fill(lengths, pool_size, block_size):
        free, out = pool_size // block_size, [0, 0, 0]
        for n in lengths:
            need = -(-n // block_size)
            if need > free:
                break
            free -= need
            out = [out[0] + 1, out[1] + n, out[2] + need * block_size - n]
        return tuple(out)

    def skips_ahead(lengths, pool_size, block_size):
        free, out = pool_size // block_size, [0, 0, 0]
        for n in lengths:
            need = -(-n // block_size)
            if need <= free:
                free -= need
                out = [out[0] + 1, out[1] + n, out[2] + need * block_size - n]
        return out

    assert ex.check("03.3", paged_fill).right
    result = ex.check("03.3", skips_ahead)
    assert result.status == ex.NOT_YET and "requests" in result.message
    assert "three numbers" in ex.check("03.3", lambda lengths, pool, bs: 8).message

    def rounds_down(lengths, pool_size, block_size):
        free, out = pool_size // block_size, [0, 0, 0]
        for n in lengths:
            need = n // block_size
            if need > free:
                break
            free -= need
            out = [out[0] + 1, out[1] + n, out[2] + need * block_size - n]
        return tuple(out)

    rounded = ex.check("03.3", rounds_down).message
    assert "(8, 7533, -61)" in rounded and "negative waste" in rounded and "rounded down" in rounded
