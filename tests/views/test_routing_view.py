"""Notebook 16's routing figure: one bar per replica and router, in both panels, from route_fleet's results."""

from __future__ import annotations

import pytest

from kvlab.errors import KvlabError
from kvlab.lessons.capstone import round_robin, route_fleet, user_hash
from kvlab.views.routing import replica_load_figure


def test_one_bar_per_replica_and_router():
    results = [
        route_fleet(r, users=8, turns=2, system_tokens=64, capacity_blocks=400)
        for r in (round_robin, user_hash)
    ]
    fig = replica_load_figure(results)
    assert len(fig.data) == 4  # the left panel's bars (one trace per router), then the right panel's
    load = [t for t in fig.data if t.xaxis == "x"]
    rates = [t for t in fig.data if t.xaxis == "x2"]
    for result, left, right in zip(results, load, rates, strict=True):
        assert left.name == right.name == result.name
        assert list(left.y) == list(result.requests)
        assert list(right.y) == pytest.approx(
            [100 * r if n else None for n, r in zip(result.requests, result.replica_hit_rates, strict=True)]
        )


@pytest.mark.parametrize("bad", [[], "x", [1], [object()] * 7, None])
def test_bad_results_refused(bad):
    with pytest.raises(KvlabError):
        replica_load_figure(bad)
