"""Captions of ``paged.*`` events: kvlab.models.paged.BlockPool (lesson examples 2-5).

Each function renders one event kind into the one-line caption a student reads; the words are
the course's, so tests and notebooks compare them exactly.
"""

from __future__ import annotations

from kvlab.core.snapshots import Event
from kvlab.views.text import block_list, describes, plural


@describes("paged.init")
def _pool_init(e: Event) -> str:
    return f"{e['num_blocks']} free blocks of {e['block_size']} slots"


@describes("paged.allocate")
def _pool_allocate(e: Event) -> str:
    reuse = f", reused {e['num_cached_tokens']:,}" if e["hit_block_ids"] else ""
    return f"allocate {e['request_id']}: {e['num_tokens']:,} tokens → blocks {block_list(e['block_table'])}{reuse}"


@describes("paged.append")
def _pool_append(e: Event) -> str:
    copy = e["copy"]
    what = f"; copy block {copy[0]} → {copy[1]} ({copy[2]} entries)" if copy else ""
    return f"append {plural(e['num_new_tokens'], 'token')} to {e['request_id']}{what}"


@describes("paged.fork")
def _pool_fork(e: Event) -> str:
    return f"fork {e['parent']} into {e['request_id']}: share blocks {block_list(e['block_table'])}"


@describes("paged.free")
def _pool_free(e: Event) -> str:
    return f"free {e['request_id']}: blocks {block_list(e['freed'])} return to the free list"
