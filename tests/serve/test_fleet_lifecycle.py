"""A fleet's processes: it comes up, goes down leaving nothing, stops on a failed start, and a replica
that dies mid-run makes requests fail over or fail cleanly without hanging the load generator.

Every process runs on 127.0.0.1 and every wait is bounded; each test checks that none of the
processes it started is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from kvlab.fleet import FleetConfig
from kvlab.serve.fleet import Fleet, FleetError, sglang_router_version
from kvlab.serve.load import replay

SMALL = {"num_blocks": 200, "max_model_len": 1024, "startup_timeout": 120}
ROUTERS = [
    "kvlab",
    pytest.param(
        "sglang",
        marks=pytest.mark.skipif(sglang_router_version() is None, reason="sglang-router is not installed"),
    ),
]


def _alive(pid: int) -> bool:
    """Whether ``pid`` is still a live process (a reaped child is gone; a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=2.0)
    except httpx.ConnectError:
        return True
    return False


def test_fleet_comes_up_answers_and_goes_down_leaving_no_process():
    with Fleet.up(1, router="kvlab", policy="round_robin", **SMALL) as fleet:
        pids = fleet.pids
        assert len(pids) == 2 and all(_alive(p) for p in pids)  # one replica and the router
        assert httpx.get(fleet.url + "/health", timeout=5).status_code == 200
        body = {"model": "kvlab-tiny", "prompt": " A B C", "max_tokens": 2}
        resp = httpx.post(fleet.url + "/v1/completions", json=body, timeout=30)
        assert resp.status_code == 200 and resp.headers["x-kvlab-replica"] == fleet.replica_urls[0]
        urls = [fleet.url, *fleet.replica_urls]
    assert not any(_alive(p) for p in pids)
    assert all(_refused(u) for u in urls)
    fleet.down()  # twice is fine


def test_a_failed_start_stops_what_it_started_and_quotes_the_log():
    before = set(_children())
    with pytest.raises(FleetError, match="(?s)replica-0 stopped before listening.*num_blocks must be"):
        Fleet.up(2, router="kvlab", num_blocks=4, startup_timeout=60)  # too few blocks: serve refuses
    time.sleep(0.2)
    assert not [p for p in set(_children()) - before if _alive(p)]


@pytest.mark.parametrize("router", ROUTERS)
def test_a_killed_replica_fails_over_or_fails_cleanly(router):
    config = FleetConfig(users=8, turns=3, system_tokens=64, capacity_blocks=400)
    with Fleet.up(2, router=router, policy="round_robin", **SMALL) as fleet:
        pids = fleet.pids
        out = {}

        def run() -> None:
            out["result"] = replay(fleet.url, config, answer_tokens=8, concurrency=2,
                                   replica_urls=fleet.replica_urls, request_timeout=10, deadline=90)  # fmt: skip

        worker = threading.Thread(target=run, daemon=True)
        start = time.monotonic()
        worker.start()
        _wait_for_traffic(fleet.replica_urls[1])
        fleet.kill_replica(1)
        worker.join(timeout=120)
        assert not worker.is_alive(), "the load generator hung after a replica died"
        result = out["result"]
        assert time.monotonic() - start < 120
        assert len(result.requests) == config.users * config.turns
        assert len(result.ok) > 0
        for r in result.failed:  # a failure says why
            assert r.error
        if router == "kvlab":  # kvlab's router retries on the other replica: nothing is lost
            assert not result.failed, [r.error for r in result.failed][:3]
        assert not result.replicas  # a replica is gone: the hit rate comes from the responses
    assert not any(_alive(p) for p in pids)


def test_fleet_up_cli_prints_the_router_url_and_stops_everything_on_ctrl_c():
    cmd = [sys.executable, "-m", "kvlab", "fleet-up", "--replicas", "1", "--router", "kvlab", "--num-blocks", "200",
           "--max-model-len", "1024"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("router: "):
                break
        router = lines[-1].split()[-1]
        replica = next(line.split()[-1] for line in lines if "replica 0:" in line)
        assert httpx.get(router + "/health", timeout=5).status_code == 200
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert "stopped every replica and the router" in proc.stdout.read()
    assert _refused(router) and _refused(replica)


def test_fleet_up_cli_refuses_a_bad_policy_with_status_2():
    cmd = [sys.executable, "-m", "kvlab", "fleet-up", "--router", "kvlab", "--policy", "fastest"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "policy" in done.stderr


def _wait_for_traffic(url: str, timeout: float = 60.0) -> None:
    """Until replica ``url`` has served a request (its prefix-cache queries are above zero)."""
    from kvlab.serve.load import parse_counters

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        counters = parse_counters(httpx.get(url + "/metrics", timeout=5).text)
        if counters and counters[0] > 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"{url} served nothing in {timeout} s")


def _children() -> list[int]:
    """Every process whose parent is this one."""
    me = str(os.getpid())
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if f.read().split(")")[-1].split()[1] == me:
                        out.append(int(name))
            except (FileNotFoundError, IndexError):
                continue
    return out
