"""Hostile input for the figure functions' titles, highlights, sizes and frame times (not the radix views).

Each public figure function gets values from ``tests/hostile.py`` in its numeric and text arguments:
it draws, or refuses with ``KvlabError``; never a TypeError from plotly or a repr that raises.
"""

from __future__ import annotations

import pytest
from hostile import BadRepr, hostile_values, kvlab_or_ok
from hypothesis import given, settings

from kvlab.core import hashing
from kvlab.errors import KvlabError
from kvlab.lessons import ex01
from kvlab.models.prefix_cache import PrefixCache
from kvlab.views import (
    block_pool_figure,
    contiguous_animation,
    contiguous_figure,
    free_queue_figure,
    hash_chain_figure,
    hit_rate_figure,
    utilization_figure,
)
from kvlab.views._common import check_number, check_title
from kvlab.views.block_pool import grid_shape

FAST = settings(max_examples=20, deadline=None)


def _pool_state():
    cache = PrefixCache(6, 4)
    cache.allocate("A", list(range(10)))
    return cache.snapshot()


STATE = _pool_state()
HISTORY = ex01.example_1().reserve_max.history


@FAST
@given(value=hostile_values())
def test_checks_refuse_hostile_values(value):
    kvlab_or_ok(lambda: check_number("x", value))
    kvlab_or_ok(lambda: check_title(value))
    kvlab_or_ok(lambda: grid_shape(value))


@FAST
@given(value=hostile_values())
def test_figures_refuse_hostile_titles_and_highlights(value):
    kvlab_or_ok(lambda: block_pool_figure(STATE, value))
    kvlab_or_ok(lambda: block_pool_figure(STATE, ("A", value)))
    kvlab_or_ok(lambda: block_pool_figure(STATE, title=value))
    kvlab_or_ok(lambda: free_queue_figure(STATE, title=value))
    kvlab_or_ok(lambda: contiguous_figure(HISTORY.states[-1], title=value))
    kvlab_or_ok(lambda: hit_rate_figure({"a": value}))
    kvlab_or_ok(lambda: utilization_figure(value))
    kvlab_or_ok(lambda: hash_chain_figure({"a": hashing.hash_chain([1, 2, 3, 4], 2)}, title=value))


@FAST
@given(value=hostile_values())
def test_animations_refuse_hostile_frame_times(value):
    kvlab_or_ok(lambda: contiguous_animation(HISTORY, frame_ms=value))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: contiguous_animation(HISTORY, frame_ms=10**30), "frame_ms must be at most 60,000"),
        (lambda: block_pool_figure(STATE, BadRepr()), "highlight must be"),
        (lambda: block_pool_figure(STATE, ("A", 10**30)), "past the end"),
        (lambda: hit_rate_figure({"a": float("nan")}), "finite number"),
        (lambda: hit_rate_figure({"a": 10**400}), "finite number"),
        (lambda: grid_shape(10**30), "LIMITS.drawn_blocks"),
    ],
)
def test_view_refusals_say_what_is_wrong(call, match):
    with pytest.raises(KvlabError, match=match):
        call()


def test_figures_read_a_user_s_dict_through_dict_s_own_methods():
    """A dict subclass whose items()/iteration raise draws (or is refused) as a plain dict would be."""
    from hostile import LyingDict

    from kvlab.views.agents import prompt_split_figure
    from kvlab.views.probe import probe_timing_figure

    chain = hashing.hash_chain(list(range(32)), 16)
    assert hash_chain_figure(LyingDict({"a": chain}), title="t") is not None
    for figure in (probe_timing_figure, prompt_split_figure):
        with pytest.raises(KvlabError, match="'a'|a has no"):  # read, then refused for what the value is
            figure(LyingDict({"a": 1}), title="t")
