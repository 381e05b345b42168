"""``python -m kvlab serve``: the tiny engine as an HTTP server (OpenAI and llama-server APIs, metrics).

Binds 127.0.0.1 unless ``--host`` says otherwise. Bad options exit with status 2
and one line saying what to change; Ctrl-C (SIGINT) or SIGTERM stops it cleanly.
"""

from __future__ import annotations

import argparse
import signal
import sys

from kvlab.cli.options import OneLineParser, whole_number
from kvlab.errors import KvlabError


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m kvlab serve", description=__doc__.splitlines()[0])
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=whole_number, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--cache", choices=("blocks", "slot", "off"), default="blocks",
                   help="blocks: vLLM's prefix cache; slot: llama-server's slots; off: no reuse")  # fmt: skip
    p.add_argument("--block-size", type=whole_number, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--num-blocks", type=whole_number, default=None,
                   help="blocks in the KV pool (default: 4 contexts' worth; one context per slot)")  # fmt: skip
    p.add_argument("--slots", type=whole_number, default=1, help="llama-server slots (-np) with --cache slot")
    p.add_argument(
        "--max-num-seqs", type=whole_number, default=256, help="most requests running at once (default 256)"
    )
    p.add_argument(
        "--max-model-len", type=whole_number, default=4096, help="context: prompt + output tokens (4096)"
    )
    p.add_argument("--num-layers", type=whole_number, default=4, help="the tiny model's layers (default 4)")
    p.add_argument("--d-model", type=whole_number, default=256, help="the tiny model's width (default 256)")
    p.add_argument("--served-model-name", default="kvlab-tiny", help="the model's name in the APIs")
    p.add_argument("--slot-save-path", default=None, help="directory for /slots/N?action=save|restore")
    p.add_argument(
        "--api-key", default=None, help="require Authorization: Bearer KEY (all routes but /health)"
    )
    p.add_argument("--threads", type=whole_number, default=1, help="torch CPU threads (default 1)")
    p.add_argument(
        "--log-level", choices=("critical", "error", "warning", "info", "debug"), default="warning"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torch
        import uvicorn

        from kvlab.serve.app import create_app
        from kvlab.serve.config import ServeConfig, build_scheduler
        from kvlab.serve.runner import EngineRunner
    except ImportError as exc:
        print(f"kvlab serve: {exc}; install the engine extra: pip install 'kvlab[engine]'", file=sys.stderr)
        return 2
    try:
        config = ServeConfig(host=args.host, port=args.port, cache=args.cache, block_size=args.block_size,
                             num_blocks=args.num_blocks, slots=args.slots, max_num_seqs=args.max_num_seqs,
                             max_model_len=args.max_model_len, num_layers=args.num_layers, d_model=args.d_model,
                             slot_save_path=args.slot_save_path, api_key=args.api_key,
                             model_name=args.served_model_name, threads=args.threads)  # fmt: skip
        torch.set_num_threads(config.threads)
        scheduler = build_scheduler(config)
    except KvlabError as exc:
        print(f"kvlab serve: {exc}", file=sys.stderr)
        return 2
    app = create_app(config, EngineRunner(scheduler))
    # keep-alive 30 s, not uvicorn's 5: on a loaded machine the 5 s timer can fire before a client's next
    # request on the same connection is read, and the client sees the connection dropped
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=args.log_level,
                                           access_log=False, lifespan="on", timeout_keep_alive=30))  # fmt: skip
    _announce(server, config)
    stopped: list[int] = []
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler
    # that was there before it: ours notes it, so a requested stop exits with status 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stopped.append(signum))
    server.run()
    return 0 if server.started or stopped else 1


def _announce(server: object, config: object) -> None:
    """Print ``kvlab serve: listening on http://HOST:PORT`` once bound (the port may have been 0)."""
    import uvicorn

    assert isinstance(server, uvicorn.Server)
    original = server.startup

    async def startup(sockets=None) -> None:  # type: ignore[no-untyped-def]
        await original(sockets=sockets)
        for srv in getattr(server, "servers", []):
            for sock in srv.sockets:
                host, port = sock.getsockname()[:2]
                print(f"kvlab serve: listening on http://{host}:{port}", flush=True)
                return

    server.startup = startup  # type: ignore[method-assign]
