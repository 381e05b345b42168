"""A real fleet on this machine: N ``kvlab serve`` replicas on loopback behind a router.

``Fleet.up(replicas=4, policy="cache_aware")`` starts each replica as ``python -m kvlab serve
--port 0`` (the replica picks a free port and prints it; nothing races for it), waits for its
``/health``, then starts the router in front of them and waits until the router lists every
replica. The router is SGLang's gateway, ``sglang-router`` (``python -m
sglang_router.launch_router``), or kvlab's own prefix-aware proxy (``kvlab.serve.router``) with
``router="kvlab"``; ``router="auto"`` takes sglang-router when it is installed and says plainly
when it falls back.

Every process runs in its own process group with its output in a log file (``fleet.log_dir``),
so stopping the fleet stops everything it started: SIGTERM to each group, SIGKILL after a few
seconds. That happens on ``down()``, when a ``with`` block ends (also on Ctrl-C or an error), on
any failure while starting, when the interpreter exits (``atexit``; a notebook kernel's exit or
restart included), and when the ``Fleet`` object is garbage collected (a weakref finalizer).
On Linux each child also gets SIGTERM should this process die without cleaning up.

Replicas run with one torch thread each (``kvlab serve --threads 1``) and ``OMP_NUM_THREADS=1``,
so N replicas share the machine's cores instead of fighting over them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.errors import InvalidArgumentError, KvlabError, brief, check_choice, check_size

ROUTERS = ("auto", "sglang", "kvlab")
SGLANG_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
KVLAB_POLICIES = ("cache_aware", "round_robin", "random")
STOP_GRACE_S = 5.0
_LISTENING = re.compile(r"listening on (http://[0-9.]+:\d+)")


class FleetError(KvlabError):
    """A replica or the router did not come up (the message names the process and quotes its log)."""


def sglang_router_version() -> str | None:
    """The installed sglang-router's version, or None when it is not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return version("sglang-router")
    except PackageNotFoundError:
        return None


