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
    assert len(fig.data) == 4
    assert list(fig.data[0].y) == list(results[0].requests)
    assert list(fig.data[1].y) == pytest.approx([100 * r for r in results[0].replica_hit_rates])


@pytest.mark.parametrize("bad", [[], "x", [1], [object()] * 7, None])
def test_bad_results_refused(bad):
    with pytest.raises(KvlabError):
        replica_load_figure(bad)
