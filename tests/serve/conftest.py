"""Servers for the serve tests: real ``kvlab serve`` subprocesses on free 127.0.0.1 ports, one per session.

Each is started once (the suite stays fast) and stopped at the end; every HTTP call
in the tests has a bounded timeout.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from serve_settings import BLOCK_SIZE, BLOCKS_POOL, SLOTS, TIMEOUT  # noqa: E402

from kvlab.serve import start_server  # noqa: E402


@pytest.fixture(scope="session")
def blocks_server():
    server = start_server(use_env=False, cache="blocks", block_size=BLOCK_SIZE, num_blocks=BLOCKS_POOL,
                          max_num_seqs=64)  # fmt: skip
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="session")
def slot_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slot-save")


@pytest.fixture(scope="session")
def slot_server(slot_dir):
    server = start_server(
        use_env=False, cache="slot", slots=SLOTS, max_model_len=1024, slot_save_path=str(slot_dir)
    )
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="session")
def client(blocks_server):
    with httpx.Client(base_url=blocks_server.url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="session")
def slot_client(slot_server):
    with httpx.Client(base_url=slot_server.url, timeout=TIMEOUT) as c:
        yield c