def resolve_router(router: str) -> str:
    """``"sglang"`` or ``"kvlab"``: ``"auto"`` is sglang-router when installed, else kvlab's own."""
    router = check_choice("router", router, ROUTERS)
    if router == "sglang" and sglang_router_version() is None:
        raise InvalidArgumentError(
            "router='sglang' needs sglang-router: pip install sglang-router (or use router='kvlab')"
        )
    if router == "auto":
        return "sglang" if sglang_router_version() is not None else "kvlab"
    return router


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class Fleet:
    """A running fleet: ``url`` is the router's, ``replica_urls`` each replica's own."""

    router: str
    policy: str
    url: str
    replica_urls: list[str]
    log_dir: Path
    note: str = ""
    _processes: list[_Process] = field(default_factory=list, repr=False)
    _router_process: _Process | None = field(default=None, repr=False)
    _router_args: tuple[str, ...] = field(default=(), repr=False)
    _startup_timeout: float = field(default=120.0, repr=False)

    # ------------------------------------------------------------ starting

    @classmethod
    def up(
        cls,
        replicas: int = 4,
        *,
        router: str = "auto",
        policy: str = "cache_aware",
        num_blocks: int | None = None,
        max_model_len: int | None = None,
        serve_args: Sequence[str] = (),
        router_args: Sequence[str] = (),
        startup_timeout: float = 120.0,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> Fleet:
        """Start ``replicas`` kvlab serve replicas and the router; returns once every one answers.

        ``num_blocks`` and ``max_model_len`` go to each replica (``--num-blocks``,
        ``--max-model-len``), as do ``serve_args``; ``router_args`` go to the router (for
        sglang-router, e.g. ``["--balance-abs-threshold", "4"]``). ``startup_timeout`` bounds
        the whole start; on any failure everything started so far is stopped and ``FleetError``
        quotes the failing process's log.
        """
        replicas = check_size("replicas", replicas, "replicas", minimum=1)
        kind = resolve_router(router)
        policy = _check_policy(kind, policy)
        extra = _serve_options(num_blocks, max_model_len) + _check_args("serve_args", serve_args)
        router_extra = _check_args("router_args", router_args)
        if isinstance(startup_timeout, bool) or not isinstance(startup_timeout, (int, float)):
            raise InvalidArgumentError(f"startup_timeout must be seconds, got {brief(startup_timeout)}")
        if not 1 <= startup_timeout <= 3600:
            raise InvalidArgumentError(f"startup_timeout must be 1..3600 seconds, got {startup_timeout}")
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise InvalidArgumentError(f"log_dir must be a folder path, got {brief(log_dir)}")
        note = ""
        if router == "auto" and kind == "kvlab":
            note = "sglang-router is not installed (pip install sglang-router): using kvlab's own router"
        folder = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="kvlab-fleet-"))
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidArgumentError(
                f"log_dir {brief(str(folder))}: {exc.strerror or exc}; give a folder kvlab may create"
            ) from None
        fleet = cls(kind, policy, "", [], folder, note, _router_args=router_extra)
        fleet._startup_timeout = float(startup_timeout)
        _register(fleet)
        try:
            deadline = time.monotonic() + startup_timeout
            for i in range(replicas):
                fleet._processes.append(_spawn(f"replica-{i}", _serve_command(extra), folder))
            for proc in fleet._processes:
                fleet.replica_urls.append(_wait_listening(proc, deadline))
            for proc, url in zip(fleet._processes, fleet.replica_urls, strict=True):
                _wait_health(proc, url, deadline)
            fleet._start_router(deadline)
        except BaseException:
            fleet.down()
            raise
        return fleet

    def _start_router(self, deadline: float) -> None:
        port = free_port()
        if self.router == "sglang":
            command = [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--worker-urls",
                *self.replica_urls,
            ]
            command += ["--policy", self.policy, "--host", "127.0.0.1", "--port", str(port)]
            # sglang-router also serves Prometheus metrics, on port 29000 unless told: two fleets (or a
            # router of the user's own) would collide there, so it gets a free loopback port too
            if "--prometheus-port" not in self._router_args:
                command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
            command += ["--log-level", "warn", *self._router_args]
        else:
            command = [sys.executable, "-m", "kvlab.serve.router", "--worker-urls", *self.replica_urls]
            command += [
                "--policy",
                self.policy,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *self._router_args,
            ]
        proc = _spawn(f"router-{self.router}-{self.policy}", command, self.log_dir)
        self._router_process = proc
        self._processes.append(proc)
        self.url = f"http://127.0.0.1:{port}"
        _wait_workers(proc, self.url, len(self.replica_urls), deadline)

    def restart_router(
        self, policy: str, *, router: str | None = None, router_args: Sequence[str] | None = None
    ) -> str:
        """Stop the router and start one with ``policy`` in front of the same replicas; returns its URL.

        ``router`` switches the kind (``"sglang"``, ``"kvlab"``); ``router_args`` replace the
        router's options. The replicas keep running, and keep their caches (``reset_caches()``
        empties them).
        """
        kind = self.router if router is None else resolve_router(router)
        policy = _check_policy(kind, policy)
        if router_args is not None:
            self._router_args = _check_args("router_args", router_args)
        if not self.replica_urls:
            raise FleetError("the fleet is down; start a new one with Fleet.up(...)")
        if self._router_process is not None:
            _stop([self._router_process])
            self._processes.remove(self._router_process)
            self._router_process = None
        self.router, self.policy = kind, policy
        try:
            self._start_router(time.monotonic() + self._startup_timeout)
        except BaseException:
            self.down()
            raise
        return self.url

    # ------------------------------------------------------------ using

    def reset_caches(self) -> None:
        """Empty every replica's prefix cache (``POST /reset_prefix_cache``), as a fresh fleet has."""
        import httpx

        for url in self.replica_urls:
            resp = httpx.post(url + "/reset_prefix_cache", timeout=10.0)
            if resp.status_code != 200:
                raise FleetError(
                    f"{url}/reset_prefix_cache answered HTTP {resp.status_code}: {resp.text[:200]}"
                )

    @property
    def pids(self) -> list[int]:
        """Process ids of everything this fleet started and has not stopped."""
        return [p.popen.pid for p in self._processes if p.popen.poll() is None]

    def kill_replica(self, index: int) -> None:
        """Kill replica ``index`` at once (SIGKILL), as a crash would: for fail-over experiments."""
        replicas = [p for p in self._processes if p.name.startswith("replica-")]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(replicas):
            raise InvalidArgumentError(
                f"index must be a replica number 0..{len(replicas) - 1}, got {brief(index)}"
            )
        _kill_group(replicas[index].popen, signal.SIGKILL)
        replicas[index].popen.wait(timeout=STOP_GRACE_S)

    def down(self) -> None:
        """Stop every process of the fleet (SIGTERM, then SIGKILL); safe to call twice."""
        _stop(self._processes)
        self._processes.clear()
        self._router_process = None
        _unregister(self)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def describe(self) -> str:
        names = {"sglang": f"sglang-router {sglang_router_version()}", "kvlab": "kvlab's router"}
        return f"{len(self.replica_urls)} kvlab serve replicas behind {names[self.router]} ({self.policy}) at {self.url}"


