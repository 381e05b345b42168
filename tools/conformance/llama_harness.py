"""A real llama-server (llama.cpp 0c1e57098) against kvlab's slot and sliding-window models.

    python tools/conformance/llama_harness.py --build                  # once (about 7 minutes on 2 cores)
    python tools/conformance/llama_harness.py --slots 60 --swa 30 --seed 0 --out llama_diff.json

``--build`` runs ``pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`` into
the cache folder (``$KVLAB_LLAMA_CACHE``, default ``~/.cache/kvlab-llama``, outside the clone),
unpacks the sdist, checks that its vendored ``vendor/llama.cpp`` checkout is at commit
``0c1e57098`` and builds only ``llama-server`` with CMake + Ninja (CPU, no curl, no web UI).
A binary already there is reused. Nothing else touches the network.

Models: two tiny random-weight GGUF files (``llama_models.py``): a 4-layer ``llama`` and a
6-layer ``gemma3`` with a 128-token sliding window, written into the cache folder.

Each scenario starts its own llama-server on 127.0.0.1 (free port, ``-t 2``, ``--no-webui``,
``--seed 0``, ``-lv 4``, ``--slot-save-path`` in a temp folder) and stops it when the scenario
ends, on every path (context manager, ``try/finally``, ``atexit``; the server runs in its own
process group and the group is killed). A fresh process per scenario is the only way to empty
the RAM prompt cache (no endpoint clears it) and to reset the slots' last-used times, which
``/slots/N?action=erase`` does not; the tiny models load in well under a second, so this costs
little. Requests go one at a time to ``POST /completion`` with ``{"prompt": [ids],
"n_predict": k, "cache_prompt": true, "temperature": 0, "top_k": 1, "ignore_eos": true,
"return_tokens": true}`` (and ``id_slot`` when the op names one); every HTTP call has a timeout.

Slot scenarios (``--slots N``): random ``-np`` 1..3, ``--slot-prompt-similarity`` 0 / 0.1 / 0.5,
``--cache-ram`` 0 / 1 MiB / default / -1 (no byte limit), slot context 256..1024 tokens (``-c`` = that x ``-np``).
Several users hold growing conversations (their next prompt is the previous prompt, the real
reply's tokens and new tokens), start new ones on shared prefixes, send prompts longer than
the slot context (refused with HTTP 400) and name a slot now and then. The same request and
the real generated tokens go to ``kvlab.server.slots.SlotServer``; ``slot``, ``cache_n``,
``prompt_n``, the tokens sampled and refusals are compared. The per-token state size passed to kvlab is measured
on the real server: ``/slots/N?action=save`` reports ``n_written`` = 12 bytes of file header +
4 bytes per token id + ``llama_state_seq_get_size_ext`` (what ``prompt_save`` stores); two
saves of different lengths give the slope (bytes per token, 1,036 for the tiny llama: 1,024
of F16 K and V plus 12 bytes of cell metadata) and the intercept (a fixed 132-byte header).

SWA scenarios (``--swa N``): the gemma3 model, ``-np 1 -c 4096 --cache-ram 0``, with and
without ``--swa-full``, ``-ctxcp`` 0 / 2 / 3 / 4 / 8 / 32, ``--checkpoint-min-step``
8192 / 1000 / 300 / 0 and ``-b``/``-ub`` down to 512/128; a long prompt, then prompts sharing prefixes
of random lengths with an earlier one (plus append-only continuations), compared with
``kvlab.server.swa.SwaSlot`` (``cache_n``, ``prompt_n``, and the checkpoints the server logs as
created, ``(pos_min, pos_max, n_tokens)``, and the whole list after each request).

The servers are ``kvlab.lessons.real_llama.LlamaServer``, which notebooks 10-12 use too.

``--out FILE`` writes every scenario that differs: its config, the resolved requests up to the
first difference (prompt, n_predict, id_slot, the real reply tokens), both records of that
request, and a shrunk version when ``--shrink`` is given (each shrink trial reruns the server).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone, when kvlab is not installed
import llama_models  # noqa: E402
import llama_reference  # noqa: E402

from kvlab.lessons.real_llama import (  # noqa: E402  (servers are driven the way the lessons drive them)
    COMMIT,
    LlamaServer,
    cache_root,
    find_server,
    server_path,
)

PACKAGE = "llama-cpp-python"
PACKAGE_VERSION = "0.3.36"
CMAKE_FLAGS = (
    "-G",
    "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_CURL=OFF",
)


# ---------------------------------------------------------------------- build


def source_dir() -> Path:
    return cache_root() / f"llama_cpp_python-{PACKAGE_VERSION}" / "vendor" / "llama.cpp"


def built_server() -> Path:
    """Where ``--build`` puts the binary (``$KVLAB_LLAMA_SERVER`` may point elsewhere)."""
    return cache_root() / "build" / "bin" / "llama-server"


def vendored_commit() -> str | None:
    src = source_dir()
    if not (src / ".git").exists():
        return None
    out = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=False
    )
    return out.stdout.strip() or None


def build(jobs: int = 2) -> str:
    """Download, check and build llama-server into the cache folder; return a one-line summary."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    src = source_dir()
    if not src.exists():
        sdist = root / f"llama_cpp_python-{PACKAGE_VERSION}.tar.gz"
        if not sdist.exists():
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                 f"{PACKAGE}=={PACKAGE_VERSION}", "-d", str(root)],
                check=True, timeout=1800,
            )  # fmt: skip
        subprocess.run(["tar", "xzf", str(sdist), "-C", str(root)], check=True, timeout=600)
    commit = vendored_commit()
    if commit is None or not commit.startswith(COMMIT):
        raise SystemExit(f"{src} is at commit {commit}, expected {COMMIT}: remove {root} and rebuild")
    if built_server().is_file():
        what = f"reused {built_server()}"
    else:
        bdir = root / "build"
        subprocess.run(["cmake", "-S", str(src), "-B", str(bdir), *CMAKE_FLAGS], check=True, timeout=1800)
        subprocess.run(["ninja", "-C", str(bdir), f"-j{jobs}", "llama-server"], check=True, timeout=7200)
        what = f"built {built_server()}"
    models = llama_models.ensure_models(root)
    return f"llama.cpp {commit[:9]}: {what}; models {', '.join(str(p) for p in models.values())}"


