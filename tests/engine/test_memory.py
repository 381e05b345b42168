"""keep_freed_memory: glibc keeps freed blocks for reuse, so repeated scratch is not page-faulted in again.

Each case runs in a fresh interpreter: the setting is once per process, and what a
process allocated before changes glibc's own thresholds.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only"
)

_CLEAN = {
    k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))
}


def _run(code: str, *args: str, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_CLEAN, **env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_FAULTS = """
import json, resource, sys, torch
from kvlab.engine.memory import FREED_MEMORY, keep_freed_memory
if sys.argv[1] == "keep":
    keep_freed_memory()
sizes = json.loads(sys.argv[2])

def faults_per_round():
    # a decode call's pattern: several scratch buffers of a few MiB, freed at the end of the call
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        scratch = [torch.empty(n << 20, dtype=torch.uint8).fill_(1) for n in sizes]
        del scratch
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20

faults_per_round()  # the first round maps the memory
print(json.dumps({"kept": FREED_MEMORY.kept, "reason": FREED_MEMORY.reason, "faults": faults_per_round(),
                  "again": keep_freed_memory() is FREED_MEMORY}))
"""


def test_freed_scratch_is_reused_without_page_faults():
    sizes = json.dumps([1, 3, 8, 12])  # MiB each, on huge pages as the benchmark asks (THP_MEM_ALLOC_ENABLE)
    plain = _run(_FAULTS, "plain", sizes, THP_MEM_ALLOC_ENABLE="1")
    kept = _run(_FAULTS, "keep", sizes, THP_MEM_ALLOC_ENABLE="1")
    # glibc's own thresholds hand this scratch back to the kernel every round: about 520 faults here
    assert not plain["kept"] and plain["faults"] > 100, plain
    assert kept["kept"], kept["reason"]
    assert kept["again"]  # once per process: a second call returns the same record
    assert kept["faults"] < 3, kept


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"LD_PRELOAD": "/nonexistent/libtcmalloc_minimal.so.4"}, "tcmalloc is preloaded"),
        ({"MALLOC_TRIM_THRESHOLD_": "1048576"}, "MALLOC_TRIM_THRESHOLD_"),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=262144"}, "GLIBC_TUNABLES"),
    ],
)
def test_the_users_own_allocator_settings_stand(env, reason):
    code = (
        "import json; from kvlab.engine.memory import keep_freed_memory; s = keep_freed_memory(); "
        "print(json.dumps({'kept': s.kept, 'reason': s.reason}))"
    )
    out = _run(code, **env)
    assert not out["kept"]
    assert reason in out["reason"]


def test_the_compiled_decode_asks_for_it_when_it_first_compiles():
    code = """
import json, torch
from kvlab.engine import attention
from kvlab.engine.memory import FREED_MEMORY
before = FREED_MEMORY.asked
kc, vc = attention.layer_pool(64, 16, 8, 128, dtype=torch.float32, device="cpu")
kc.normal_(); vc.normal_()
tables = torch.arange(64, dtype=torch.int32).view(4, 16)
lens = torch.full((4,), 256, dtype=torch.int32)
attention.paged_attention(torch.randn(4, 32, 128), kc, vc, tables, lens, impl="torch")
print(json.dumps({"before": before, "after": FREED_MEMORY.asked, "compiled": bool(attention.COMPILED.kinds),
                  "kept": FREED_MEMORY.kept}))
"""
    out = _run(code)
    assert not out["before"]
    if not out["compiled"]:
        pytest.skip("torch.compile cannot build a CPU kernel here")
    assert out["after"] and out["kept"]


@pytest.mark.parametrize(
    ("preload", "reason"),
    [
        ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "jemalloc is preloaded"),
        ("/x/libhoard.so /y/libstdc++.so.6", "hoard is preloaded"),
        ("/a/b.so:libmimalloc.so", "mimalloc is preloaded"),
        ("/opt/not_jemalloc_shim.so", None),  # a file that only mentions an allocator is not one
        ("/usr/lib/libstdc++.so.6", None),
    ],
)
def test_a_preloaded_allocator_is_known_by_its_file_name(monkeypatch, preload, reason):
    from kvlab.engine import memory

    for name in memory._USER_MALLOC_VARIABLES + ("GLIBC_TUNABLES",):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LD_PRELOAD", preload)
    choice = memory._user_choice()
    assert choice is None if reason is None else reason in choice


def test_a_call_that_fails_changes_nothing_and_may_be_made_again(monkeypatch):
    from kvlab.engine import memory

    fresh = memory.FreedMemory()
    monkeypatch.setattr(memory, "FREED_MEMORY", fresh)

    def broken() -> tuple[str, str]:
        raise OSError("no libc here")

    monkeypatch.setattr(memory.platform, "libc_ver", broken)
    with pytest.raises(OSError):
        memory.keep_freed_memory()
    assert fresh == memory.FreedMemory()  # not marked as asked: the next call tries again