# ---------------------------------------------------------------- processes

_LIVE: dict[int, list[_Process]] = {}
_LIVE_LOCK = threading.Lock()


def _register(fleet: Fleet) -> None:
    """Stop this fleet's processes at interpreter exit or when the object is collected."""
    with _LIVE_LOCK:
        _LIVE[id(fleet)] = fleet._processes
    weakref.finalize(fleet, _stop, fleet._processes)


def _unregister(fleet: Fleet) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(id(fleet), None)


@atexit.register
def _stop_everything() -> None:
    with _LIVE_LOCK:
        groups = list(_LIVE.values())
        _LIVE.clear()
    for processes in groups:
        _stop(processes)


def _child_setup() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Own process group; on Linux, SIGTERM when the parent dies without stopping us."""
    os.setpgrp()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _spawn(name: str, command: list[str], folder: Path) -> _Process:
    log = folder / f"{name}.log"
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    package_root = str(Path(__file__).resolve().parents[2])  # kvlab importable even when not installed
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    # the death signal follows the thread that forks: only ask for it from the main thread
    setup = _child_setup if threading.current_thread() is threading.main_thread() else os.setpgrp
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=setup
        )
    return _Process(name, popen, log)


def _kill_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def _stop(processes: list[_Process]) -> None:
    """SIGTERM every process group, wait up to ``STOP_GRACE_S``, SIGKILL what is left, reap all."""
    live = [p for p in processes if p.popen.poll() is None]
    for p in live:
        _kill_group(p.popen, signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    for p in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(timeout=max(0.0, end - time.monotonic()))
    for p in processes:
        _kill_group(p.popen, signal.SIGKILL)  # the group too: anything a child left behind
        if p.popen.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=STOP_GRACE_S)


def _serve_command(extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kvlab",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--threads",
        "1",
        *extra,
    ]


def _serve_options(num_blocks: int | None, max_model_len: int | None) -> list[str]:
    out: list[str] = []
    if num_blocks is not None:
        out += ["--num-blocks", str(check_size("num_blocks", num_blocks, "num_blocks", minimum=1))]
    if max_model_len is not None:
        out += ["--max-model-len", str(check_size("max_model_len", max_model_len, "tokens", minimum=2))]
    return out


def _check_args(name: str, args: object) -> list[str]:
    if (
        isinstance(args, (str, bytes))
        or not isinstance(args, Sequence)
        or not all(isinstance(a, str) for a in args)
    ):
        raise InvalidArgumentError(
            f"{name} must be a list of strings (command-line options), got {brief(args)}"
        )
    return list(args)


def _check_policy(router: str, policy: object) -> str:
    choices = SGLANG_POLICIES if router == "sglang" else KVLAB_POLICIES
    return check_choice("policy", policy, choices)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for the router, which cannot pick its own and report it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _failed(proc: _Process, what: str) -> FleetError:
    code = proc.popen.poll()
    status = f"exited with status {code}" if code is not None else "still running"
    return FleetError(f"{proc.name} {what} ({status}); its log {proc.log}:\n{proc.log_tail()}")


def _wait_listening(proc: _Process, deadline: float) -> str:
    """The URL a replica prints once bound (``kvlab serve: listening on http://...``)."""
    while time.monotonic() < deadline:
        found = _LISTENING.search(proc.log_tail(4000))
        if found:
            return found.group(1)
        if proc.popen.poll() is not None:
            raise _failed(proc, "stopped before listening")
        time.sleep(0.1)
    raise _failed(proc, "did not start listening in time")


def _wait_health(proc: _Process, url: str, deadline: float) -> None:
    import httpx

    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise _failed(proc, "stopped before answering /health")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.1)
    raise _failed(proc, f"did not answer {url}/health in time")


def _wait_workers(proc: _Process, url: str, count: int, deadline: float) -> None:
    """Until the router lists ``count`` healthy workers at ``/workers`` (both routers answer it)."""
    import httpx

    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise _failed(proc, "stopped before listing its workers")
        with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
            resp = httpx.get(url + "/workers", timeout=2.0)
            workers = resp.json().get("workers", []) if resp.status_code == 200 else []
            if sum(1 for w in workers if w.get("is_healthy", True)) >= count:
                return
        time.sleep(0.1)
    raise _failed(proc, f"did not list {count} workers at {url}/workers in time")
