"""The real thing behind the simulations: paged attention kernels and a tiny engine that reuses prefixes.

Needs the ``engine`` extra (torch); the Triton kernel also needs ``triton``.

* ``paged_attention`` / ``paged_prefill`` -- attention through block tables
  (reference, torch and Triton implementations), plus ``slot_mapping`` and
  ``write_kv_cache``; ``plan_decode`` checks one decode step's tables once for
  every layer (``DecodePlan.attend``).
* ``Engine`` -- a seeded random tiny transformer over a paged KV pool, whose
  reuse is decided by ``kvlab.models.prefix_cache`` (``cache="blocks"``), a
  llama-server slot (``"slot"``) or nothing (``"off"``).
* ``Scheduler`` -- continuous batching over an ``Engine``'s model and pool: requests queue, are
  admitted while the pool can hold them, and advance one token per step in one batched forward
  pass (``TinyTransformer.decode_batch``); what ``python -m kvlab serve`` runs.
* ``run_chat`` -- the agent-like conversation behind ``python -m kvlab chat``.
* ``tenant_probe`` / ``tenant_probe_demo`` -- the cross-tenant timing probe
  and the cache salt that stops it.
"""

from __future__ import annotations

import importlib

# names are imported on first use, so ``python -m kvlab chat`` can say clearly that torch is
# missing instead of failing inside this package's import
_EXPORTS = {
    "ChatTurnResult": "kvlab.engine.chat",
    "run_chat": "kvlab.engine.chat",
    "CACHE_MODES": "kvlab.engine.engine",
    "Engine": "kvlab.engine.engine",
    "GenerationResult": "kvlab.engine.engine",
    "Scheduler": "kvlab.engine.scheduler",
    "ServeRequest": "kvlab.engine.scheduler",
    "KVPool": "kvlab.engine.model",
    "ModelConfig": "kvlab.engine.model",
    "TinyTransformer": "kvlab.engine.model",
    "DECODE_IMPLS": "kvlab.engine.attention",
    "PREFILL_IMPLS": "kvlab.engine.attention",
    "DecodePlan": "kvlab.engine.attention",
    "POOL_LAYOUTS": "kvlab.engine.attention",
    "layer_pool": "kvlab.engine.attention",
    "pool_layout": "kvlab.engine.attention",
    "paged_attention": "kvlab.engine.attention",
    "plan_decode": "kvlab.engine.attention",
    "paged_prefill": "kvlab.engine.attention",
    "slot_mapping": "kvlab.engine.attention",
    "write_kv_cache": "kvlab.engine.attention",
    "ProbeRow": "kvlab.engine.probe",
    "ProbeRun": "kvlab.engine.probe",
    "tenant_probe": "kvlab.engine.probe",
    "tenant_probe_demo": "kvlab.engine.probe",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvlab.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
