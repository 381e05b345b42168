"""Exercises of notebook 11, offload and slot files (lesson example 11).

11.1 writes the rule for what a restore gives back (checked on hidden cases against real save and
restore calls), 11.2 works out the offload arithmetic's break-even disk, 11.3 finds the restores that
are refused. The expected answers come from ``kvlab.server.slot_files`` and ``kvlab.server.slots``
(real save and restore calls in a temporary directory); nothing here states them.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from kvlab.errors import KvlabError
from kvlab.exercises.core import NotYet, all_whole, call_for_list, exercise
from kvlab.server.slot_files import (
    LLAMA_8B,
    TINY_MODEL,
    ModelShape,
    offload_estimate,
    restore_slot,
    save_slot,
)
from kvlab.server.slots import SlotServer

BREAK_EVEN_TOKENS = 748  # exercise 11.2: any prefix length gives the same speed
PREFIX = list(range(5000, 5748))  # exercise 11.3: the saved 748-token prefix
FILE = "agent-prefix.bin"
SAME_SIZE_SHAPE = ModelShape(4, 4, 16, "f16")  # as many KV bytes per token as the tiny model


def _restore_cases(rng: random.Random | None) -> list[tuple[list[int], list[int]]]:
    """(tokens the file holds, the first prompt after the restore): the notebook's, then fresh ones."""
    saved = list(range(100, 110))
    cases = [
        (saved, saved + [7, 8, 9]),  # part one in small: the prefix, then new tokens
        (saved, saved),  # exactly the saved tokens again
        (saved, saved[:4]),  # a shorter prompt that the file covers
        (saved, saved[:6] + [1, 2, 3]),  # the same start, then something else
        (saved, [1, 2, 3]),  # nothing in common
    ]
    if rng is not None:
        for _ in range(10):
            tokens = [rng.randrange(50, 500) for _ in range(rng.randint(1, 40))]
            keep = rng.randint(0, len(tokens))
            tail = [rng.randrange(500, 900) for _ in range(rng.choice([0, 0, 1, rng.randint(1, 20)]))]
            prompt = tokens[:keep] + tail or [rng.randrange(500, 900)]
            cases.append((tokens, prompt))
    return cases


def _after_restore(saved: list[int], prompt: list[int]) -> list[int]:
    """[cache_n, prompt_n] of ``prompt``, sent to a fresh server right after ``saved`` was restored."""
    with tempfile.TemporaryDirectory() as tmp:
        first = SlotServer(1, cache_ram_mib=0)
        first.complete(saved, max_tokens=0)  # n_predict 0: the slot holds exactly the prompt
        save_slot(first, 0, FILE, directory=tmp)
        fresh = SlotServer(1, cache_ram_mib=0)
        restore_slot(fresh, 0, FILE, directory=tmp)
        request = fresh.complete(prompt, max_tokens=1)
    return [request.cache_n, request.prompt_n]


