"""Keep freed memory for reuse, so the compiled CPU decode's scratch is not page-faulted in every call.

Every call of the compiled decode (``kvlab.engine.attention``) allocates a few
megabytes of scratch: each chunk's scores, and each chunk's partial output
before a sequence's chunks are merged (about 256 bytes per cached token at 32
query heads of 128 floats). When torch asks for huge pages
(``THP_MEM_ALLOC_ENABLE=1``, as ``benchmarks/paged_attention.py`` does), it
allocates such blocks 2 MiB-aligned, and glibc's malloc, left to itself,
served them with fresh ``mmap``s or trimmed them off the top of its heap once
they were freed, so every call took a page fault per page and the kernel
zeroed each page again: at 8 x 4k tokens, 2 threads, on a 2-core AMD EPYC,
about 520 faults per call and 16.8-21.7 ms in some processes against 12-13 ms
in others (glibc moves its thresholds as blocks are freed, so it depends on
what the process did before). On 4 KiB pages glibc reused the blocks in the
runs measured; keeping them costs nothing there.

vLLM 0.33 meets allocation costs on the CPU by putting tcmalloc in ``LD_PRELOAD``
for its workers (``vllm/platforms/cpu.py``, "to reduce memory allocation
overhead"; ``cpu_worker.py`` warns when it is missing). A running notebook
kernel cannot preload a library, so ``keep_freed_memory`` asks glibc for the
equivalent with ``mallopt``: blocks below ``MMAP_THRESHOLD_BYTES`` come from the
heap, and up to ``TRIM_THRESHOLD_BYTES`` of free memory at its top stays mapped
rather than being returned: the process keeps what it freed for its next
allocations instead of handing it back to the system. The decode calls this once,
when it first compiles; nothing is changed off glibc, or where the user chose
for themselves (an allocator in ``LD_PRELOAD``, glibc's own malloc variables).
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
from dataclasses import dataclass

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD_BYTES = 256 << 20

# the user's own malloc settings, which are left as they are
_USER_MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
# allocators a user preloads in place of glibc's malloc, matched by the library's file name
_OTHER_ALLOCATORS = (
    "tcmalloc",
    "jemalloc",
    "mimalloc",
    "hoard",
    "snmalloc",
    "rpmalloc",
    "tbbmalloc",
    "scalloc",
)
_ALLOCATOR_FILE = re.compile(rf"^(?:lib)?({'|'.join(_OTHER_ALLOCATORS)})(?:[_.\-]|$)")


@dataclass
class FreedMemory:
    """What ``keep_freed_memory`` did in this process: ``kept`` whether glibc now keeps freed memory, and why not if not."""

    asked: bool = False
    kept: bool = False
    reason: str = "not asked yet"


FREED_MEMORY = FreedMemory()


def _user_choice() -> str | None:
    """Why the user's own allocator settings stand, if they made any."""
    preload = os.environ.get("LD_PRELOAD", "")  # paths separated by spaces or colons (ld.so(8))
    files = (os.path.basename(path) for path in re.split(r"[\s:]+", preload) if path)
    other = next((m.group(1) for m in map(_ALLOCATOR_FILE.match, files) if m), None)
    if other is not None:
        return f"{other} is preloaded (LD_PRELOAD)"
    named = [name for name in _USER_MALLOC_VARIABLES if name in os.environ]
    if "malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        named.append("GLIBC_TUNABLES")
    return f"the user set {', '.join(named)}" if named else None


def keep_freed_memory() -> FreedMemory:
    """Ask glibc, once per process, to keep freed blocks for reuse instead of returning them (see the module).

    Returns ``FREED_MEMORY``, which says whether it did and why not: off Linux's glibc,
    or where the user set their own allocator or malloc variables, nothing changes.
    """
    if FREED_MEMORY.asked:
        return FREED_MEMORY
    libc_name, _ = platform.libc_ver()
    choice = _user_choice()
    if platform.system() != "Linux" or libc_name != "glibc":
        FREED_MEMORY.reason = f"the C library is not glibc ({platform.system()}, {libc_name or 'unknown'})"
    elif choice is not None:
        FREED_MEMORY.reason = choice
    else:
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        done = done and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
        FREED_MEMORY.kept = done
        FREED_MEMORY.reason = (
            f"glibc serves blocks under {MMAP_THRESHOLD_BYTES >> 20} MiB from its heap and keeps up to "
            f"{TRIM_THRESHOLD_BYTES >> 20} MiB of freed memory"
            if done
            else "glibc refused mallopt"
        )
    FREED_MEMORY.asked = True  # last: a call that raised has changed nothing and may be made again
    return FREED_MEMORY
