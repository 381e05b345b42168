"""``kvlab serve``: the tiny engine behind HTTP, reached the way students reach vLLM and llama-server.

* ``app.create_app`` -- the ASGI app (FastAPI on uvicorn, as vLLM serves): OpenAI routes
  (``openai_api``), llama-server routes (``llama_api``), ``/metrics`` with vLLM's names
  (``metrics``), ``/health``, ``/reset_prefix_cache``, SGLang's ``/server_info`` and ``/model_info``.
* ``runner.EngineRunner`` -- the engine's own thread stepping
  ``kvlab.engine.scheduler.Scheduler`` (continuous batching); the HTTP layer only submits and awaits.
* ``client`` -- what a notebook measures over HTTP against any server: ``first_token_ms``,
  ``run_concurrent`` (requests/s and tokens/s at a given concurrency), ``served_model``.
* ``background.start_server`` -- a server for a notebook: started on a free loopback port and
  stopped at exit, or the one ``KVLAB_SERVER_URL`` names.

Needs the ``engine`` extra (torch, fastapi, uvicorn).
"""

from __future__ import annotations

from kvlab.serve.background import SERVER_URL_ENV, ServerHandle, server_args, start_server

__all__ = ["SERVER_URL_ENV", "ServerHandle", "server_args", "start_server"]