_STATE_SIZES: dict[tuple[str, int], tuple[int, int]] = {}


def measure_state_size(model: Path, n_slots: int = 1) -> tuple[int, int]:
    """(bytes per token, fixed bytes) of one slot's saved state, from two ``action=save`` calls.

    The fixed part grows by 4 bytes per slot: without a unified KV cache there is one stream per
    slot, and ``llama_kv_cache::state_write`` writes a cell count for each (0 for the others).
    """
    key = (str(model), n_slots)
    if key in _STATE_SIZES:
        return _STATE_SIZES[key]
    with LlamaServer(model, ["-np", str(n_slots), "-c", str(2048 * n_slots), "--cache-ram", "0"]) as srv:
        sizes = []
        for n in (100, 600):
            srv.complete([3 + i % 500 for i in range(n)], 0, id_slot=0)
            saved = srv.post("/slots/0?action=save", {"filename": f"s{n}.bin"})
            assert saved["n_saved"] == n, saved
            sizes.append((n, saved["n_written"] - 12 - 4 * n))
    (n0, s0), (n1, s1) = sizes
    per = (s1 - s0) // (n1 - n0)
    assert per * (n1 - n0) == s1 - s0
    _STATE_SIZES[key] = per, s0 - per * n0
    return _STATE_SIZES[key]


# ---------------------------------------------------------------------- slot scenarios


