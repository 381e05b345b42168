"""What every route reads: the config, the tokenizer and the engine runner of this server."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request

from kvlab.core.chat_format import Tokenizer
from kvlab.serve.config import ServeConfig
from kvlab.serve.runner import EngineRunner


@dataclass
class ServerState:
    config: ServeConfig
    runner: EngineRunner
    started: int = field(default_factory=lambda: int(time.time()))

    @property
    def tokenizer(self) -> Tokenizer:
        return self.runner.scheduler.engine.tokenizer


def get_state(request: Request) -> ServerState:
    return request.app.state.kvlab
