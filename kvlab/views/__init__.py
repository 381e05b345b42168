"""What a student looks at: plotly figures, kernel-free animations and live widgets over snapshots.

Views only read ``kvlab.core.snapshots`` records; they never change a model, and they compute no
model facts (slot mappings, block hashes): those come in with the snapshot or from the caller.

* ``*_figure(state, ...)``: one figure per concept, each in its own module
  (``contiguous``, ``block_pool`` with the block tables, ``free_queue``,
  ``radix_tree``, ``hash_chain``, ``charts`` for the bars and lines of hit
  rates, tokens per turn, cache_n per turn, utilization; ``swa`` and
  ``agents`` for examples 12 and 13).
* ``registry``: the views a history can be stepped through, by name; the
  animations and the stepper look a view up there.
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
from kvlab.views.block_pool import block_pool_figure
from kvlab.views.charts import (
    cache_n_figure,
    hit_rate_figure,
    per_turn_figure,
    timing_per_turn_figure,
    tokens_per_turn_figure,
    utilization_figure,
)
from kvlab.views.contiguous import contiguous_figure
from kvlab.views.free_queue import free_queue_figure
from kvlab.views.hash_chain import hash_chain_figure
from kvlab.views.radix import radix_tree_figure
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
    "timing_per_turn_figure",
    "radix_animation",
    "radix_tree_figure",
    "setup",
    "stepper",
    "tokens_per_turn_figure",
    "utilization_figure",
]

if in_notebook_kernel():
    setup()