@exercise(
    "11.1",
    title="What a restore gives back",
    assesses="knowing what llama-server's restore puts back (the slot's tokens and their KV) and how the "
    "next request reuses it: the common prefix, always one token evaluated",
    minutes=8,
    answer_type="function",
    points=2,
    difficulty="core",
    hints=[
        "After the restore the slot is as if it had just served a prompt of the saved tokens: the next "
        "request reuses the longest common prefix of the two token lists.",
        "If that prefix is the whole prompt, the server still evaluates the last token, to get the "
        "logits it samples from: cache_n is at most len(prompt) - 1. prompt_n is the rest.",
    ],
    cases=_restore_cases,
)
def after_restore(function: Any, cases: list[tuple[list[int], list[int]]]) -> str:
    for saved, prompt in cases:
        got = call_for_list(function, "[cache_n, prompt_n]", list(saved), list(prompt))
        want = _after_restore(saved, prompt)
        if len(got) != 2 or not all_whole(got):
            raise NotYet(f"Return two whole numbers, [cache_n, prompt_n]; got {got!r}.")
        if got != want and got == [want[0] + 1, want[1] - 1] and want[1] == 1:
            raise NotYet(
                f"A file holding {len(saved)} tokens, then a prompt of {len(prompt)} that the file covers: the server "
                f"reports [cache_n, prompt_n] = {want}, your function {got}. The server always evaluates the "
                "prompt's last token itself, to get the output it samples the next token from, so cache_n is at "
                "most len(prompt) - 1 and prompt_n at least 1."
            )
        if got != want:
            raise NotYet(
                f"A file holding {len(saved)} tokens, then a prompt of {len(prompt)}: the server reports "
                f"[cache_n, prompt_n] = {want}, your function {got} (saved {saved[:6]}..., prompt {prompt[:6]}...)."
            )
    return (
        "A restore gives back the slot's token list and their KV, nothing more: the next request reuses "
        "their common prefix with its prompt, as on a slot that had just served them, and always evaluates "
        "at least one token. llama-server 0c1e57098 did the same in the lesson: cache_n 748, prompt_n 5."
    )


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
        "Write the read time and the GPU recompute time for n tokens and set them equal: what happens to n?",
        "offload_estimate(748, 131_072) gives the file's size and the GPU recompute time: which disk speed "
        "reads that file in exactly that time?",
    ],
)
def break_even(answer: float) -> str:
    est = offload_estimate(BREAK_EVEN_TOKENS, LLAMA_8B.kv_bytes_per_token)
    expected = est.file_bytes / (est.gpu_recompute_ms / 1000) / 1e9
    cpu = est.file_bytes / est.cpu_recompute_s / 1e6
    if abs(answer - expected) <= 0.02 * expected:
        return (
            f"About {expected:.2f} GB/s, for any prefix length: the read and the recompute both grow in proportion "
            "to the number of tokens, so the length cancels. A disk slower than that (a SATA SSD, a network volume) loses to "
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
    _break_even_miss(answer, est.file_bytes, est.gpu_recompute_ms, expected)


def _break_even_miss(answer: float, file_bytes: int, recompute_ms: float, expected: float) -> NoReturn:
    """Directed feedback for a wrong break-even speed: the usual slips first, then which way to go."""
    full_peak = expected * 2  # the RTX 4090 at 100% instead of 50% of its peak
    for value, why in (
        (
            full_peak,
            "That is the break-even at the GPU's full peak; the question says half its peak (50%), "
            "which doubles the recompute time and halves the speed.",
        ),
        (
            expected / 2,
            "That is half the break-even: the 50% went in twice or the wrong way. At half its peak the GPU "
            "recomputes in 2 x 8.03e9 FLOP per token / (0.5 x 165.2e12 FLOP/s), twice its full-peak time; "
            "the break-even speed is the file's bytes divided by that time.",
        ),
        (
            3.0,
            "3 GB/s is the lesson's SSD, the speed it reads at; the question asks for the speed at which "
            "reading takes exactly as long as recomputing.",
        ),
    ):
        if abs(answer - value) <= 0.02 * value:
            raise NotYet(why)
    if answer <= 0:
        raise NotYet("A disk speed is a positive number of GB/s.")
    read_ms = file_bytes / (answer * 1e9) * 1000
    way = "faster than" if read_ms < recompute_ms else "slower than"
    move = "lower" if read_ms < recompute_ms else "higher"
    raise NotYet(
        f"At {answer:g} GB/s the 748-token file reads in {read_ms:.1f} ms, {way} the {recompute_ms:.1f} ms "
        f"recompute: the break-even speed is {move}."
    )


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
    title="Which restores does kvlab refuse?",
    assesses="knowing what makes a slot file unusable: path names, another model or cache type, damage, size",
    minutes=6,
    answer_type="list",
    points=2,
    difficulty="core",
    prerequisites=["11.1"],
    hints=[
        "A slot file is raw KV values plus the tokens they belong to. What must match for those values to mean anything?",
        "Sort the six into two groups: changes that alter what the file's bytes mean, or whether they can be "
        "loaded at all, and changes that are only bookkeeping around the file.",
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
            "per token are not enough. Its name, the slot and what the slot held before do not matter. That is "
            "kvlab's rule. llama-server 0c1e57098 checks the file's magic, version and token count and each "
            "layer's type and row size, with no checksum: it refuses 4 too (not enough cells), but 5 (the same "
            "row size in every layer) and 6 (a changed KV byte) would most likely restore there, as meaningless KV."
        )
    missing = sorted(set(expected) - set(answer))
    extra = sorted(set(answer) - set(expected))
    if extra:
        raise NotYet(
            "Some scenarios on your list restore fine: which of them changes nothing the values depend on?"
        )
    raise NotYet(f"Your list misses {len(missing)} refused restore{'s' if len(missing) > 1 else ''}.")
