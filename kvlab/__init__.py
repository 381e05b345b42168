"""kvlab: a small, tested model of how LLM inference servers manage KV-cache memory.

Data flows one way: scenario -> model -> snapshots -> view. The models are pure
Python; the views (``kvlab.views``) only read snapshots; the engine
(``kvlab.engine``) needs the optional ``torch`` extra.
"""

__version__ = "0.1.0"

from kvlab.errors import KvlabError, OutOfBlocksError, ScenarioError

__all__ = ["KvlabError", "OutOfBlocksError", "ScenarioError", "__version__"]
