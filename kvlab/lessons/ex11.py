"""Lesson example 11: a slot saved to a file, restored in a new server, and what the file costs.

The lesson saved a 748-token agent prefix from llama-server's tiny model
(``POST /slots/0?action=save``: 778,060 bytes written), restored it in a fresh
server, and compared reading an 8B model's file for that prefix with recomputing
it. kvlab's save and restore are ``kvlab.server.slot_files.save_slot`` and
``restore_slot``; the arithmetic is ``offload_estimate``.
"""

from __future__ import annotations

from kvlab.errors import LIMITS, check_int, check_size
from kvlab.server.slot_files import CELL_META_BYTES, LLAMA_8B, TINY_MODEL, TOKEN_ID_BYTES, offload_estimate

LESSON_PREFIX_TOKENS = 748
LESSON_BYTES_WRITTEN = 778_060  # recorded by llama-server's save (its own header differs from kvlab's)


def arithmetic_report(n_tokens: int = LESSON_PREFIX_TOKENS, written: int = LESSON_BYTES_WRITTEN) -> list[str]:
    """The lesson's four lines: the tiny model's per-token bytes, and the 8B model's file and times."""
    n_tokens = check_size("n_tokens", n_tokens, "tokens")
    written = check_int("written", written, minimum=0, maximum=LIMITS.mib << 20)  # bytes of one file
    t = TINY_MODEL
    est = offload_estimate(n_tokens, LLAMA_8B.kv_bytes_per_token)
    return [
        f"tiny model: {t.kv_bytes_per_token} B KV + {TOKEN_ID_BYTES} B token id + {CELL_META_BYTES} B cell metadata"
        f" = {t.file_bytes_per_token} B per token",
        f"predicted {n_tokens * t.file_bytes_per_token} B + header; written {written} B",
        f"8B shape: {est.file_mib:.1f} MiB file; read at {est.read_bytes_per_s / 1e9:g} GB/s: {est.read_ms:.1f} ms",
        f"recompute on an 8-core CPU at {est.cpu_flops / 1e12:.2f} TFLOP/s peak: {est.cpu_recompute_s:.1f} s; "
        f"on an RTX 4090 at {est.gpu_efficiency:.0%} of {est.gpu_flops / 1e12:.1f} TFLOP/s: {est.gpu_recompute_ms:.1f} ms",
    ]


def on_real_server() -> list[str]:
    """Part one on a real llama-server (the tiny llama has the lesson's shape) next to kvlab, or one line.

    A 748-token prefix is processed, saved with ``/slots/0?action=save``, restored in a new server
    process and continued with 5 tokens; kvlab does the same with ``save_slot``/``restore_slot``.
    """
    import tempfile

    from kvlab.lessons.real_llama import available, missing_line, run_slot_file
    from kvlab.server.slot_files import restore_slot, save_slot
    from kvlab.server.slots import SlotServer

    if not available("llama"):
        return [missing_line("the bytes its save writes and the restored request's cache_n next to kvlab's")]
    prefix = [3 + (7 * i) % 509 for i in range(LESSON_PREFIX_TOKENS)]
    new = [3 + (1 + 7 * i) % 509 for i in range(5)]
    real = run_slot_file(prefix, new)
    with tempfile.TemporaryDirectory() as d:
        server = SlotServer(1, cache_ram_mib=0)
        server.complete(prefix, max_tokens=0)
        saved = save_slot(server, 0, "agent-prefix.bin", directory=d)
        fresh = SlotServer(1, cache_ram_mib=0)
        restored = restore_slot(fresh, 0, "agent-prefix.bin", directory=d)
        after = fresh.complete(prefix + new, max_tokens=1)
    per_token = TINY_MODEL.file_bytes_per_token
    return [
        "slot file on llama-server 0c1e57098 (real | kvlab)",
        f"  n_saved {real['n_saved']} | {saved.n_tokens}; n_restored {real['n_restored']} | {restored.n_tokens}",
        f"  n_written {real['n_written']:,} | {saved.n_bytes:,} bytes: {per_token} B per token on both; the fixed "
        f"part is {real['n_written'] - per_token * real['n_saved']} B on the server, {saved.n_bytes - per_token * saved.n_tokens} B in kvlab's own format",
        f"  after the restore: cache_n {real['cache_n']} | {after.cache_n}; prompt_n {real['prompt_n']} | {after.prompt_n}",
    ]
