"""The fleet's parts that need no process: lesson tokens as words, the metrics parser, kvlab's router rules.

The routing rules are read on ``PrefixRouter`` directly (no HTTP): the live tests
(``test_fleet_routing``) run the same rules behind real ``kvlab serve`` replicas.
"""

from __future__ import annotations

import pytest
from hostile import hostile_values, kvlab_or_ok
from hypothesis import given, settings

from kvlab.core.chat_format import Tokenizer
from kvlab.errors import InvalidArgumentError, KvlabError
from kvlab.fleet import FleetConfig, chat_traffic
from kvlab.serve.fleet import Fleet
from kvlab.serve.load import (
    check_url,
    parse_counters,
    simulate_live,
    simulated_traffic,
    token_word,
    tokens_text,
)
from kvlab.serve.router import PrefixRouter, chunk_hashes, request_text


def test_each_lesson_token_is_one_distinct_word_the_tokenizer_reads_as_one_token():
    ids = list(range(0, 50_000, 7)) + [25, 26, 675, 676, 49_999]
    words = [token_word(t) for t in ids]
    assert len(set(words)) == len(ids)
    tok = Tokenizer()
    text = tokens_text(ids) + " the file reads"  # the tiny model's reply words follow as their own tokens
    assert len(tok.encode(text)) == len(ids) + 3
    assert len(set(tok.encode(tokens_text(ids)))) == len(ids)


def test_simulated_traffic_is_the_lesson_traffic_with_answers_cut():
    config = FleetConfig(users=5, turns=3, system_tokens=40, capacity_blocks=100)
    cut = simulated_traffic(config, 8)
    full = chat_traffic(5, 3, 1, 40)
    assert cut.system == full.system
    assert [t.message for t in cut.requests] == [t.message for t in full.requests]
    assert all(t.answer == f.answer[:8] for t, f in zip(cut.requests, full.requests, strict=True))


def test_sticky_routing_beats_round_robin_in_the_simulation_of_the_live_traffic():
    config = FleetConfig(users=8, turns=3, system_tokens=64, capacity_blocks=400)
    rr = simulate_live(config, 8, replicas=2, routing="round-robin")
    sticky = simulate_live(config, 8, replicas=2, routing="user-hash")
    assert sticky.hit_rate > rr.hit_rate + 0.1


def test_metrics_parser_sums_label_sets_and_reads_both_names():
    page = (
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
        'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 20.0\n'
        "vllm:prefix_cache_hits 30\n"
        'vllm:prefix_cache_hits_total{engine="1"} NaN\n'
    )
    assert parse_counters(page) == (120, 30)
    assert parse_counters("vllm:num_requests_running 2\n") is None
    with pytest.raises(InvalidArgumentError):
        parse_counters(b"bytes")  # type: ignore[arg-type]


def test_cache_aware_follows_the_longest_prefix_and_ties_go_to_the_least_busy():
    router = PrefixRouter(["http://a", "http://b", "http://c"], "cache_aware", balance_abs=2)
    system = "S" * 640  # ten chunks every user shares
    alice = system + "alice " * 40
    router.record(1, alice)
    assert router.order(alice + " more")[0] == 1  # her history lives on b
    router.record(0, system + "bob " * 40)
    router.record(2, system + "carol " * 40)
    router.replicas[0].in_flight = 1
    router.replicas[1].in_flight = 1
    assert router.order(system + "dave " * 40)[0] == 2  # only the system prompt matches: least busy
    router.replicas[1].in_flight = 4  # b is 4 requests busier than c, past balance_abs
    assert router.order(alice + " more")[0] == 2


def test_cache_salt_starts_its_own_chains_in_the_router():
    text = "x" * 256
    assert chunk_hashes(text, "tenant-1") != chunk_hashes(text, "tenant-2")
    router = PrefixRouter(["http://a", "http://b"], "cache_aware")
    router.record(1, text, "tenant-1")
    router.replicas[1].in_flight = 0
    assert router.replicas[1].match(chunk_hashes(text, "tenant-1")) == 4
    assert router.replicas[1].match(chunk_hashes(text, "tenant-2")) == 0


def test_round_robin_cycles_and_a_down_replica_is_tried_last():
    router = PrefixRouter(["http://a", "http://b", "http://c"], "round_robin", cooldown=5)
    assert [router.order("t", now=0)[0] for _ in range(4)] == [0, 1, 2, 0]
    router.mark_down(0, now=10)
    order = router.order("t", now=11)
    assert order[-1] == 0 and sorted(order) == [0, 1, 2]
    assert router.order("t", now=16)[0] in (0, 1, 2)  # the cooldown is over: it is back in turn


def test_request_text_reads_prompts_and_messages():
    assert request_text({"prompt": "hi", "cache_salt": "s"}) == ("hi", "s")
    assert request_text({"prompt": ["a", "b"]}) == ("a b", None)
    chat = {
        "messages": [
            {"role": "user", "content": "one"},
            {"role": "user", "content": [{"type": "text", "text": "two"}]},
        ]
    }
    assert request_text(chat) == ("one\ntwo", None)
    assert request_text([1, 2]) == ("", None)


@pytest.mark.parametrize(
    "options",
    [
        {"replicas": 0},
        {"replicas": True},
        {"replicas": 10**9},
        {"router": "nginx"},
        {"router": "kvlab", "policy": "power_of_two"},
        {"policy": "least_loaded"},
        {"num_blocks": -1},
        {"serve_args": "--cache off"},
        {"router_args": [1]},
        {"startup_timeout": 0},
        {"startup_timeout": float("nan")},
        {"log_dir": 3},
    ],
)
def test_fleet_up_refuses_bad_options_before_starting_anything(options):
    with pytest.raises(KvlabError):
        Fleet.up(**{"replicas": 1, "router": "kvlab", **options})


@settings(max_examples=60, deadline=None)
@given(value=hostile_values())
def test_hostile_values_get_kvlab_errors(value):
    kvlab_or_ok(lambda: token_word(value))
    kvlab_or_ok(lambda: check_url("url", value))
    kvlab_or_ok(lambda: PrefixRouter(["http://a"], value))
    kvlab_or_ok(lambda: PrefixRouter(["http://a"], balance_abs=value))
    kvlab_or_ok(lambda: simulated_traffic(FleetConfig(users=2, turns=1, system_tokens=4), value))


def test_fleet_up_refuses_a_host_or_port_for_the_replicas(capsys):
    from kvlab.cli.fleet_up import main

    for extra in (["--host", "0.0.0.0"], ["--port=9000"]):
        assert main(["--replicas", "1", "--", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "127.0.0.1" in err
