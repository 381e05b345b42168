"""Seeded generators for scenarios and traffic.

``JavaRandom`` is a bit-exact port of ``java.util.Random`` (a 48-bit linear
congruential generator) so that lessons whose figures were produced with a
Java program (``new Random(5)``, ``Collections.shuffle(list, rnd)``) come out
the same in kvlab.
"""

from __future__ import annotations

from typing import Any

from kvlab.errors import InvalidArgumentError, brief, check_int, check_tokens

_MULTIPLIER = 0x5DEECE66D
_ADDEND = 0xB
_MASK = (1 << 48) - 1


def _to_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


class JavaRandom:
    """``java.util.Random``, bit for bit: same seed, same numbers as Java."""

    def __init__(self, seed: int) -> None:
        seed = check_int("seed", seed)
        if not -(2**63) <= seed < 2**63:
            raise InvalidArgumentError(
                f"seed must fit a Java long (-2**63 <= seed < 2**63), got {brief(seed)}"
            )
        self._seed = (seed ^ _MULTIPLIER) & _MASK

    def next_bits(self, bits: int) -> int:
        """Java's protected ``next(bits)``: the top ``bits`` bits of the next state, as a signed int."""
        bits = check_int("bits", bits)
        if not 1 <= bits <= 32:
            raise InvalidArgumentError(f"bits must be between 1 and 32, got {brief(bits)}")
        self._seed = (self._seed * _MULTIPLIER + _ADDEND) & _MASK
        return _to_int32(self._seed >> (48 - bits))

    def next_int(self, bound: int | None = None) -> int:
        """``nextInt()`` (any int) or ``nextInt(bound)``: uniform in [0, bound).

        ``bound`` is a positive Java int (at most 2**31 - 1), as in Java: a larger one could never
        pass Java's overflow test and would loop forever.
        """
        if bound is None:
            return self.next_bits(32)
        bound = check_int("bound", bound, minimum=1, maximum=2**31 - 1)
        if bound & -bound == bound:  # a power of two: take the high bits
            return (bound * self.next_bits(31)) >> 31
        while True:
            bits = self.next_bits(31)
            val = bits % bound
            if bits - val + (bound - 1) < 1 << 31:  # Java rejects draws whose int sum overflows
                return val

    def next_long(self) -> int:
        hi = self.next_bits(32)
        lo = self.next_bits(32)
        value = ((hi << 32) + lo) & 0xFFFFFFFFFFFFFFFF
        return value - (1 << 64) if value >= 1 << 63 else value

    def next_boolean(self) -> bool:
        return self.next_bits(1) != 0

    def next_double(self) -> float:
        return ((self.next_bits(26) & 0x3FFFFFF) * (1 << 27) + (self.next_bits(27) & 0x7FFFFFF)) * (
            1.0 / (1 << 53)
        )

    def shuffle(self, items: list[Any]) -> None:
        """Shuffle ``items`` in place exactly as ``Collections.shuffle(list, rnd)`` does."""
        if not isinstance(items, list):
            raise InvalidArgumentError(f"shuffle needs a list, got {type(items).__name__}")
        for i in range(len(items), 1, -1):
            j = self.next_int(i)
            items[i - 1], items[j] = items[j], items[i - 1]


def java_list_hash(values: list[int]) -> int:
    """``java.util.List.hashCode()`` of a list of Integers (31 * h + x, wrapping at 32 bits)."""
    h = 1
    for v in check_tokens("values", values, allow_empty=True, in_range=False):
        h = _to_int32(31 * h + _to_int32(v))
    return h
