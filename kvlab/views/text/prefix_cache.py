"""Captions of ``prefix_cache.*`` events: kvlab.models.prefix_cache.PrefixCache (lesson examples 5, 7).

Each function renders one event kind into the one-line caption a student reads; the words are
the course's, so tests and notebooks compare them exactly.
"""

from __future__ import annotations

from kvlab.core.snapshots import Event
from kvlab.views.text import block_list, describes, plural


def _hits(e: Event) -> str:
    if not e["hit_block_ids"]:
        return "no cache hit"
    return f"hit {e['num_cached_tokens']:,} tokens in blocks {block_list(e['hit_block_ids'])}"


def _evictions(e: Event) -> str:
    if not e["evicted"]:
        return ""
    pairs = zip(e["evicted_hashes"], e["evicted"], strict=True)
    return ", evicting " + ", ".join(f"{label} from block {b}" for label, b in pairs)


@describes("prefix_cache.init")
def _cache_init(e: Event) -> str:
    null = e["null_block"]
    extra = f", block {null} reserved as the null block" if null is not None else ""
    return f"{e['num_free_blocks']} free blocks of {e['block_size']} tokens{extra}"


@describes("prefix_cache.probe")
def _cache_probe(e: Event) -> str:
    return f"probe {e['num_tokens']:,} tokens: {_hits(e)}"


@describes("prefix_cache.allocate")
def _cache_allocate(e: Event) -> str:
    return (
        f"allocate {e['request_id']} ({e['num_tokens']:,} tokens): {_hits(e)}, "
        f"new blocks {block_list(e['new_block_ids'])}{_evictions(e)}"
    )


@describes("prefix_cache.append")
def _cache_append(e: Event) -> str:
    return (
        f"append {plural(e['num_new_tokens'], 'token')} to {e['request_id']}: new blocks {block_list(e['new_block_ids'])}"
        f"{_evictions(e)}"
    )


@describes("prefix_cache.free")
def _cache_free(e: Event) -> str:
    where = []
    if e["to_front"]:
        where.append(f"{block_list(e['to_front'])} to the front")
    if e["to_back"]:
        where.append(f"{block_list(e['to_back'])} to the back")
    return f"free {e['request_id']}: " + (", ".join(where) if where else "no block became free")
