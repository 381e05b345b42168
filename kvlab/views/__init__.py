"""What a student looks at: plotly figures, kernel-free animations and live widgets over snapshots.

Views only read ``kvlab.core.snapshots`` records; they never change a model.

* ``*_figure(state, ...)``: one figure per concept (contiguous pool, block
  pool with block tables, free queue, radix tree, hash chain, and bars/lines
  for hit rates, tokens per turn, cache_n per turn, utilization).
* ``*_animation(history)``: one frame per snapshot with a slider and
  play/pause; works in exported HTML with no kernel.
* ``Stepper`` / ``stepper(history, kind)``: a slider-driven widget that updates
  its figures in place; ``Playground``: drive a block pool or prefix cache by hand.

Importing this package inside a Jupyter kernel calls ``setup()``, which makes
figures show in JupyterLab, VS Code and exported HTML without network access;
set ``PLOTLY_RENDERER`` to choose another renderer.

The widgets (``Stepper``, ``stepper``, ``Playground``) load ipywidgets, which a
notebook that only draws figures does not need: they are imported on first use
(``from kvlab.views import Stepper`` works as before), so ``import kvlab.views``
stays quick in every fresh kernel.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kvlab.views.animations import (
    block_pool_animation,
    contiguous_animation,
    free_queue_animation,
    radix_animation,
)
from kvlab.views.figures import (
    block_pool_figure,
    cache_n_figure,
    contiguous_figure,
    free_queue_figure,
    hash_chain_figure,
    hit_rate_figure,
    per_turn_figure,
    radix_tree_figure,
    tokens_per_turn_figure,
    utilization_figure,
)
from kvlab.views.theme import STATUS_COLORS, in_notebook_kernel, setup

if TYPE_CHECKING:
    from kvlab.views.live import Stepper, stepper
    from kvlab.views.playground import Playground

# name -> the module it lives in, imported on first use (ipywidgets is heavy to load)
_LAZY = {"Playground": "playground", "Stepper": "live", "stepper": "live"}


def __getattr__(name: str) -> Any:
    """``Stepper``, ``stepper``, ``Playground`` (and their modules), imported on first use."""
    if name in ("playground",):
        return importlib.import_module("kvlab.views.playground")
    if name not in _LAZY:
        raise AttributeError(f"module 'kvlab.views' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kvlab.views.{_LAZY[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "STATUS_COLORS",
    "Playground",
    "Stepper",
    "block_pool_animation",
    "block_pool_figure",
    "cache_n_figure",
    "contiguous_animation",
    "contiguous_figure",
    "free_queue_animation",
    "free_queue_figure",
    "hash_chain_figure",
    "hit_rate_figure",
    "per_turn_figure",
    "radix_animation",
    "radix_tree_figure",
    "setup",
    "stepper",
    "tokens_per_turn_figure",
    "utilization_figure",
]

if in_notebook_kernel():
    setup()
