"""The child process of ``kvlab.exercises.sandbox.SandboxFunction``: define one function, answer calls.

Run as a script (``python sandbox_child.py MEMORY_MIB CPU_SECONDS``), not as part of the package, so
it starts without importing kvlab: it loads ``plain.py`` and ``guard.py``, which import nothing of
kvlab's, from beside itself. The student's code may import kvlab as usual. Limits: an address space
of MEMORY_MIB, CPU_SECONDS of CPU, 16 MiB of files, no core dumps. Protocol: the parent writes
length-prefixed messages on stdin (a JSON header with the source and the function's name, then
pickled argument tuples); the child answers one JSON line per message on a copy of fd 1 made before
fds 0, 1 and 2 are pointed at /dev/null, so the student's printing cannot reach the parent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import struct
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT_LIMIT = 16 * 2**20  # bytes a student's function may write to files in the child's folder


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_kvlab_sandbox_{name}", os.path.join(HERE, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _limit(memory_mib: int, cpu_seconds: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_mib * 2**20, memory_mib * 2**20))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, OUTPUT_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child(memory_mib: int, cpu_seconds: int) -> None:
    """Define the function, then answer calls until stdin closes. Student code cannot reach fd 1."""
    inbox = os.fdopen(os.dup(0), "rb")
    outbox = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    quiet = [open(os.devnull, mode) for mode in ("r", "w", "w")]  # noqa: SIM115 - for the process's life
    sys.stdin, sys.stdout, sys.stderr = quiet
    _limit(memory_mib, cpu_seconds)
    become_subreaper()  # orphans of the student's processes stay below this one, for the parent to end

    def send(reply: dict[str, Any]) -> None:
        outbox.write(json.dumps(reply, allow_nan=True).encode() + b"\n")
        outbox.flush()

    def receive() -> bytes | None:
        head = inbox.read(4)
        if len(head) < 4:
            return None
        return inbox.read(struct.unpack(">I", head)[0])

    header = json.loads(receive() or b"{}")
    namespace: dict[str, Any] = {"__name__": "__main__"}
    try:
        exec(compile(header["source"], "<your exercise cell>", "exec"), namespace)
        function = namespace.get(header["name"])
        if not callable(function):
            send({"error": f"the cell defines no function named {header['name']}"})
            return
    except SystemExit:
        send({"error": "your exercise cell called sys.exit() or exit() when it was run"})
        return
    except BaseException as exc:
        send({"error": f"your exercise cell raised {what_was_raised(exc)} when it was run"})
        return
    send({"ok": True})
    while (payload := receive()) is not None:
        args = pickle.loads(payload)
        try:
            out = function(*args)
            reply = {"value": encode(out)}
        except SystemExit:
            reply = {"exit": True}
        except BaseException as exc:
            reply = {"raised": what_was_raised(exc)}
        send(reply)


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == HERE:
        sys.path.pop(0)  # this folder's modules are not top-level modules of the student's code
    encode = _load("plain").encode
    guard = _load("guard")
    what_was_raised, become_subreaper = guard.what_was_raised, guard.become_subreaper
    _child(int(sys.argv[1]), int(sys.argv[2]))
