"""Lesson example 11: a slot saved to a file, restored in a new server, and what the file costs.

The lesson saved a 748-token agent prefix from llama-server's tiny model
(``POST /slots/0?action=save``: 778,060 bytes written), restored it in a fresh
server, and compared reading an 8B model's file for that prefix with recomputing
it. kvlab's save and restore are ``kvlab.server.slot_files.save_slot`` and
``restore_slot``; the arithmetic is ``offload_estimate``. Notebook 11's cells call
the runs below: the restart in a new process, the history its stepper shows, the
refused restores, and the same sequence over HTTP.
"""

from __future__ import annotations

from kvlab.core.snapshots import History
from kvlab.errors import LIMITS, check_int, check_size
from kvlab.server.slot_files import CELL_META_BYTES, LLAMA_8B, TINY_MODEL, TOKEN_ID_BYTES, offload_estimate
from kvlab.views.slot_files import SaveRestoreState

LESSON_PREFIX_TOKENS = 748
LESSON_BYTES_WRITTEN = 778_060  # recorded by llama-server's save (its own header differs from kvlab's)


def arithmetic_report(n_tokens: int = LESSON_PREFIX_TOKENS, written: int = LESSON_BYTES_WRITTEN) -> list[str]:
    """The lesson's program, reproduced: its four lines, byte for byte (``written`` is the lesson's constant).

    The tiny model's per-token bytes, and the 8B model's file and times; the notebook labels them as the
    lesson's program, since ``written`` is what llama-server reported, not what kvlab wrote.
    """
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


# ---------------------------------------------------------------- notebook 11's runs
# The notebook's cells call these: each is one step of the lesson's sequence, run through kvlab.

FILE = "agent-prefix.bin"


def lesson_prefix() -> list[int]:
    """748 token ids standing in for the lesson's agent prefix (a system prompt with 40 tool descriptions)."""
    return list(range(5000, 5000 + LESSON_PREFIX_TOKENS))


def _check_tokens(name: str, tokens: object) -> list[int]:
    from kvlab.errors import check_tokens

    return list(check_tokens(name, tokens))


_RESTARTED = """
import json, sys
from kvlab.server.slot_files import restore_slot
from kvlab.server.slots import SlotServer

directory, filename, prompt = sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())
server = SlotServer(1, cache_ram_mib=0)  # a fresh server: its slot is empty
restored = restore_slot(server, 0, filename, directory=directory)
request = server.complete(prompt, max_tokens=2)
print(json.dumps(restored.to_json()))
print(json.dumps(dict(tokens_evaluated=request.tokens_evaluated, cache_n=request.cache_n,
                      prompt_n=request.prompt_n)))
"""


