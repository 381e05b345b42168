"""The ASGI app: routes, the API-key and body-size guard, and error bodies instead of tracebacks.

Besides the OpenAI and llama-server routes (``openai_api``, ``llama_api``): ``/health``,
``/metrics`` (``metrics``), ``POST /reset_prefix_cache`` (vLLM's: waits until no request
holds blocks, admitting none meanwhile, then forgets every cached prefix), and
SGLang's ``/server_info`` and ``/model_info`` (also as ``/get_server_info`` and
``/get_model_info``), which sglang-router polls.

With ``api_key`` every route but ``/health`` needs ``Authorization: Bearer KEY`` (401
otherwise; vLLM guards only ``/v1``, llama-server all but its health and model routes).
"""

from __future__ import annotations

import hmac
import json
import sys
import traceback

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

import kvlab
from kvlab.serve import llama_api, openai_api
from kvlab.serve.config import ServeConfig
from kvlab.serve.metrics import render_metrics
from kvlab.serve.protocol import ApiError, error_body
from kvlab.serve.runner import EngineRunner
from kvlab.serve.state import ServerState, get_state

OPEN_PATHS = frozenset({"/health", "/v1/health"})
LLAMA_PREFIXES = ("/completion", "/tokenize", "/detokenize", "/slots")


def _is_llama(path: str) -> bool:
    return path.startswith(LLAMA_PREFIXES)


class Guard:
    """Pure ASGI middleware (streams pass through untouched): API key, then the declared body size."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.api_key = None if api_key is None else f"Bearer {api_key}".encode()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_headers = scope.get("headers") or []
        headers = dict(raw_headers)
        path = scope.get("path", "")
        if self.api_key is not None and path not in OPEN_PATHS:
            # exactly one Authorization header: with two, layers that read the first and the last disagree
            given = [value for key, value in raw_headers if key == b"authorization"]
            if len(given) != 1 or not hmac.compare_digest(given[0], self.api_key):
                body = error_body("Unauthorized: give the server's API key as Authorization: Bearer KEY", 401,
                                  llama=_is_llama(path))  # fmt: skip
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            body = error_body(
                f"the request body is over {self.max_body_bytes:,} bytes", 413, llama=_is_llama(path)
            )
            await JSONResponse(body, status_code=413)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(config: ServeConfig, runner: EngineRunner) -> FastAPI:
    """The app for ``config``; ``runner`` is started with the app and stopped with it."""
    app = FastAPI(title="kvlab serve", version=getattr(kvlab, "__version__", "0"), docs_url=None,
                  redoc_url=None, openapi_url=None)  # fmt: skip
    app.state.kvlab = ServerState(config, runner)
    app.include_router(openai_api.router)
    app.include_router(llama_api.router)
    _add_server_routes(app)
    _add_error_handlers(app)
    app.router.on_startup.append(runner.start)
    app.router.on_shutdown.append(runner.stop)
    app.add_middleware(Guard, api_key=config.api_key, max_body_bytes=config.max_body_bytes)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        body = error_body(
            exc.message, exc.status, param=exc.param, llama=_is_llama(request.url.path), kind=exc.kind
        )
        return JSONResponse(body, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = {
            404: f"no route {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }
        body = error_body(message.get(exc.status_code, str(exc.detail)), exc.status_code,
                          llama=_is_llama(request.url.path))  # fmt: skip
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(
        request: Request, exc: Exception
    ) -> JSONResponse:  # a bug: log it, answer without a traceback
        print(
            f"kvlab serve: {request.method} {request.url.path} failed:\n{traceback.format_exc()}",
            file=sys.stderr,
        )
        return JSONResponse(error_body("internal error; see the server's log", 500), status_code=500)


def _add_server_routes(app: FastAPI) -> None:
    @app.get("/health")
    @app.get("/v1/health")
    async def health(request: Request) -> Response:
        st = get_state(request)
        if not st.runner.alive:
            return JSONResponse(error_body("the engine is not running", 503), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        st = get_state(request)
        text = render_metrics(st.runner.scheduler.counters, st.runner.gauges, st.config.model_name)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        st = get_state(request)
        sched = st.runner.scheduler
        await st.runner.call(sched.reset_prefix_cache, ready=lambda: not sched.running, blocks_admission=True)
        return Response(status_code=200)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info(request: Request) -> JSONResponse:
        st = get_state(request)
        name = st.config.model_name
        return JSONResponse({"model_path": name, "tokenizer_path": name, "is_generation": True,
                             "preferred_sampling_params": None, "weight_version": "default",
                             "has_image_understanding": False, "has_audio_understanding": False,
                             "model_type": "llama", "architectures": ["TinyTransformer"]})  # fmt: skip

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info(request: Request) -> JSONResponse:
        st = get_state(request)
        cfg = st.config
        g = st.runner.gauges
        c = st.runner.scheduler.counters
        info = {**cfg.to_json(), "model_path": cfg.model_name, "served_model_name": cfg.model_name,
                "page_size": cfg.block_size, "max_running_requests": cfg.max_num_seqs,
                "context_length": cfg.max_model_len, "disable_radix_cache": cfg.cache == "off",
                "version": getattr(kvlab, "__version__", "0"),
                "internal_states": [{"num_running_reqs": g.running, "num_waiting_reqs": g.waiting,
                                     "kv_cache_usage": g.kv_cache_usage,
                                     "prefix_cache_hit_rate": c.prefix_cache_hits / max(c.prefix_cache_queries, 1)}]}  # fmt: skip
        return JSONResponse(json.loads(json.dumps(info)))
