"""vLLM 0.33.0's real KV-cache manager, driven by kvlab's prefix-cache replay ops.

    python tools/conformance/vllm_harness.py --fetch     # pip download + unpack (once)

The real code runs, unchanged, from the unpacked wheel: ``KVCacheManager``
(``vllm/v1/core/kv_cache_manager.py``), its ``UnitaryKVCacheCoordinator``, the
``FullAttentionManager`` (``single_type_kv_cache_manager.py``), ``BlockPool``,
``FreeKVCacheBlockQueue`` and the request block hasher (``kv_cache_utils.py``),
``vllm.utils.hashing.sha256``, ``KVCacheConfig``/``FullAttentionSpec``
(``kv_cache_interface.py``) and the ``Request`` class (``vllm/v1/request.py``);
and, for the benchmark, ``BaseRenderer.validate_token_ids`` (``vllm/renderers/base.py``),
the check ``InputProcessor`` runs on every prompt's token ids before the request is
scheduled (``vllm/v1/engine/input_processor.py``), with ``vllm.exceptions``.
Every other vllm module is a stub (see ``stubload.py``); the few names the real
code calls from stubbed modules get small stand-ins (``ConstantList``,
``length_from_prompt_token_ids_or_embeds``, ``SamplingParams``...), listed in
``_overrides``.

``RealPrefixCacheReplay`` plays the scheduler's part, making the calls
``vllm/v1/core/sched/scheduler.py`` makes, with the arguments it passes, for
one full-attention KV cache group, prefix caching on, no chunked prefill, no
speculative decoding, no KV connector, watermark 0 (vLLM's defaults):

* ``alloc``: a ``Request`` built with the engine's block hasher (sha256, the
  default ``prefix_caching_hash_algo``); ``get_computed_blocks(request)``; then
  ``allocate_slots(request, num_tokens - num_computed, num_new_computed_tokens=...,
  new_computed_blocks=..., full_sequence_must_fit=True, has_scheduled_reqs=...)``
  as for a waiting request (``scheduler_reserve_full_isl`` defaults to True).
  ``None`` is a refusal: the request stays out, as one left waiting.
* ``append``: ``request.append_output_token_ids(tokens)`` (which hashes any block
  that became full), then ``allocate_slots(request, len(tokens))`` as for a
  running request, then ``num_computed_tokens`` moves on. On ``None`` the scheduler
  would preempt a request; the replay instead refuses the op and changes nothing,
  so the harness takes the appended tokens and hashes back off the request.
* ``free``: ``KVCacheManager.free(request)``.
* ``probe``: ``get_computed_blocks`` for a fresh request that is never allocated.

``evicted`` is read by wrapping ``BlockPool._maybe_evict_cached_block`` (the
wrapper calls the real method and notes the blocks for which it returned True).
NONE_HASH is derived as a server started without PYTHONHASHSEED derives it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stubload import SourceLoader, cache_dir, fetch_wheel  # noqa: E402

VERSION = "0.33.0"
REAL_MODULES = (
    "vllm.utils.math_utils",
    "vllm.utils.hashing",
    "vllm.v1.kv_cache_layout",
    "vllm.v1.kv_cache_spec_registry",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.request",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.kv_cache_manager",
    "vllm.exceptions",
    "vllm.renderers.base",
)
MAX_MODEL_LEN = 1 << 30  # never the binding limit in a replay


def source_dir() -> Path:
    return cache_dir() / f"vllm-{VERSION}"


def available() -> bool:
    """True when the unpacked wheel is in the cache folder."""
    return (source_dir() / ".complete").exists()


def fetch() -> Path:
    return fetch_wheel("vllm", VERSION, source_dir())


# ---------------------------------------------------------------------- stand-ins for stubbed names


class ConstantList:
    """A read-only view of a list (``vllm.v1.utils.ConstantList``, whose module pulls in the engine)."""

    def __init__(self, x: list) -> None:
        self._x = x

    def __getitem__(self, item: Any) -> Any:
        return self._x[item]

    def __len__(self) -> int:
        return len(self._x)

    def __iter__(self) -> Any:
        return iter(self._x)


def _length_from_prompt_token_ids_or_embeds(prompt_token_ids: Any, prompt_embeds: Any) -> int:
    """``vllm.utils.length_from_prompt_token_ids_or_embeds`` for token-id prompts (``vllm/utils/__init__.py``)."""
    assert prompt_embeds is None
    return len(prompt_token_ids)


class SamplingParams:
    """The fields ``Request.__init__`` reads from ``vllm.SamplingParams`` (plain generation)."""

    max_tokens = 1 << 20
    extra_args = None
    skip_reading_prefix_cache = None


class StructuredOutputRequest:
    @staticmethod
    def from_sampling_params(sampling_params: Any) -> None:
        return None  # no structured output


class _Platform:
    @staticmethod
    def register_custom_kv_cache_specs(vllm_config: Any) -> None:
        return None  # the CUDA platform registers no extra spec types


class _ModelConfig:
    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size

    def get_vocab_size(self) -> int:
        return self._vocab_size


class TokenIdRenderer:
    """What ``BaseRenderer.validate_token_ids`` reads from its renderer: the model config, and no tokenizer.

    Without a tokenizer (vLLM's ``skip_tokenizer_init``) the model's vocabulary is the
    only bound: ids in 0..vocab_size-1 pass, as ids in 0..MAX_TOKEN_ID pass kvlab's check
    when ``vocab_size`` is ``MAX_TOKEN_ID + 1``.
    """

    tokenizer = None

    def __init__(self, vocab_size: int) -> None:
        self.model_config = _ModelConfig(vocab_size)


def _overrides() -> dict[str, dict[str, Any]]:
    return {
        "vllm.v1.utils": {"ConstantList": ConstantList, "tensor_data": None},
        "vllm.utils": {"length_from_prompt_token_ids_or_embeds": _length_from_prompt_token_ids_or_embeds},
        "vllm.sampling_params": {"SamplingParams": SamplingParams},
        "vllm.v1.structured_output.request": {"StructuredOutputRequest": StructuredOutputRequest},
        "vllm.platforms": {"current_platform": _Platform()},
        "vllm.config": {"get_current_vllm_config_or_none": lambda: None},
        "vllm.envs": {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": False},
    }


class Vllm:
    """The loaded real modules."""

    def __init__(self) -> None:
        import importlib

        if "cbor2" not in sys.modules:  # vllm.utils.hashing imports it for the cbor hashes, unused here
            sys.modules["cbor2"] = type(sys)("cbor2")
        SourceLoader("vllm", source_dir(), REAL_MODULES, _overrides()).install()
        self.hashing = importlib.import_module("vllm.utils.hashing")
        self.interface = importlib.import_module("vllm.v1.kv_cache_interface")
        self.request = importlib.import_module("vllm.v1.request")
        self.utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        self.manager = importlib.import_module("vllm.v1.core.kv_cache_manager")
        self.renderers = importlib.import_module("vllm.renderers.base")
        self.exceptions = importlib.import_module("vllm.exceptions")
        seed = os.environ.pop("PYTHONHASHSEED", None)
        try:
            self.utils.init_none_hash(self.hashing.sha256)
        finally:
            if seed is not None:
                os.environ["PYTHONHASHSEED"] = seed

    def token_id_check(self, vocab_size: int) -> Any:
        """vLLM's own ``BaseRenderer.validate_token_ids`` for a renderer without a tokenizer and ``vocab_size`` ids.

        Called with a prompt's ids, it returns None or raises ``VLLMValidationError``.
        """
        return functools.partial(self.renderers.BaseRenderer.validate_token_ids, TokenIdRenderer(vocab_size))


_VLLM: Vllm | None = None


def load() -> Vllm:
    """Import the real modules once per process."""
    global _VLLM
    if _VLLM is None:
        if not available():
            raise FileNotFoundError(
                f"vLLM {VERSION} is not unpacked in {source_dir()}: run "
                "`python tools/conformance/vllm_harness.py --fetch`"
            )
        _VLLM = Vllm()
    return _VLLM


# ---------------------------------------------------------------------- the replay


class RealPrefixCacheReplay:
    """Apply kvlab prefix-cache replay ops to a real ``KVCacheManager``; records in kvlab's format."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.v = load()
        if not config.get("null_block", False):
            raise ValueError("vLLM always reserves the null block: replay with null_block true")
        if config.get("hash", "lesson") != "vllm":
            raise ValueError('compare with hash "vllm" (vLLM\'s sha256 block hashes)')
        self.block_size = config["block_size"]
        num_blocks = config["num_blocks"]
        iface = self.v.interface
        spec = iface.FullAttentionSpec(
            block_size=self.block_size, num_kv_heads=1, head_size=1, dtype=__import__("torch").float16
        )
        kv_config = iface.KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], spec)],
        )
        self.kvm = self.v.manager.KVCacheManager(
            kv_config,
            max_model_len=MAX_MODEL_LEN,
            scheduler_block_size=self.block_size,
            hash_block_size=self.block_size,
            enable_caching=True,
        )
        self.pool = self.kvm.block_pool
        self.hasher = self.v.utils.get_request_block_hasher(self.block_size, self.v.hashing.sha256)
        self.requests: dict[str, Any] = {}
        self._evicted: list[int] = []
        real_evict = self.pool._maybe_evict_cached_block

        def spy(block: Any) -> bool:
            out = real_evict(block)
            if out:
                self._evicted.append(block.block_id)
            return out

        self.pool._maybe_evict_cached_block = spy

    # -------------------------------------------------------------- helpers

    def _request(self, req_id: str, tokens: list[int], salt: str | None) -> Any:
        return self.v.request.Request(
            request_id=req_id,
            prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(),
            pooling_params=None,
            cache_salt=salt,
            block_hasher=self.hasher,
        )

    def _table(self, req_id: str) -> list[int]:
        return list(self.kvm.get_block_ids(req_id)[0])

    def free_queue(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]

    def block_hash(self, block_id: int) -> bytes | None:
        """The hash block ``block_id`` is cached under (without the group id), or None."""
        h = self.pool.blocks[block_id].block_hash
        return None if h is None else bytes(self.v.utils.get_block_hash(h))

    def ref_count(self, block_id: int) -> int:
        return self.pool.blocks[block_id].ref_cnt

    # -------------------------------------------------------------- ops

    def apply(self, op: dict[str, Any]) -> dict[str, Any]:
        name = op["op"]
        record: dict[str, Any] = {
            "op": name,
            "req": op.get("req"),
            "ok": True,
            "num_cached_tokens": 0,
            "hit_block_ids": [],
            "new_block_ids": [],
            "block_table": [],
            "evicted": [],
            "free_queue": [],
        }
        self._evicted = []
        getattr(self, "_" + name)(op, record)
        record["evicted"] = list(self._evicted)
        record["free_queue"] = self.free_queue()
        return record

    def _probe(self, op: dict[str, Any], record: dict[str, Any]) -> None:
        request = self._request("probe", op["tokens"], op.get("cache_salt"))
        blocks, num_hit, _ = self.kvm.get_computed_blocks(request)
        record["num_cached_tokens"] = num_hit
        record["hit_block_ids"] = [b.block_id for b in blocks.blocks[0]]

    def _alloc(self, op: dict[str, Any], record: dict[str, Any]) -> None:
        req_id = op["req"]
        request = self._request(req_id, op["tokens"], op.get("cache_salt"))
        blocks, num_hit, _ = self.kvm.get_computed_blocks(request)
        record["num_cached_tokens"] = num_hit
        record["hit_block_ids"] = [b.block_id for b in blocks.blocks[0]]
        new = self.kvm.allocate_slots(
            request,
            request.num_tokens - num_hit,
            num_new_computed_tokens=num_hit,
            new_computed_blocks=blocks,
            full_sequence_must_fit=True,
            has_scheduled_reqs=bool(self.requests),
        )
        if new is None:
            record["ok"] = False
            return
        request.status = self.v.request.RequestStatus.RUNNING
        request.num_computed_tokens = request.num_tokens  # Scheduler.update_after_schedule
        self.requests[req_id] = request
        record["new_block_ids"] = list(new.get_block_ids()[0])
        record["block_table"] = self._table(req_id)

    def _append(self, op: dict[str, Any], record: dict[str, Any]) -> None:
        req_id = op["req"]
        request = self.requests[req_id]
        tokens = list(op["tokens"])
        num_hashes = len(request.block_hashes)
        request.append_output_token_ids(tokens)
        new = self.kvm.allocate_slots(request, len(tokens))
        if new is None:
            # vLLM would preempt a running request here; the replay refuses and changes nothing.
            del request._output_token_ids[-len(tokens) :]
            del request._all_token_ids[-len(tokens) :]
            del request.block_hashes[num_hashes:]
            record["ok"] = False
            record["block_table"] = self._table(req_id)
            return
        request.num_computed_tokens += len(tokens)
        record["new_block_ids"] = list(new.get_block_ids()[0])
        record["block_table"] = self._table(req_id)

    def _free(self, op: dict[str, Any], record: dict[str, Any]) -> None:
        req_id = op["req"]
        record["block_table"] = self._table(req_id)
        request = self.requests.pop(req_id)
        request.status = self.v.request.RequestStatus.FINISHED_STOPPED
        self.kvm.free(request)


def replay(config: dict[str, Any], ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records the real vLLM code gives for a scenario (kvlab's replay format)."""
    real = RealPrefixCacheReplay(config)
    return [real.apply(op) for op in ops]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetch", action="store_true", help=f"pip download vllm=={VERSION} and unpack it")
    args = parser.parse_args(argv)
    if args.fetch:
        print(f"vLLM {VERSION} sources in {fetch()}")
    load()
    print(f"loaded vLLM {VERSION}'s KVCacheManager from {source_dir()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