def gen_slot_scenario(seed: int, n_ops: int) -> dict:
    rnd = random.Random(seed)
    np_ = rnd.choice([1, 2, 2, 3, 3])
    n_ctx_slot = rnd.choice([256, 512, 1024])
    config = {
        "np": np_,
        "n_ctx_slot": n_ctx_slot,
        "sim": rnd.choice([0.0, 0.1, 0.1, 0.5]),
        "cache_ram": rnd.choice([0, 1, 8192]),
    }
    if rnd.random() < 0.25:
        config["cache_ram"] = -1  # no byte limit: the token limit (the whole -c) decides
    n_users = rnd.randint(2, 4)
    n_prefixes = rnd.randint(1, 2)
    prefixes = [[rnd.randrange(3, llama_models.VOCAB_SIZE) for _ in range(rnd.randint(0, n_ctx_slot // 3))]
                for _ in range(n_prefixes)]  # fmt: skip

    def toks(n: int) -> list[int]:
        return [rnd.randrange(3, llama_models.VOCAB_SIZE) for _ in range(n)]

    ops = []
    for _ in range(n_ops):
        u = rnd.randrange(n_users)
        r = rnd.random()
        op: dict[str, Any] = {"user": u, "n_predict": rnd.randint(0, 8)}
        if r < 0.55:
            op["kind"] = "turn"
            op["new"] = toks(rnd.randint(1, n_ctx_slot // 4))
        elif r < 0.85:
            op["kind"] = "fresh"
            op["prefix"] = rnd.randrange(n_prefixes)
            op["new"] = toks(rnd.randint(1, n_ctx_slot // 3))
        elif r < 0.93:
            op["kind"] = "fresh"
            op["prefix"] = rnd.randrange(n_prefixes)
            op["new"] = toks(rnd.randint(n_ctx_slot - len(prefixes[op["prefix"]]) - 10, n_ctx_slot + 30))
        else:
            op["kind"] = "repeat"  # the user's previous prompt again
        if rnd.random() < 0.12:
            op["id_slot"] = rnd.randrange(np_)
        ops.append(op)
    return {"config": config, "prefixes": prefixes, "ops": ops}


def server_args_slots(config: dict) -> list[str]:
    return ["-np", str(config["np"]), "-c", str(config["n_ctx_slot"] * config["np"]),
            "--slot-prompt-similarity", str(config["sim"]), "--cache-ram", str(config["cache_ram"])]  # fmt: skip


def _kvlab_slot_server(config: dict, state_bytes_per_token: int, state_header_bytes: int = 0):  # type: ignore[no-untyped-def]
    from kvlab.server.slots import SlotServer

    return SlotServer(
        config["np"],
        n_ctx=config["n_ctx_slot"],
        slot_prompt_similarity=config["sim"],
        cache_ram_mib=config["cache_ram"],
        state_bytes_per_token=state_bytes_per_token,
        state_header_bytes=state_header_bytes,
        record=False,
    )


def _kvlab_complete(
    ks, prompt: list[int], n_predict: int, id_slot: int, real_tokens: list[int] | None
) -> dict:  # type: ignore[no-untyped-def]
    from kvlab.errors import KvlabError

    n_room = ks.n_ctx - len(prompt)
    gen = [] if real_tokens is None else list(real_tokens)[: max(0, min(max(n_predict, 1), n_room))]
    if n_predict > 0 and not gen and n_room > 0:
        gen = [3]  # a stand-in when the real server refused (kvlab should refuse before using it)
    try:
        rec = ks.complete(prompt, max_tokens=n_predict, generated=gen, id_slot=id_slot)
    except KvlabError as e:
        return {"refused": True, "error": type(e).__name__}
    if rec.error:  # the server's own refusal (HTTP 400), which still moved slot state
        return {"refused": True, "error": rec.error}
    return {"refused": False, "slot": rec.slot_id, "cache_n": rec.cache_n, "prompt_n": rec.prompt_n,
            "n_generated": rec.n_generated}  # fmt: skip


def _same(a: dict, b: dict) -> bool:
    if a["refused"] or b["refused"]:
        return a["refused"] == b["refused"]
    return all(a[k] == b.get(k, a[k]) for k in ("slot", "cache_n", "prompt_n", "n_generated"))


class _Reference:
    """``llama_reference.ReferenceServer`` behind the harness's kvlab-side interface."""

    def __init__(self, cfg: dict, model: Path, revert: frozenset[str]) -> None:
        per, fixed = measure_state_size(model, cfg["np"])
        self.ref = llama_reference.ReferenceServer(
            cfg["np"], n_ctx_slot=cfg["n_ctx_slot"], sim=cfg["sim"], cache_ram_mib=cfg["cache_ram"],
            per_token=per, fixed=fixed, revert=revert,
        )  # fmt: skip

    def complete(
        self, prompt: list[int], n_predict: int, id_slot: int, real_tokens: list[int] | None
    ) -> dict:
        r = self.ref.complete(prompt, n_predict, id_slot, real_tokens)
        r.pop("slot", None) if r["refused"] else None
        return r


def run_slot_scenario(
    scn: dict,
    model: Path,
    state_bytes_per_token: int,
    against: str = "kvlab",
    revert: frozenset[str] = frozenset(),
) -> dict:
    """Run a scenario on a fresh server and on kvlab (or the reference); return records and the first difference."""
    cfg = scn["config"]
    if against == "kvlab":
        ks = _kvlab_slot_server(cfg, state_bytes_per_token, measure_state_size(model, cfg["np"])[1])

        def side(prompt: list[int], k: int, id_slot: int, toks: list[int] | None) -> dict:
            return _kvlab_complete(ks, prompt, k, id_slot, toks)
    else:
        side = _Reference(cfg, model, revert).complete
    history: dict[int, list[int]] = {}
    last_prompt: dict[int, list[int]] = {}
    resolved: list[dict] = []
    first = None
    agree = 0
    with LlamaServer(model, server_args_slots(cfg)) as srv:
        for i, op in enumerate(scn["ops"]):
            u = op["user"]
            if op["kind"] == "turn":
                prompt = history.get(u, []) + op["new"]
            elif op["kind"] == "fresh":
                prompt = scn["prefixes"][op["prefix"]] + op["new"]
            else:
                prompt = list(last_prompt.get(u) or op.get("new") or [5, 6, 7])
            if not prompt:
                prompt = [3]
            id_slot = op.get("id_slot", -1)
            real = srv.complete(prompt, op["n_predict"], id_slot)
            ours = side(prompt, op["n_predict"], id_slot, real.get("tokens"))
            resolved.append({"prompt": prompt, "n_predict": op["n_predict"], "id_slot": id_slot,
                             "real_tokens": real.get("tokens")})  # fmt: skip
            last_prompt[u] = prompt
            if real["refused"]:
                history[u] = []
            else:
                history[u] = prompt + real["tokens"]
            if _same(real, ours):
                agree += 1
            elif first is None:
                r2 = {k: v for k, v in real.items() if k != "tokens"}
                first = {"index": i, "real": r2, "kvlab": ours}
    return {"agree": agree, "total": len(scn["ops"]), "first": first, "requests": resolved}


def shrink_slot_scenario(scn: dict, model: Path, spt: int, budget: int = 30, **kw: Any) -> dict:
    """Drop ops while the scenario still differs (each trial reruns the server; at most ``budget`` trials)."""
    res = run_slot_scenario(scn, model, spt, **kw)
    if res["first"] is None:
        return scn
    ops = scn["ops"][: res["first"]["index"] + 1]
    trials = 0
    chunk = max(1, len(ops) // 2)
    while chunk >= 1 and trials < budget:
        i = 0
        while i < len(ops) - 1 and trials < budget:  # keep the differing (last) op
            trial = ops[:i] + ops[i + chunk :]
            trials += 1
            r = run_slot_scenario({**scn, "ops": trial}, model, spt, **kw)
            if r["first"] is not None:
                ops = trial[: r["first"]["index"] + 1]
            else:
                i += chunk
        chunk //= 2
    return {**scn, "ops": ops}


# ---------------------------------------------------------------------- SWA scenarios

_CKPT_RE = re.compile(
    r"created context checkpoint \d+ of \d+ \(pos_min = (-?\d+), pos_max = (-?\d+), n_tokens = (\d+)"
)


USER_START = 2  # ``</s>`` in the tiny vocabulary, a control token
USER_DELIMITERS = [{"role": "user", "delimiter": "</s>"}]


def gen_swa_scenario(seed: int, n_ops: int) -> dict:
    rnd = random.Random(10_000 + seed)
    swa_full = rnd.random() < 0.3
    config = {"swa_full": swa_full, "ctxcp": rnd.choice([0, 2, 32, 32]), "n_ctx": 4096}
    # flags added after the first rounds (drawn from their own stream, so older seeds keep their
    # prompts): fewer checkpoints, the "too close" spacing, smaller batches and ubatches (a ring
    # of 256 or 512 cells), and long scenarios that pass 32 checkpoints
    extra = random.Random(20_000 + seed)
    config["ctxcp"] = extra.choice([config["ctxcp"], config["ctxcp"], 3, 4, 8])
    config["min_step"] = extra.choice([8192, 8192, 0, 300, 1000])
    config["n_ubatch"] = extra.choice([512, 512, 256, 128])
    config["n_batch"] = max(config["n_ubatch"], extra.choice([2048, 2048, 1024, 512]))
    if extra.random() < 0.2:
        n_ops *= 3
    # user messages: token 2 (``</s>``) starts one, and the request names it as the user delimiter
    # (``message_delimiters``, what the chat endpoint sends), so the server checkpoints there
    config["chat"] = extra.random() < 0.4

    def toks(n: int) -> list[int]:
        out = [rnd.randrange(3, llama_models.VOCAB_SIZE) for _ in range(n)]
        if config["chat"]:
            for _ in range(extra.choice([0, 1, 1, 2, 3])):
                out[extra.randrange(n)] = USER_START
        return out

    ops: list[dict] = [
        {"kind": "new", "new": toks(rnd.randint(600, 2600)), "n_predict": rnd.choice([1, 1, 4])}
    ]
    for _ in range(n_ops - 1):
        r = rnd.random()
        k = rnd.choice([0, 1, 1, 2, 8])
        if r < 0.45:  # share a random prefix of an earlier prompt
            ops.append({"kind": "prefix", "of": rnd.randrange(len(ops)), "frac": rnd.random(),
                        "new": toks(rnd.randint(1, 300)), "n_predict": k})  # fmt: skip
        elif r < 0.75:  # continue the previous prompt + its reply
            ops.append({"kind": "continue", "new": toks(rnd.randint(1, 600)), "n_predict": k})
        elif r < 0.85:
            ops.append({"kind": "repeat", "n_predict": k})
        else:
            ops.append({"kind": "new", "new": toks(rnd.randint(100, 2600)), "n_predict": k})
    return {"config": config, "ops": ops}


def server_args_swa(config: dict) -> list[str]:
    args = ["-np", "1", "-c", str(config["n_ctx"]), "--cache-ram", "0", "-ctxcp", str(config["ctxcp"])]
    if "min_step" in config:
        args += ["--checkpoint-min-step", str(config["min_step"])]
    if "n_ubatch" in config:
        args += ["-b", str(config["n_batch"]), "-ub", str(config["n_ubatch"])]
    if config["swa_full"]:
        args.append("--swa-full")
    return args


def swa_config(config: dict):  # type: ignore[no-untyped-def]
    """kvlab's ``SwaConfig`` for a scenario's server flags."""
    from kvlab.server.swa import SwaConfig

    return SwaConfig(n_swa=llama_models.GEMMA3_SWA, n_ctx=config["n_ctx"], swa_full=config["swa_full"],
                     ctx_checkpoints=config["ctxcp"], checkpoint_min_step=config.get("min_step", 8192),
                     n_ubatch=config.get("n_ubatch", 512), n_batch=config.get("n_batch", 2048))  # fmt: skip


_CKPT_LIST_RE = re.compile(
    r"(created context checkpoint \d+ of \d+|erased invalidated context checkpoint|erasing old context "
    r"checkpoint|erasing context checkpoint too close to an earlier one) \(pos_min = (-?\d+), "
    r"pos_max = (-?\d+), n_tokens = (\d+)|superseding context checkpoint at n_tokens = (\d+)"
)


def checkpoints_from_log(log: str, held: list[list[int]]) -> list[list[int]]:
    """The slot's checkpoint list after the log lines, starting from ``held`` ([pos_min, pos_max, n_tokens])."""
    out = [list(c) for c in held]
    for what, a, b, c, sup in _CKPT_LIST_RE.findall(log):
        if sup:
            out = [x for x in out if x[2] != int(sup)]
        elif what.startswith("created"):
            out.append([int(a), int(b), int(c)])
        else:
            cp = [int(a), int(b), int(c)]
            if cp in out:
                out.remove(cp)
    return out


def run_swa_scenario(scn: dict, model: Path, compare_created: bool = True) -> dict:
    """Run a scenario on a fresh server and on ``SwaSlot``; compare counters, created checkpoints and the list."""
    from kvlab.errors import KvlabError
    from kvlab.server.swa import SwaSlot

    cfg = scn["config"]
    slot = SwaSlot(swa_config(cfg))
    prompts: list[list[int]] = []
    prev: list[int] = []
    released = 0
    resolved = []
    first = None
    agree = 0
    held: list[list[int]] = []
    with LlamaServer(model, server_args_swa(cfg)) as srv:
        for i, op in enumerate(scn["ops"]):
            if op["kind"] == "new":
                prompt = list(op["new"])
            elif op["kind"] == "prefix":
                base = prompts[min(op["of"], len(prompts) - 1)] if prompts else []
                prompt = base[: int(len(base) * op["frac"])] + op["new"]
            elif op["kind"] == "continue":
                prompt = prev + op["new"]
            else:
                prompt = list(prompts[-1]) if prompts else list(op.get("new", [5]))
            if len(prompt) >= cfg["n_ctx"]:
                prompt = prompt[-(cfg["n_ctx"] // 2) :]
            k = op["n_predict"]
            mark = len(srv.log_text())
            starts = [j for j, t in enumerate(prompt) if t == USER_START] if cfg.get("chat") else []
            real = srv.complete(
                prompt, k, **({"message_delimiters": USER_DELIMITERS} if cfg.get("chat") else {})
            )
            if not real["refused"]:
                released += 1
            log = srv.wait_log("stop processing", released)[mark:]
            real["created"] = [[int(a), int(b), int(c)] for a, b, c in _CKPT_RE.findall(log)]
            held = checkpoints_from_log(log, held)
            real["checkpoints"] = held
            gen = [] if real["refused"] else real["tokens"][: max(k, 1)]
            try:
                rec = slot.complete(prompt, max_tokens=k, generated=gen, user_starts=starts)
                ours = {"refused": False, "slot": 0, "cache_n": rec.cache_n, "prompt_n": rec.prompt_n,
                        "n_generated": rec.n_generated,
                        "created": [[c.pos_min, c.pos_max, c.n_tokens] for c in rec.created],
                        "checkpoints": [[c.pos_min, c.pos_max, c.n_tokens] for c in slot.checkpoints]}  # fmt: skip
            except KvlabError as e:
                ours = {"refused": True, "error": type(e).__name__}
            if not real["refused"]:
                real["slot"] = 0
            resolved.append({"prompt_len": len(prompt), "n_predict": k, "real_tokens": real.get("tokens")})
            prompts.append(prompt)
            prev = prompt + (real.get("tokens") or [])
            same = _same(real, ours) and (
                real["refused"]
                or not compare_created
                or (real["created"] == ours["created"] and real["checkpoints"] == ours["checkpoints"])
            )
            if same:
                agree += 1
            elif first is None:
                r2 = {k2: v for k2, v in real.items() if k2 != "tokens"}
                trace = [
                    ln for ln in log.splitlines() if "checkpoint" in ln or "forcing" in ln or "n_past" in ln
                ]
                first = {"index": i, "real": r2, "kvlab": ours, "log": trace[-20:]}
    return {"agree": agree, "total": len(scn["ops"]), "first": first, "requests": resolved}


# ---------------------------------------------------------------------- minimal examples, one per family


def _seq(start: int, n: int) -> list[int]:
    return [3 + (start + 7 * i) % (llama_models.VOCAB_SIZE - 3) for i in range(n)]


def _examples() -> list[dict]:
    """Hand-made request sequences, each showing one disagreement family in its last request."""
    x, y, z = _seq(0, 98), _seq(1, 30), _seq(2, 12)
    p1100, q = _seq(3, 1100), _seq(4, 50)
    a, b, c = _seq(5, 400), _seq(6, 400), _seq(7, 700)
    long_p = _seq(8, 1000)
    ctx = {"np": 2, "n_ctx_slot": 256, "sim": 0.1, "cache_ram": 0}
    return [
        {"family": "refused request still selects a slot and stamps its last-used time",
         "config": ctx, "requests": [(y[:10], 1, -1), (_seq(9, 300), 1, -1), (z, 1, -1)]},
        {"family": "idle slots are saved to the RAM cache after a task launches (--cache-idle-slots)",
         "config": {"np": 3, "n_ctx_slot": 256, "sim": 0.0, "cache_ram": 8192},
         "requests": [(x, 1, -1), (y, 1, -1), (x[:45] + z, 1, -1)]},
        {"family": "a state larger than --cache-ram is not stored",
         "config": {"np": 1, "n_ctx_slot": 2048, "sim": 0.1, "cache_ram": 1},
         "requests": [(p1100, 1, -1), (q, 1, -1), (p1100 + z, 1, -1)]},
        {"family": "room is made when saving, before the load looks for an entry",
         "config": {"np": 1, "n_ctx_slot": 1024, "sim": 0.1, "cache_ram": 1},
         "requests": [(a, 1, -1), (b, 1, -1), (c, 1, -1), (a[:200] + _seq(10, 50), 1, -1)]},
        {"family": "n_predict 0 samples one token; the slot keeps the prompt only",
         "config": {"np": 1, "n_ctx_slot": 512, "sim": 0.1, "cache_ram": 0},
         "requests": [(x, 0, -1), (x + z, 1, -1)]},
        {"family": "--swa-full: a reuse point inside the first n_swa tokens is kept", "swa": True,
         "config": {"swa_full": True, "ctxcp": 0, "n_ctx": 4096},
         "requests": [(long_p, 1, -1), (long_p[:100] + z, 1, -1)]},
        {"family": "a restored checkpoint holds only the window (next checkpoint's pos_min)", "swa": True,
         "config": {"swa_full": False, "ctxcp": 32, "n_ctx": 4096},
         "requests": [(_seq(11, 1474), 1, -1), (_seq(11, 1474) + _seq(12, 476), 1, -1),
                      (_seq(11, 1134) + _seq(13, 182), 1, -1),
                      (_seq(11, 900) + _seq(14, 100), 1, -1)]},
        {"family": "overwriting a ring cell purges every older position (apply_ubatch)", "swa": True,
         "config": {"swa_full": False, "ctxcp": 32, "n_ctx": 4096},
         "requests": [(h2071 := _hseq(2071, 903), 1, -1), (b2071 := h2071[:375] + _hseq(26923, 276), 1, -1),
                      (b2071 + _hseq(14498, 388), 1, -1)]},
        {"family": "checkpoints too close to an earlier one are erased when the list fills", "swa": True,
         "config": {"swa_full": False, "ctxcp": 3, "n_ctx": 4096},
         "requests": [(_hseq(1, 1000), 1, -1), (_hseq(1, 1000) + _hseq(2, 600), 1, -1),
                      (_hseq(1, 1000) + _hseq(2, 600) + _hseq(3, 700), 1, -1)]},
        {"family": "--cache-ram -1: no byte limit, at most -c tokens in the cache",
         "config": {"np": 1, "n_ctx_slot": 512, "sim": 0.1, "cache_ram": -1},
         "requests": [(_hseq(1, 300), 1, -1), (_hseq(2, 300), 1, -1), (_hseq(3, 300), 1, -1),
                      (_hseq(1, 300) + _hseq(4, 20), 1, -1)]},
        {"family": "the entry header decides what fits in --cache-ram",
         "config": {"np": 1, "n_ctx_slot": 1024, "sim": 0.1, "cache_ram": 1},
         "requests": [(_hseq(5, 500), 1, -1), (_hseq(6, 512), 1, -1), (_hseq(5, 500) + _hseq(8, 20), 1, -1)]},
    ]  # fmt: skip


def _hseq(start: int, n: int) -> list[int]:
    """The token runs of kvlab's tests (tests/server), which name these cases."""
    return [3 + (start + 7 * i) % 509 for i in range(n)]


def run_examples(models: dict[str, Path]) -> list[dict]:
    """Run each example on the real server and on kvlab; return the records of every request."""
    from kvlab.errors import KvlabError
    from kvlab.server.swa import SwaSlot

    out = []
    for ex in _examples():
        cfg, rows = ex["config"], []
        if ex.get("swa"):
            slot = SwaSlot(swa_config(cfg))
            with LlamaServer(models["gemma3"], server_args_swa(cfg)) as srv:
                for n, (prompt, k, _) in enumerate(ex["requests"], 1):
                    mark = len(srv.log_text())
                    real = srv.complete(prompt, k)
                    log = srv.wait_log("stop processing", n)[mark:]
                    real["created"] = [[int(v) for v in m] for m in _CKPT_RE.findall(log)]
                    try:
                        rec = slot.complete(prompt, max_tokens=k, generated=real["tokens"][:k])
                        ours = {"cache_n": rec.cache_n, "prompt_n": rec.prompt_n,
                                "created": [[c.pos_min, c.pos_max, c.n_tokens] for c in rec.created]}  # fmt: skip
                    except KvlabError as e:
                        ours = {"refused": True, "error": type(e).__name__}
                    rows.append({"prompt_len": len(prompt), "n_predict": k,
                                 "real": {kk: v for kk, v in real.items() if kk != "tokens"}, "kvlab": ours})  # fmt: skip
        else:
            ks = _kvlab_slot_server(cfg, *measure_state_size(models["llama"], cfg["np"]))
            with LlamaServer(models["llama"], server_args_slots(cfg)) as srv:
                for prompt, k, id_slot in ex["requests"]:
                    real = srv.complete(prompt, k, id_slot)
                    ours = _kvlab_complete(ks, prompt, k, id_slot, real.get("tokens"))
                    r = {kk: v for kk, v in real.items() if kk != "tokens"}
                    if not real["refused"]:
                        r["n_tokens_returned"] = len(real["tokens"])
                    rows.append({"prompt_len": len(prompt), "n_predict": k, "id_slot": id_slot,
                                 "real": r, "kvlab": ours})  # fmt: skip
        out.append({"family": ex["family"], "config": cfg, "requests": rows})
    return out


# ---------------------------------------------------------------------- CLI


@dataclass
class Tally:
    name: str
    scenarios: int = 0
    agree_scenarios: int = 0
    requests: int = 0
    agree_requests: int = 0
    diffs: list[dict] = field(default_factory=list)

    def add(self, scn: dict, res: dict, seed: int) -> None:
        self.scenarios += 1
        self.requests += res["total"]
        self.agree_requests += res["agree"]
        if res["first"] is None:
            self.agree_scenarios += 1
        else:
            n = res["first"]["index"] + 1
            self.diffs.append({"kind": self.name, "seed": seed, "config": scn["config"], "first": res["first"],
                               "requests": res["requests"][:n]})  # fmt: skip

    def line(self) -> str:
        return (f"{self.name}: agree on {self.agree_scenarios} of {self.scenarios} scenarios "
                f"({self.agree_requests} of {self.requests} requests)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="store_true", help="download, check and build llama-server (once)")
    ap.add_argument("--slots", type=int, default=0, help="number of random slot scenarios")
    ap.add_argument("--swa", type=int, default=0, help="number of random sliding-window scenarios")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--ops", type=int, default=16, help="requests per slot scenario (SWA: half)")
    ap.add_argument("--out", type=Path, help="write the differing scenarios here (JSON)")
    ap.add_argument(
        "--shrink", action="store_true", help="shrink differing slot scenarios (reruns the server)"
    )
    ap.add_argument(
        "--against",
        choices=["kvlab", "reference"],
        default="kvlab",
        help="compare slot scenarios with kvlab (default) or with llama_reference.py",
    )
    ap.add_argument(
        "--revert",
        default="",
        help="reference only: comma-separated rules put back the kvlab way "
        "(idle, refusal, oversize, room, header), to count the scenarios each family explains",
    )
    ap.add_argument(
        "--no-created",
        action="store_true",
        help="SWA: compare cache_n/prompt_n only, not the checkpoints created",
    )
    ap.add_argument("--examples", action="store_true", help="run the minimal example of each known family")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    # a SIGTERM ends the run through SystemExit, so every server is stopped by its finally / atexit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.build:
        print(build())
    if not (a.slots or a.swa or a.examples):
        return 0
    if find_server() is None:
        print(f"no llama-server in {server_path()}: run with --build first", file=sys.stderr)
        return 2
    models = llama_models.ensure_models(cache_root())
    out: dict[str, Any] = {"commit": COMMIT, "diffs": []}
    rc = 0
    if a.examples:
        out["examples"] = run_examples(models)
        for ex in out["examples"]:
            print(f"* {ex['family']}  {ex['config']}")
            for r in ex["requests"]:
                print(
                    f"    {r['prompt_len']:5d} tokens, n_predict {r['n_predict']}: real {r['real']}  kvlab {r['kvlab']}"
                )
    if a.slots:
        spt, header = measure_state_size(models["llama"])
        out["state_bytes"] = {"per_token": spt, "fixed": header}
        print(f"state size of the tiny llama: {spt} bytes per token + {header} bytes", flush=True)
        t = Tally("slots" if a.against == "kvlab" else "slots (reference)")
        kw = {"against": a.against, "revert": frozenset(x for x in a.revert.split(",") if x)}
        for seed in range(a.seed, a.seed + a.slots):
            scn = gen_slot_scenario(seed, a.ops)
            res = run_slot_scenario(scn, models["llama"], spt, **kw)
            t.add(scn, res, seed)
            if res["first"] is not None and a.shrink:
                small = shrink_slot_scenario(scn, models["llama"], spt, **kw)
                r2 = run_slot_scenario(small, models["llama"], spt, **kw)
                if r2["first"] is not None:
                    t.diffs[-1]["shrunk"] = {"config": small["config"], "first": r2["first"],
                                             "requests": r2["requests"][: r2["first"]["index"] + 1]}  # fmt: skip
            if a.verbose:
                f = res["first"]
                print(f"  slots seed {seed} {scn['config']}: {res['agree']}/{res['total']}"
                      + ("" if f is None else f" first diff #{f['index']}: real {f['real']} kvlab {f['kvlab']}"),
                      flush=True)  # fmt: skip
        print(t.line(), flush=True)
        out["diffs"] += t.diffs
        rc |= bool(t.diffs)
    if a.swa:
        t = Tally("swa")
        for seed in range(a.seed, a.seed + a.swa):
            scn = gen_swa_scenario(seed, max(2, a.ops // 2))
            res = run_swa_scenario(scn, models["gemma3"], compare_created=not a.no_created)
            t.add(scn, res, seed)
            if a.verbose:
                f = res["first"]
                print(f"  swa seed {seed} {scn['config']}: {res['agree']}/{res['total']}"
                      + ("" if f is None else f" first diff #{f['index']}: real {f['real']} kvlab {f['kvlab']}"),
                      flush=True)  # fmt: skip
        print(t.line(), flush=True)
        out["diffs"] += t.diffs
        rc |= bool(t.diffs)
    if a.out is not None:
        a.out.write_text(json.dumps(out) + "\n")
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
