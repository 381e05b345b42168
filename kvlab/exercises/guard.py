"""The pieces that keep a student's function from taking a check down with it.

``deadline`` raises ``TimeUp`` inside code that runs too long (a signal, so only in the main thread,
where a notebook runs its cells); ``Capped`` is a stdout that keeps the first ``PRINT_LIMIT``
characters; ``what_was_raised`` names an exception without running the student's ``__str__``.
``core.StudentFunction`` puts them together around each call. ``become_subreaper`` and
``kill_descendants`` let the processes that run student code end everything it started. This module imports nothing of
kvlab's, so the sandbox's child process (``sandbox_child.py``) can load it on its own.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

PRINT_LIMIT = 2_000  # characters of a student function's printing kept per check


class TimeUp(BaseException):
    """Raised inside a student's function when its check's time is up (a BaseException: ``except
    Exception`` in the student's loop does not swallow it)."""


class Capped(io.TextIOBase):
    """A stdout that keeps the first ``PRINT_LIMIT`` characters and counts the rest."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.size = 0

    def write(self, text: Any) -> int:
        text = text if type(text) is str else "<not text>"
        room = PRINT_LIMIT - self.size
        if room > 0:
            self.kept.append(text[:room])
        self.size += len(text)
        return len(text)

    def writable(self) -> bool:
        return True


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise TimeUp in the running code after ``seconds``; only in the main thread (a signal), else no limit."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def time_up(signum: int, frame: Any) -> None:
        raise TimeUp

    previous = signal.signal(signal.SIGALRM, time_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def what_was_raised(exc: BaseException) -> str:
    """ "TypeError: ..." for an exception, without running code of the student's class."""
    try:  # the real class name: a metaclass of the student's could answer __name__ otherwise
        name = type.__dict__["__name__"].__get__(type(exc))
    except Exception:
        name = "an exception"
    name = name if type(name) is str else "an exception"
    if type(exc).__module__ != "builtins":
        return name  # a class of the student's: its __str__ could do anything
    try:
        text = BaseException.__str__(exc)
    except BaseException:  # an argument whose repr fails
        text = ""
    text = text if type(text) is str else ""
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{name}: {text}" if text else name


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants (Linux), so a daemon a student starts stays findable.

    Without it, a process that calls ``setsid`` and outlives its parent is re-parented to init and
    escapes both the process-group kill and ``kill_descendants``. False where prctl is unavailable.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), read from /proc; empty where there is no /proc."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        parents.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def kill_descendants(pid: int, rounds: int = 5) -> None:
    """SIGKILL everything below ``pid``, a few rounds over (a process may fork while the first runs)."""
    for _ in range(rounds):
        found = descendants(pid)
        if not found:
            return
        for child in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
