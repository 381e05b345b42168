"""Cases a fresh hostile round found across the package, each refused with kvlab's own error."""

from __future__ import annotations

import pytest


def test_a_fresh_hostile_round_gets_kvlab_errors():
    """Cases a hostile tester found after the hostile-input work: each refused with kvlab's own error."""
    import numpy as np

    from kvlab.core import jsonio
    from kvlab.errors import KvlabError
    from kvlab.fleet.config import check_user
    from kvlab.fleet.traffic import encode_tokens, max_traffic_tokens
    from kvlab.models.free_queue import FreeBlockQueue
    from kvlab.scenarios import module
    from kvlab.scenarios.radix import tree_dict
    from kvlab.server.conversation import tokens_processed
    from kvlab.server.slot_files import ModelShape, synthetic_kv

    class Raising:
        def __iter__(self):
            raise RuntimeError("no")

        def __repr__(self):
            raise RuntimeError("no")

    calls = [
        lambda: FreeBlockQueue(np.array(3)),
        lambda: tokens_processed(np.array(3)),
        lambda: encode_tokens(Raising()),
        lambda: max_traffic_tokens(None, None, None),
        lambda: check_user(1, 1),
        lambda: tree_dict(1),
        lambda: module(Raising()),
        lambda: module(type("D", (dict,), {})()),
        lambda: jsonio.dumps({"a": float("nan")}),
        lambda: jsonio.dumps([object()]),
        lambda: synthetic_kv(ModelShape(1024, 1, 4096, "f16"), []),  # a 16 GiB table: refused, not allocated
    ]
    for call in calls:
        with pytest.raises(KvlabError):
            call()


def test_a_huge_integer_in_a_float_field_is_refused():
    pytest.importorskip("torch")
    from kvlab.engine.model import ModelConfig
    from kvlab.errors import KvlabError

    for value in (10**400, 2**60):  # float(10**400) raises OverflowError
        with pytest.raises(KvlabError, match="rope_theta"):
            ModelConfig(rope_theta=value)
