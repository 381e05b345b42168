"""SGLang's real ``RadixCache``, driven by kvlab's radix replay ops.

    python tools/conformance/sglang_harness.py --fetch     # pip download + unpack (once)

The real code runs from the unpacked wheel: ``sglang/srt/mem_cache/radix_cache.py``
(``RadixCache``, ``RadixKey``, ``TreeNode``), ``base_prefix_cache.py`` (the
params/result classes), ``evict_policy.py`` and ``utils.py`` (the LRU strategy
and ``get_eviction_strategy``), ``events.py`` (the KV-event recorder, disabled
as by default) and ``cache_init_params.py``. Every other sglang module is a
stub (see ``stubload.py``). The cache is built as the server builds it for the
default configuration: ``CacheInitParams(disable=False, page_size=...,
eviction_policy="lru")``, with a fake ``token_to_kv_pool_allocator`` (it hands
out slot numbers and records what ``free_segment`` gets back) and no
``req_to_token_pool`` (only the request-level helpers, not used here, read it).

Ops map to the public API: ``insert`` -> ``insert(InsertParams(key=RadixKey(...),
value=slots))``, whose ``prefix_len`` is the record's; ``match`` ->
``match_prefix(MatchPrefixParams(key=...))``, keeping ``last_device_node`` for
``lock`` -> ``inc_lock_ref(node)`` and ``unlock`` -> ``dec_lock_ref(node)``;
``evict`` -> ``evict(EvictParams(num_tokens=n))``. The evicted runs are the
tokens of the slots the cache handed back to the allocator, one
``free_segment`` call per removed leaf, in order.

**The clock.** ``TreeNode`` and the match/insert walks stamp
``time.monotonic()``, and LRU eviction orders leaves by those stamps. Two
readings can be equal (a coarse clock, or a fast machine); the heap then breaks
the tie by the iteration order of a ``set`` of nodes, which follows memory
addresses, so eviction order is not reproducible. The harness therefore gives
``radix_cache`` a ``time`` whose ``monotonic()`` is a counter that goes up by one
per reading (``perf_counter`` and the rest stay real): the order of the stamps
is the order of the readings, exactly what a clock that never ties gives.
``--real-clock`` runs with the real clock instead, to see whether ties happen.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import types
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stubload import SourceLoader, cache_dir, fetch_wheel  # noqa: E402

VERSION = "0.5.23"  # the newest on PyPI when this harness was written
REAL_MODULES = (
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.events",
    "sglang.srt.mem_cache.evict_policy",
    "sglang.srt.mem_cache.utils",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.radix_cache",
)


def source_dir() -> Path:
    return cache_dir() / f"sglang-{VERSION}"


def available() -> bool:
    """True when the unpacked wheel is in the cache folder."""
    return (source_dir() / ".complete").exists()


def fetch() -> Path:
    return fetch_wheel("sglang", VERSION, source_dir())


def _ceil_align(x: int, n: int) -> int:
    """``sglang.srt.utils.common.ceil_align`` (that module imports the whole server)."""
    return (x + n - 1) // n * n


def _overrides() -> dict[str, dict[str, Any]]:
    return {"sglang.srt.utils.common": {"ceil_align": _ceil_align}}


class Sglang:
    """The loaded real modules."""

    def __init__(self) -> None:
        import importlib

        SourceLoader("sglang", source_dir(), REAL_MODULES, _overrides()).install()
        self.radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        self.base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
        self.params = importlib.import_module("sglang.srt.mem_cache.cache_init_params")
        self.real_time = self.radix.time


_SGLANG: Sglang | None = None


def load() -> Sglang:
    """Import the real modules once per process."""
    global _SGLANG
    if _SGLANG is None:
        if not available():
            raise FileNotFoundError(
                f"SGLang {VERSION} is not unpacked in {source_dir()}: run "
                "`python tools/conformance/sglang_harness.py --fetch`"
            )
        _SGLANG = Sglang()
    return _SGLANG


class CountingClock(types.SimpleNamespace):
    """A stand-in for the ``time`` module: ``monotonic()`` counts up by one per reading."""

    def __init__(self) -> None:
        ticks = itertools.count(1)
        super().__init__(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
        self.monotonic = lambda: float(next(ticks))


class FakeAllocator:
    """``token_to_kv_pool_allocator``: slot numbers for inserts; records each ``free_segment``."""

    device = "cpu"

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.next_slot = 0
        self.token_of: dict[int, int] = {}
        self.freed: list[list[int]] = []

    def alloc(self, tokens: list[int]) -> Any:
        slots = list(range(self.next_slot, self.next_slot + len(tokens)))
        self.next_slot += len(tokens)
        self.token_of.update(zip(slots, tokens, strict=True))
        return self.torch.tensor(slots, dtype=self.torch.int64)

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        self.freed.append([int(i) for i in indices])

    def free(self, indices: Any) -> None:
        self.freed.append([int(i) for i in indices])


class RealRadixReplay:
    """Apply kvlab radix replay ops to a real ``RadixCache``; records in kvlab's format."""

    def __init__(self, config: dict[str, Any], *, real_clock: bool = False) -> None:
        import torch

        self.s = load()
        self.s.radix.time = self.s.real_time if real_clock else CountingClock()
        self.page_size = config.get("page_size", 1)
        self.allocator = FakeAllocator(torch)
        params = self.s.params.CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=self.allocator,
            page_size=self.page_size,
        )
        self.cache = self.s.radix.RadixCache(params)
        self.handles: dict[str, Any] = {}

    def _key(self, op: dict[str, Any]) -> Any:
        return self.s.radix.RadixKey(array("q", op["tokens"]), op.get("extra_key"))

    def apply(self, op: dict[str, Any]) -> dict[str, Any]:
        base = self.s.base
        name = op["op"]
        record: dict[str, Any] = {"op": name}
        if name == "insert":
            key = self._key(op)
            value = self.allocator.alloc(list(op["tokens"])[: len(key.page_aligned(self.page_size))])
            record["prefix_len"] = self.cache.insert(base.InsertParams(key=key, value=value)).prefix_len
        elif name == "match":
            result = self.cache.match_prefix(base.MatchPrefixParams(key=self._key(op)))
            if op.get("as") is not None:
                self.handles[op["as"]] = result.last_device_node
            record["matched_len"] = result.device_prefix_len
        elif name == "lock":
            self.cache.inc_lock_ref(self.handles[op["node"]])
        elif name == "unlock":
            self.cache.dec_lock_ref(self.handles[op["node"]])
        else:
            self.allocator.freed = []
            result = self.cache.evict(base.EvictParams(num_tokens=op["num_tokens"]))
            record["evicted_tokens"] = result.num_tokens_evicted
            record["evicted"] = [[self.allocator.token_of[s] for s in run] for run in self.allocator.freed]
        record["evictable_size"] = self.cache.evictable_size()
        record["protected_size"] = self.cache.protected_size()
        record["tree"] = self.tree()
        return record

    def tree(self) -> dict[str, Any]:
        """The tree as kvlab's replay prints it: key, lock_ref, extra_key when set, children in dict order."""

        def convert(node: Any) -> dict[str, Any]:
            out: dict[str, Any] = {"key": [int(t) for t in node.key], "lock_ref": node.lock_ref}
            if node.key.extra_key is not None:
                out["extra_key"] = node.key.extra_key
            out["children"] = [convert(child) for child in node.children.values()]
            return out

        return convert(self.cache.root_node)

    def alive(self, handle: str) -> bool:
        """Whether the node behind ``handle`` is still in the tree (evicted leaves are unlinked)."""
        node = self.handles[handle]
        while node is not self.cache.root_node:
            parent = node.parent
            if parent is None or all(child is not node for child in parent.children.values()):
                return False
            node = parent
        return True


def replay(
    config: dict[str, Any], ops: list[dict[str, Any]], *, real_clock: bool = False
) -> list[dict[str, Any]]:
    """The records the real SGLang code gives for a scenario (kvlab's replay format)."""
    real = RealRadixReplay(config, real_clock=real_clock)
    return [real.apply(op) for op in ops]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetch", action="store_true", help=f"pip download sglang=={VERSION} and unpack it")
    args = parser.parse_args(argv)
    if args.fetch:
        print(f"SGLang {VERSION} sources in {fetch()}")
    load()
    print(f"loaded SGLang {VERSION}'s RadixCache from {source_dir()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
