"""The course's map: ``COURSE`` lists the seventeen notebooks in order (file names, titles, time estimates).

The start page, the instructors' page and the storage test read it; ``total_minutes()`` is the one
figure both pages state for the whole course (635 minutes, about 10.6 hours). Comparison tables
(kvlab's figures beside the lesson's and a real server's) are ``kvlab.lessons.compare.compare_table``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Notebook:
    """One notebook of the course: ``notebooks/{slug}.ipynb``."""

    number: str  # "00" .. "16"
    slug: str
    title: str
    minutes: int  # reading, running and the exercises, for a typical student
    about: str  # one line for the course map

    @property
    def filename(self) -> str:
        return f"{self.slug}.ipynb"


COURSE: tuple[Notebook, ...] = (
    Notebook("00", "00_start_here", "Start here", 10, "what the course teaches, how to run it, how exercises work"),
    Notebook("01", "01_contiguous_allocation", "Contiguous allocation", 35,
             "one region per request: internal and external fragmentation"),
    Notebook("02", "02_block_tables", "Block tables", 30,
             "16-token blocks, block tables and the slot mapping"),
    Notebook("03", "03_utilization", "Utilization", 30, "blocks from a free list: how much of the pool stores KV"),
    Notebook("04", "04_copy_on_write", "Copy-on-write", 35, "reference counts and copy-on-write for parallel sampling"),
    Notebook("05", "05_shared_system_prompt", "Shared system prompt", 35,
             "two requests share the full blocks of one system prompt"),
    Notebook("06", "06_hash_chains", "Hash chains", 35, "chained block hashes: what makes two prefixes the same"),
    Notebook("07", "07_lru_eviction", "LRU eviction", 40, "the free queue, cached free blocks and which go first"),
    Notebook("08", "08_radix_tree", "Radix tree", 45, "SGLang's radix tree: token-level matching, splits, locks"),
    Notebook("09", "09_prompt_layout", "Prompt layout", 35, "where a timestamp or a tool list goes decides the hit rate"),
    Notebook("10", "10_llama_server_cache_n", "llama-server cache_n", 35,
             "reading llama-server's cache_n and prompt_n across turns"),
    Notebook("11", "11_offload_and_slot_files", "Offload and slot files", 30,
             "KV outside the GPU: offload, and slot files across restarts"),
    Notebook("12", "12_sliding_window_checkpoints", "Sliding-window checkpoints", 40,
             "reusing a prefix with sliding-window layers: checkpoints and --swa-full"),
    Notebook("13", "13_agent_history", "Agent history", 40, "append-only, trimmed and summarised agent histories"),
    Notebook("14", "14_paged_attention", "Real paged attention", 50,
             "paged attention on real tensors: correctness, memory, block size, bandwidth"),
    Notebook("15", "15_fleet_prefix_caching", "Prefix caching at fleet scale", 50,
             "200 users, working set, timestamps, tenant salts, replicas and routing"),
    Notebook("16", "16_your_own_traffic", "Your own server, your own traffic", 60,
             "predict a server's counters from its trace, price an agent's prompts, route a fleet"),
)  # fmt: skip


def total_minutes() -> int:
    """Minutes for the whole course, this start page included: the total both the start page and the
    instructors' page state, so they cannot drift apart."""
    return sum(notebook.minutes for notebook in COURSE)
