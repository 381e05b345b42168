"""Hostile input for the tiny engine's public sizes: kvlab's own error before torch allocates anything.

``ModelConfig``, ``KVPool``, ``Engine``, ``Engine.generate``, ``run_chat`` and ``context_needed``
get values from ``tests/hostile.py``; a refused ``generate`` uses up no request id.
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from hostile import AlwaysEqual, hostile_values, kvlab_or_ok
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError

torch = pytest.importorskip("torch")

from kvlab.engine.chat import context_needed, run_chat, system_prompt, user_message  # noqa: E402
from kvlab.engine.engine import Engine  # noqa: E402
from kvlab.engine.model import KVPool, ModelConfig  # noqa: E402

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SMALL = {
    "num_layers": 1,
    "d_model": 16,
    "num_heads": 2,
    "num_kv_heads": 1,
    "ffn_dim": 16,
    "embedding_rows": 64,
}


@pytest.fixture(scope="module")
def engine():
    return Engine(cache="blocks", max_model_len=64, config=ModelConfig(**SMALL))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ModelConfig(d_model=10**30), "d_model must be at most"),
        (lambda: ModelConfig(num_layers=10**6), "num_layers must be at most"),
        (lambda: ModelConfig(d_model=8192, ffn_dim=65536, num_layers=1000), "MAX_MIB"),
        (lambda: ModelConfig(dtype=np.array(["float32"])), "unknown dtype"),
        (lambda: ModelConfig(dtype=AlwaysEqual()), "unknown dtype"),
        (lambda: ModelConfig(rope_theta=float("nan")), "positive finite number"),
        (lambda: KVPool(ModelConfig(**SMALL), 10**30, 16), "LIMITS.num_blocks"),
        (lambda: KVPool(ModelConfig(), 2**20, 2**16), "MAX_MIB"),
        (lambda: Engine(max_model_len=10**30), "LIMITS.tokens"),
        (lambda: Engine(block_size=10**30), "LIMITS.block_size"),
        (lambda: Engine(num_blocks=10**30), "LIMITS.num_blocks"),
        (lambda: Engine(cache=np.array(["blocks"])), "unknown cache mode"),
        (lambda: Engine(attention=AlwaysEqual()), "unknown attention"),
        (lambda: context_needed(10**30, 8, 0), "LIMITS.turns"),
        (lambda: system_prompt(10**30), "LIMITS.tokens"),
        (lambda: user_message(-1), "turn must be at least 0"),
    ],
)
def test_absurd_sizes_are_refused_before_any_allocation(call, match):
    start = time.perf_counter()
    with pytest.raises(KvlabError, match=match):
        call()
    assert time.perf_counter() - start < 1.0


@FAST
@given(value=hostile_values(), which=st.sampled_from([f.name for f in fields(ModelConfig)]))
def test_model_config_refuses_hostile_fields(value, which):
    args: dict[str, Any] = {**SMALL, which: value}
    kvlab_or_ok(lambda: ModelConfig(**args))


@FAST
@given(value=hostile_values(), which=st.sampled_from(["config", "num_blocks", "block_size"]))
def test_kv_pool_refuses_hostile_sizes(value, which):
    args: dict[str, Any] = {"config": ModelConfig(**SMALL), "num_blocks": 4, "block_size": 4, which: value}
    kvlab_or_ok(lambda: KVPool(args["config"], args["num_blocks"], args["block_size"]))


@FAST
@given(
    value=hostile_values(),
    which=st.sampled_from(
        ["cache", "block_size", "max_model_len", "num_blocks", "config", "attention", "device", "tokenizer"]
    ),
)
def test_engine_constructor_refuses_hostile_arguments(value, which):
    args: dict[str, Any] = {"max_model_len": 32, "config": ModelConfig(**SMALL), which: value}
    if which == "device" and isinstance(value, str):
        return  # an unknown device name is torch's to refuse
    kvlab_or_ok(lambda: Engine(**args))


@FAST
@given(
    value=hostile_values(),
    which=st.sampled_from(["prompt", "max_tokens", "cache_salt", "request_id", "record_logits"]),
)
def test_generate_refuses_hostile_arguments_and_uses_up_no_id(engine, value, which):
    args: dict[str, Any] = {"prompt": [1, 2, 3], "max_tokens": 2, which: value}
    prompt = args.pop("prompt")
    before = (set(engine._used_ids), engine._next_id, engine.prefix_cache.snapshot())
    if not kvlab_or_ok(lambda: engine.generate(prompt, **args)):
        assert (set(engine._used_ids), engine._next_id, engine.prefix_cache.snapshot()) == before


@FAST
@given(
    value=hostile_values(), which=st.sampled_from(["engine", "turns", "max_tokens", "system_tokens", "clock"])
)
def test_run_chat_refuses_hostile_arguments(engine, value, which):
    args: dict[str, Any] = {"turns": 1, "max_tokens": 1, "system_tokens": 0, "clock": False}
    target: Any = engine
    if which == "engine":
        target = value
    else:
        args[which] = value
    # valid values may still not fit this engine's 64-token context: that is a KvlabError too
    kvlab_or_ok(lambda: run_chat(target, **args))