def restore_in_new_process(directory: str, prompt: list[int], filename: str = FILE) -> tuple[dict, dict]:
    """A new Python process plays the restarted server: it restores ``filename`` and serves ``prompt``.

    Returns the restore's JSON (``n_restored``, ...) and the request's counters (``tokens_evaluated``,
    ``cache_n``, ``prompt_n``), read back as JSON from the child. Bounded to 120 s.
    """
    import json
    import subprocess
    import sys

    from kvlab.server.save_dir import check_filename

    prompt = _check_tokens("prompt", prompt)
    filename = check_filename(filename)
    child = subprocess.run(
        [sys.executable, "-c", _RESTARTED, str(directory), filename],
        input=json.dumps(prompt), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    restored, request = (json.loads(line) for line in child.stdout.splitlines())
    return restored, request


def save_restore_history(
    prefix: list[int] | None = None, new: list[int] | None = None
) -> History[SaveRestoreState]:
    """Part one as a history of steps: process, save, stop, start, restore, reuse (for the stepper).

    Each step holds the two servers' own snapshots (``SlotServer.history``) and the file's tokens,
    as ``kvlab.views.slot_files.SaveRestoreState``; the captions are the models' event captions.
    """
    import tempfile

    from kvlab.server.slot_files import restore_slot, save_slot
    from kvlab.server.slots import SlotServer
    from kvlab.views.text import caption

    prefix = lesson_prefix() if prefix is None else _check_tokens("prefix", prefix)
    new = [9001, 9002, 9003, 9004, 9005] if new is None else _check_tokens("new", new)
    history: History[SaveRestoreState] = History()
    n = len(prefix)

    def add(text: str, first: object, file: tuple[int, ...] | None, second: object) -> None:
        history.add(text, SaveRestoreState(n, first, file, second))  # type: ignore[arg-type]

    with tempfile.TemporaryDirectory() as d:
        first = SlotServer(1, cache_ram_mib=0)
        add("server 1 starts with an empty slot", first.state(), None, None)
        first.complete(prefix, max_tokens=0)
        assert first.history is not None
        for step in first.history.steps[-2:]:  # the request placed, then finished
            add(f"server 1: {caption(step)}", step.state, None, None)
        saved = save_slot(first, 0, FILE, directory=d)
        file = first.slot_tokens(0)
        add(f"POST /slots/0?action=save: {saved.n_tokens:,} tokens, {saved.n_bytes:,} bytes to {FILE}",
            first.state(), file, None)  # fmt: skip
        add("server 1 stops: only the file is left", None, file, None)
        second = SlotServer(1, cache_ram_mib=0)
        add("server 2 starts with an empty slot", None, file, second.state())
        restore_slot(second, 0, FILE, directory=d)
        second.complete(prefix + new, max_tokens=1)
        assert second.history is not None
        for step in second.history.steps[-3:]:  # restored, then the request placed and finished
            add(f"server 2: {caption(step)}", None, file, step.state)
    return history


DAMAGED_COPIES = ("flipped.bin", "truncated.bin")
"""The two damaged copies ``refusal_lines`` writes beside the slot file: one byte changed, its end cut off."""
FLIPPED_BYTE = 1000  # the byte changed in flipped.bin: past the header, inside the KV data
TRUNCATED_BYTES = 100  # bytes cut off the end for truncated.bin


def refusal_lines(directory: str, filename: str = FILE) -> list[str]:
    """Part four: restores that kvlab refuses, one line each, and what the target slot still holds.

    ``filename`` is a slot file ``save_slot`` wrote into ``directory`` (for the tiny model); two
    damaged copies of it are written beside it, ``flipped.bin`` and ``truncated.bin``, only once the
    name, the directory and the file itself have been checked, so a refused call writes nothing.
    """
    from kvlab.errors import InvalidArgumentError, KvlabError
    from kvlab.server.save_dir import check_directory, check_filename, read_file, write_file
    from kvlab.server.slot_files import ModelShape, decode_slot, max_file_bytes, restore_slot
    from kvlab.server.slots import SlotServer

    filename = check_filename(filename)
    directory = str(check_directory(directory))
    if filename in DAMAGED_COPIES:
        raise InvalidArgumentError(
            f"filename {filename!r} is the name of one of the damaged copies refusal_lines writes "
            f"({', '.join(DAMAGED_COPIES)}): save the slot under another name"
        )
    blob = read_file(directory, filename, max_file_bytes(TINY_MODEL))  # bounded; never follows a link
    if len(blob) <= FLIPPED_BYTE + TRUNCATED_BYTES:
        raise InvalidArgumentError(
            f"{filename!r} is {len(blob):,} bytes: refusal_lines changes byte {FLIPPED_BYTE:,} of it and cuts "
            f"{TRUNCATED_BYTES} off its end, so it needs more than {FLIPPED_BYTE + TRUNCATED_BYTES:,}; pass the "
            "file save_slot wrote for a prefix of a few hundred tokens"
        )
    decode_slot(blob, TINY_MODEL)  # a slot file of the tiny model, before any copy is written
    flipped = bytearray(blob)
    flipped[FLIPPED_BYTE] ^= 0xFF  # one byte of KV data changed
    write_file(directory, DAMAGED_COPIES[0], bytes(flipped))
    write_file(directory, DAMAGED_COPIES[1], blob[:-TRUNCATED_BYTES])
    target = SlotServer(1, cache_ram_mib=0)
    target.complete(list(range(100, 400)), max_tokens=4)  # the slot holds another conversation
    attempts: dict[str, dict] = {
        "a name with a path in it": {"filename": "../" + filename},
        "another cache type (F32)": {"filename": filename, "shape": ModelShape(4, 2, 32, "f32")},
        "another model (the 8B shape)": {"filename": filename, "shape": LLAMA_8B},
        "one byte changed": {"filename": DAMAGED_COPIES[0]},
        "a truncated file": {"filename": DAMAGED_COPIES[1]},
    }
    lines = []
    for what, kwargs in attempts.items():
        try:
            restore_slot(target, 0, directory=directory, **kwargs)
            lines.append(f"{what}: restored")
        except KvlabError as error:
            lines.append(f"{what}: refused ({type(error).__name__}) {error}")
    lines.append(
        f"\nthe target slot still holds {len(target.slot_tokens(0))} tokens: its 300-token prompt and 4 generated "
        "tokens, less the last one, which was sampled but not yet evaluated"
    )
    return lines


def over_http(prefix: list[int] | None = None, new: list[int] | None = None) -> dict[str, int]:
    """Part one against a server over HTTP (``kvlab serve``, or ``KVLAB_SERVER_URL``'s llama-server).

    Process the prefix (``n_predict`` 0), save slot 0, erase it, restore it, send the prefix and the
    new tokens; the server's answers: ``n_saved``, ``n_restored``, ``cache_n``, ``prompt_n``.
    The server this starts is stopped before it returns.
    """
    import tempfile

    from kvlab.serve import start_server

    prefix = lesson_prefix() if prefix is None else _check_tokens("prefix", prefix)
    new = [7001, 7002, 7003, 7004, 7005] if new is None else _check_tokens("new", new)
    with tempfile.TemporaryDirectory() as d:
        server = start_server(cache="slot", slots=1, slot_save_path=d)
        try:
            server.post("/completion", {"prompt": prefix, "n_predict": 0})
            saved = server.post("/slots/0?action=save", {"filename": FILE})
            server.post("/slots/0?action=erase")
            restored = server.post("/slots/0?action=restore", {"filename": FILE})
            after = server.post("/completion", {"prompt": prefix + new, "n_predict": 1})
        finally:
            server.stop()
    return {
        "n_saved": saved["n_saved"],
        "n_restored": restored["n_restored"],
        "cache_n": after["timings"]["cache_n"],
        "prompt_n": after["timings"]["prompt_n"],
    }
