"""Re-run a student's function in a separate, time- and memory-limited process.

The grader (``kvlab/exercises/grading.py``) never calls a submitted function in
its own process. ``SandboxFunction`` starts a child process
(``sandbox_child.py``) with the function's source; that child defines the function and then answers
one call at a time: the grader sends the arguments (pickled: they are the
grader's own cases, so only the child unpickles), the child sends back what the
function returned as ``plain`` JSON, never an object. So a returned lying
object reaches the checker as the plain value it holds, a function that loops
is killed when its time is up, and one that exits only ends the child.

A ``SandboxFunction`` is a callable the checkers use like the student's own
function in the notebook; its failures are ``NotYet`` with a reason.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvlab.exercises.core import TRUSTED_FUNCTIONS, NotYet
from kvlab.exercises.guard import kill_descendants
from kvlab.exercises.plain import decode

MAX_REPLY = 64 * 2**20  # bytes of one answer from the child
CHILD = Path(__file__).with_name("sandbox_child.py")  # run as a script: it imports no kvlab package


def without_checks(source: str) -> str:
    """``source`` minus its top-level ``check(...)`` and ``hint(...)`` calls (SyntaxError if it has one)."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if not _is_check_call(node)]
    return ast.unparse(tree)


def _is_check_call(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id in ("check", "hint")
    )


class SandboxFunction:
    """The student's function ``name`` defined by ``source``, run in a child process on each call.

    ``seconds`` bounds all calls together, the child's start included; ``memory_mib`` is the
    child's address-space limit. ``close()`` (or garbage collection) ends the child.
    """

    def __init__(self, source: str, name: str, *, seconds: float = 20.0, memory_mib: int = 2048) -> None:
        self.source, self.name = source, name
        self.seconds, self.memory_mib = seconds, memory_mib
        self.deadline = 0.0
        self.child: subprocess.Popen[bytes] | None = None
        self.failure: str | None = None  # once the child is gone, every later call says why
        self.__name__ = name

    def __call__(self, *args: Any) -> Any:
        if self.failure:
            raise NotYet(self.failure)
        if self.child is None:
            self._start()
        reply = self._ask(pickle.dumps(args, protocol=4), args)
        if "value" in reply:
            return decode(reply["value"])
        if "exit" in reply:
            self._fail(f"your function called sys.exit() or exit() (called with {_shown(args)})")
        raise NotYet(f"your function raised {reply.get('raised', 'an error')} (called with {_shown(args)})")

    def _start(self) -> None:
        self.deadline = time.monotonic() + self.seconds
        self.folder = tempfile.TemporaryDirectory(prefix="kvlab-sandbox-")
        self.child = subprocess.Popen(
            [sys.executable, str(CHILD), str(self.memory_mib), str(int(self.seconds) + 2)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.folder.name,
            env=child_env(),
            start_new_session=True,
        )
        header = json.dumps({"source": self.source, "name": self.name}).encode()
        reply = self._ask(header, None)
        if "error" in reply:
            self._fail(str(reply["error"]))

    def _ask(self, payload: bytes, args: tuple[Any, ...] | None) -> dict[str, Any]:
        assert self.child is not None and self.child.stdin is not None and self.child.stdout is not None
        try:
            self.child.stdin.write(struct.pack(">I", len(payload)) + payload)
            self.child.stdin.flush()
        except (BrokenPipeError, OSError):
            self._gone(args)
        line = self._read_line(args)
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: a line nested past the parser's depth
            reply = None
        if type(reply) is not dict:
            self._fail("your code wrote over the grader's answer channel")
        return reply

    def _read_line(self, args: tuple[Any, ...] | None) -> bytes:
        assert self.child is not None and self.child.stdout is not None
        fd = self.child.stdout.fileno()
        chunks: list[bytes] = []
        size = 0
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                what = f"(called with {_shown(args)})" if args is not None else "while its cell was run"
                self._fail(
                    f"your function did not finish within {self.seconds:g} s {what}; "
                    "is there a loop that never ends?"
                )
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._gone(args)
            chunks.append(chunk)
            size += len(chunk)
            if b"\n" in chunk:
                return b"".join(chunks).split(b"\n", 1)[0]
            if size > MAX_REPLY:
                self._fail("your function returned more data than any answer needs")

    def _gone(self, args: tuple[Any, ...] | None) -> None:
        code = self.child.wait() if self.child is not None else None
        when = f"(called with {_shown(args)})" if args is not None else "while its cell was run"
        if code is not None and code < 0 and -code in (signal.SIGKILL, signal.SIGSEGV):
            self._fail(f"your code was stopped {when}: it ran out of memory or crashed")
        self._fail(f"your code ended the process {when} (os._exit, or a crash)")

    def _fail(self, message: str) -> None:
        self.failure = message
        self.close()
        raise NotYet(message)

    def close(self) -> None:
        """End the child process (and anything it started)."""
        if self.child is not None and self.child.poll() is None:
            kill_descendants(self.child.pid)  # the child adopted any orphan (become_subreaper)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child.pid, signal.SIGKILL)
            self.child.wait()
        if self.child is not None:
            for stream in (self.child.stdin, self.child.stdout):
                with contextlib.suppress(OSError):
                    stream.close() if stream else None
        folder = getattr(self, "folder", None)
        if folder is not None:
            folder.cleanup()
            self.folder = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def child_env() -> dict[str, str]:
    """The environment of a process that runs student code: this kvlab importable, no KVLAB_ settings."""
    import kvlab

    env = {k: v for k, v in os.environ.items() if not k.startswith("KVLAB_")}
    root = os.path.dirname(os.path.dirname(os.path.abspath(kvlab.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update({"PYTHONHASHSEED": "0", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"})
    return env


TRUSTED_FUNCTIONS.add(SandboxFunction)


def _shown(args: tuple[Any, ...] | None) -> str:
    from kvlab.errors import brief

    return ", ".join(brief(a, 40) for a in args or ())
