"""Exercises of notebook 11, offload and slot files (lesson example 11).

The expected answers come from ``kvlab.server.slot_files`` (file sizes, estimates, real save and restore
calls in a temporary directory); nothing here states them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError
from kvlab.exercises.core import NotYet, all_whole, exercise
from kvlab.server.slot_files import (
    LLAMA_8B,
    TINY_MODEL,
    ModelShape,
    header_bytes,
    offload_estimate,
    restore_slot,
    save_slot,
    slot_file_size,
)
from kvlab.server.slots import SlotServer

SIZE_SHAPE = ModelShape(28, 4, 128, "f16")  # exercise 11.1: a 7B-class model with 4 KV heads
SIZE_TOKENS = 2000
BREAK_EVEN_TOKENS = 748  # exercise 11.2: any prefix length gives the same speed
PREFIX = list(range(5000, 5748))  # exercise 11.3: the saved 748-token prefix
FILE = "agent-prefix.bin"
SAME_SIZE_SHAPE = ModelShape(4, 4, 16, "f16")  # as many KV bytes per token as the tiny model


@exercise(
    "11.1",
    title="Size of a slot file",
    assesses="computing a slot file's size from a model's shape: K and V per layer, id and metadata, header",
    minutes=6,
    answer_type="int",
    points=2,
    difficulty="core",
    hints=[
        "Per token: K and V (2) × layers × KV heads × head size × 2 bytes (F16), plus 4 + 12 bytes of id and metadata.",
        "Multiply by the tokens, then add the fixed part: header_bytes(shape) is the 64-byte header plus "
        "16 bytes per layer.",
    ],
)
def file_size(answer: int) -> str:
    shape, n = SIZE_SHAPE, SIZE_TOKENS
    expected = slot_file_size(shape, n)
    if answer == expected:
        return (
            f"{shape.kv_bytes_per_token:,} B of KV + 16 B per token = {shape.file_bytes_per_token:,} B; × {n:,} "
            f"tokens + {header_bytes(shape)} B of header = {expected:,} B, about {expected / 2**20:.0f} MiB."
        )
    if answer == n * shape.file_bytes_per_token:
        raise NotYet("The per-token part is right; add the bytes that do not grow with the tokens.")
    if answer in (n * shape.kv_bytes_per_token, n * shape.kv_bytes_per_token + header_bytes(shape)):
        raise NotYet("Each token also stores its id (4 B) and its cell metadata (12 B) in the file.")
    half = ModelShape(shape.n_layers, shape.n_kv_heads, shape.head_dim // 2, shape.dtype)
    if answer in (slot_file_size(half, n), slot_file_size(half, n) - header_bytes(half)):
        raise NotYet("Did you count both K and V? Each layer stores two tensors per token.")
    if answer == n * LLAMA_8B.kv_bytes_per_token:
        raise NotYet("That is the 8B shape's KV; this model has 28 layers and 4 KV heads.")
    raise NotYet(f"{answer:,} B is not the size of this slot file.")


@exercise(
    "11.2",
    title="Reading or recomputing: the break-even disk",
    assesses="comparing a read at disk bandwidth with a recompute at a FLOP rate, and seeing the prefix length cancel",
    minutes=8,
    answer_type="number",
    points=2,
    difficulty="core",
    prerequisites=["11.1"],
    hints=[
        "Reading and recomputing both grow in proportion to the number of tokens, so the answer does not depend on it.",
        "Take offload_estimate(748, 131_072): the disk speed that reads file_bytes in gpu_recompute_ms "
        "is file_bytes / (gpu_recompute_ms / 1000), in bytes per second; divide by 1e9 for GB/s.",
    ],
)
def break_even(answer: float) -> str:
    est = offload_estimate(BREAK_EVEN_TOKENS, LLAMA_8B.kv_bytes_per_token)
    expected = est.file_bytes / (est.gpu_recompute_ms / 1000) / 1e9
    cpu = est.file_bytes / est.cpu_recompute_s / 1e6
    if abs(answer - expected) <= 0.02 * expected:
        return (
            f"About {expected:.2f} GB/s: a disk slower than that (a SATA SSD, a network volume) loses to "
            f"recomputing on this GPU. Against the 8-core CPU the bar is about {cpu:.0f} MB/s, so any disk wins there."
        )
    if abs(answer / 1000 - expected) <= 0.02 * expected:
        raise NotYet("That looks like MB/s; give GB/s (10^9 bytes per second).")
    gib = est.file_bytes / (est.gpu_recompute_ms / 1000) / 2**30
    if abs(answer - gib) <= 0.01 * gib:
        raise NotYet("That is in GiB/s; the lesson's disk speeds are in GB/s (10^9 bytes).")
    if abs(answer - cpu / 1000) <= 0.02 * cpu / 1000:
        raise NotYet(
            "That is the break-even against the CPU; the question asks about the RTX 4090 at half its peak."
        )
    raise NotYet(f"At {answer} GB/s reading and recomputing do not take the same time.")


def _scenarios() -> dict[int, Callable[[Path], object]]:
    """Numbered restore attempts, as the notebook lists them; each gets a directory holding FILE."""

    def renamed(d: Path) -> object:
        (d / "backup.bin").write_bytes((d / FILE).read_bytes())
        return restore_slot(SlotServer(1, cache_ram_mib=0), 0, "backup.bin", directory=d)

    def over_a_conversation(d: Path) -> object:
        server = SlotServer(1, cache_ram_mib=0)
        server.complete(list(range(100, 400)), max_tokens=4)
        return restore_slot(server, 0, FILE, directory=d)

    def changed_byte(d: Path) -> object:
        blob = bytearray((d / FILE).read_bytes())
        blob[-1] ^= 0x01
        (d / FILE).write_bytes(bytes(blob))
        return restore_slot(SlotServer(1, cache_ram_mib=0), 0, FILE, directory=d)

    return {
        1: renamed,
        2: lambda d: restore_slot(SlotServer(2, cache_ram_mib=0), 1, FILE, directory=d),
        3: over_a_conversation,
        4: lambda d: restore_slot(SlotServer(1, n_ctx=512, cache_ram_mib=0), 0, FILE, directory=d),
        5: lambda d: restore_slot(
            SlotServer(1, cache_ram_mib=0), 0, FILE, directory=d, shape=SAME_SIZE_SHAPE
        ),
        6: changed_byte,
    }


def _refused() -> list[int]:
    out = []
    for number, attempt in _scenarios().items():
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "slots"
            d.mkdir()
            server = SlotServer(1, cache_ram_mib=0)
            server.complete(PREFIX, max_tokens=0)
            save_slot(server, 0, FILE, directory=d, shape=TINY_MODEL)
            try:
                attempt(d)
            except KvlabError:
                out.append(number)
    return out


@exercise(
    "11.3",
    title="Which restores are refused?",
    assesses="knowing what makes a slot file unusable: path names, another model or cache type, damage, size",
    minutes=6,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["11.1"],
    hints=[
        "A slot file is raw KV values plus the tokens they belong to. What must match for those values to mean anything?",
        "Refused: files from another model shape or cache type (even one with the same bytes per token), damaged "
        "files, and files that do not fit in the slot. The file's name, the slot number and what the slot held "
        "before do not matter.",
    ],
)
def refused_restores(answer: list[Any]) -> str:
    expected = _refused()
    if not all_whole(answer):
        raise NotYet("Give the scenario numbers as whole numbers, e.g. [1, 2].")
    if sorted(set(answer)) != sorted(answer):
        raise NotYet("Give each scenario number once.")
    if sorted(answer) == expected:
        return (
            "A file must fit the slot and come, undamaged, from the same model shape and cache type; equal bytes "
            "per token are not enough. Its name, the slot and what the slot held before do not matter."
        )
    missing = sorted(set(expected) - set(answer))
    extra = sorted(set(answer) - set(expected))
    if extra:
        raise NotYet(
            "Some scenarios on your list restore fine: which of them changes nothing the values depend on?"
        )
    raise NotYet(f"Your list misses {len(missing)} refused restore{'s' if len(missing) > 1 else ''}.")
