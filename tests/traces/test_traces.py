"""kvlab.traces: reading traces of each kind, predicting their counters, explaining differences.

The traces are made by running kvlab's own models (the in-process engine and the slot model), so
the reported counters are real outputs of the code the server uses; a few hand-written lines cover
the edge cases a real deployment leaves behind (missing fields, a partial last line, a counter reset).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.core.chat_format import Tokenizer
from kvlab.models.prefix_cache import PrefixCache
from kvlab.server.slots import SlotServer
from kvlab.traces import TraceError, parse_metrics, predict_trace, read_trace

SYSTEM = list(range(100, 164))  # four 16-token blocks shared by every request


def _vllm_line(prompt, cached, output=(7, 8, 9), salt=None):
    request = {"prompt": prompt, "max_tokens": len(output)}
    if salt is not None:
        request["cache_salt"] = salt
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(output)}
    usage["prompt_tokens_details"] = {"cached_tokens": cached}
    response = {
        "object": "text_completion",
        "choices": [{"text": "", "token_ids": list(output)}],
        "usage": usage,
    }
    return json.dumps({"request": request, "response": response})


def _blocks_trace(prompts, *, num_blocks=64, salts=None, block_size=16):
    """Serve ``prompts`` through the prefix-cache model the engine uses; the trace of what it reported."""
    cache = PrefixCache(num_blocks, block_size)
    lines = []
    for i, prompt in enumerate(prompts):
        salt = salts[i] if salts else None
        res = cache.allocate(f"r{i}", prompt, cache_salt=salt)
        for t in (7, 8):
            cache.append(f"r{i}", [t])
        cache.free(f"r{i}")
        lines.append(_vllm_line(prompt, res.num_cached_tokens, salt=salt))
    return "\n".join(lines)


def test_vllm_trace_predicted_exactly():
    prompts = [SYSTEM + [300 + i] * (5 + i) for i in range(6)]
    report = predict_trace(read_trace(_blocks_trace(prompts)), block_size=16, num_blocks=64)
    assert report.server == "vllm"
    assert [r.match for r in report.rows] == [True] * 6
    assert report.rows[0].predicted["cached_tokens"] == 0
    assert report.rows[1].predicted["cached_tokens"] == 64
    assert "Cold" in report.rows[0].explanation
    assert "Shares 64 tokens with what request 0 left in the cache" in report.rows[1].explanation


def test_unknown_pool_and_block_size_are_said_and_assumed():
    report = predict_trace(read_trace(_blocks_trace([SYSTEM + [1], SYSTEM + [2]])))
    notes = " ".join(report.assumptions)
    assert "block size 16 assumed" in notes and "--num-blocks" in notes


def test_last_token_rule_explained():
    prompt = SYSTEM  # exactly four blocks: the second request can reuse only three
    report = predict_trace(read_trace(_blocks_trace([prompt, prompt])), block_size=16)
    assert report.rows[1].predicted["cached_tokens"] == 48
    assert "last-token rule" in report.rows[1].explanation


def test_eviction_explained_under_a_small_pool():
    # pool of 6 blocks: request 1 (5 blocks of other tokens) evicts request 0's blocks
    a = SYSTEM + [1]
    b = list(range(2000, 2070))
    trace = read_trace(_blocks_trace([a, b, a], num_blocks=6))
    report = predict_trace(trace, block_size=16, num_blocks=6)
    assert [r.match for r in report.rows] == [True, True, True]
    assert report.rows[2].predicted["cached_tokens"] < 64
    assert "evicted" in report.rows[2].explanation


def test_salt_keeps_tenants_apart_and_says_so():
    prompts = [SYSTEM + [1], SYSTEM + [2]]
    report = predict_trace(read_trace(_blocks_trace(prompts, salts=["alice", "bob"])), block_size=16)
    assert report.rows[1].predicted["cached_tokens"] == 0 and report.rows[1].match
    assert "another cache_salt" in report.rows[1].explanation


def test_a_mismatch_is_explained_by_the_alternative_that_reproduces_it():
    # the "server" reused token by token (llama-server style): 65 of 70 shared
    prompts = [SYSTEM + [1] * 6, SYSTEM + [1] * 1 + [5] * 5]
    lines = [_vllm_line(prompts[0], 0), _vllm_line(prompts[1], 65)]
    report = predict_trace(read_trace("\n".join(lines)), block_size=16)
    row = report.rows[1]
    assert row.match is False and row.predicted["cached_tokens"] == 64
    assert "token by token" in row.explanation


def test_volatile_segment_breaks_the_chain():
    head = list(range(100, 110))
    tail = list(range(500, 600))
    prompts = [head + [1] + tail, head + [2] + tail]
    report = predict_trace(read_trace(_blocks_trace(prompts, block_size=4)), block_size=4)
    assert "volatile segment at token 10" in report.rows[1].explanation


def test_metrics_scrapes_compared_and_counter_reset_noticed():
    prompts = [SYSTEM + [1], SYSTEM + [2]]
    body = _blocks_trace(prompts)
    scrape = 'vllm:prefix_cache_queries_total{{model_name="m"}} {q}\nvllm:prefix_cache_hits_total{{model_name="m"}} {h}\n'
    before = json.dumps({"metrics": scrape.format(q=10, h=0)})
    after = json.dumps({"metrics": scrape.format(q=10 + 130, h=64)})
    reset = json.dumps({"metrics": scrape.format(q=0, h=0)})
    report = predict_trace(read_trace("\n".join([before, body, after, reset])), block_size=16)
    assert report.checkpoints[0].match is True
    assert report.checkpoints[0].reported == {"queries": 130, "hits": 64}
    assert "counter reset" in report.checkpoints[1].explanation


def test_parse_metrics_sums_label_sets():
    text = '# HELP x\nvllm:a_total{engine="0"} 2\nvllm:a_total{engine="1"} 3\nplain 1.5\n'
    assert parse_metrics(text) == {"vllm:a_total": 5.0, "plain": 1.5}


def _llama_trace(n_slots, prompts, similarity=0.1):
    server = SlotServer(n_slots, cache_ram_mib=0, slot_prompt_similarity=similarity, record=False)
    lines = []
    for i, prompt in enumerate(prompts):
        gen = [9000 + i, 9100 + i, 9200 + i]
        r = server.complete(prompt, max_tokens=3, generated=gen)
        response = {
            "tokens": gen,
            "id_slot": r.slot_id,
            "timings": {"cache_n": r.cache_n, "prompt_n": r.prompt_n, "predicted_n": 3},
        }
        lines.append(json.dumps({"request": {"prompt": prompt, "n_predict": 3}, "response": response}))
    return "\n".join(lines)


def test_llama_trace_predicted_exactly_with_slots():
    prompts = [SYSTEM + [i % 3] * 10 for i in range(9)] + [list(range(5000, 5050))]
    report = predict_trace(read_trace(_llama_trace(3, prompts)), slots=3)
    assert report.server == "llama"
    assert all(r.match for r in report.rows)
    assert {r.predicted["slot"] for r in report.rows} >= {0, 1, 2} or len(report.rows) == 10
    assert "chosen by" in report.rows[1].explanation


def test_llama_another_slot_followed_and_said():
    prompts = [SYSTEM + [1] * 10, SYSTEM + [1] * 10]
    lines = _llama_trace(2, prompts).split("\n")
    second = json.loads(lines[1])
    second["response"]["id_slot"] = 1 - second["response"]["id_slot"]  # the server chose the other slot
    second["response"]["timings"]["cache_n"] = 0
    second["response"]["timings"]["prompt_n"] = len(prompts[1])
    report = predict_trace(read_trace("\n".join([lines[0], json.dumps(second)])), slots=2)
    row = report.rows[1]
    assert row.match is False
    assert "put it on slot" in row.explanation


def test_chat_transcript_with_kvlab_tokenizer_and_with_counts():
    convo = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]
    longer = convo + [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More"}]
    report = predict_trace(read_trace(json.dumps([convo, longer])), block_size=4)
    assert report.rows[0].reported is None and report.rows[0].match is None
    assert report.rows[1].predicted["cached_tokens"] > 0
    counted = json.dumps(
        [
            {"messages": convo, "token_counts": [40, 8]},
            {"messages": longer, "token_counts": [40, 8, 5, 3]},
        ]
    )
    report = predict_trace(read_trace(counted), block_size=16)
    assert report.rows[1].predicted["cached_tokens"] == 48  # the 48 shared tokens: three whole blocks


def test_chat_exchange_tokenized_like_the_template():
    tok = Tokenizer()
    msgs = [{"role": "user", "content": "hello world"}]
    usage = {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}
    line = json.dumps(
        {
            "request": {"messages": msgs},
            "response": {
                "object": "chat.completion",
                "choices": [{"message": {"content": "ok"}}],
                "usage": usage,
            },
        }
    )
    trace = read_trace(line)
    assert trace.exchanges[0].tokenized_by.startswith("kvlab")
    assert len(trace.exchanges[0].prompt) > 1
    assert trace.exchanges[0].output == tuple(tok.encode("ok"))
    report = predict_trace(trace)
    assert "tokenized by kvlab's tokenizer" in " ".join(report.assumptions)
    assert "counted 1 prompt tokens" in report.rows[0].explanation or report.rows[0].match is not False


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"request": {"prompt": [1, 2]}, "respo', "line 1"),
        ('{"request": {"prompt": [1]}, "response": {}}', "neither 'timings'"),
        ('{"request": {"prompt": [-1]}, "response": {"timings": {}}}', "not a token id"),
        ('{"hello": 1}', "each line must be"),
        ("[1, 2]", r"transcript\[0\]"),
        ("", "empty"),
        ('{"request": {"prompt": [1]}, "response": {"usage": {}}}\n{"x": 1, "x": 2', "line 2"),
        ('{"metrics": "vllm:x_total abc"}', "not a number"),
        ('{"request": {"prompt": "hi", "cache_prompt": "yes"}, "response": {"timings": {}}}', "cache_prompt"),
    ],
)
def test_bad_files_get_one_error_naming_the_line(text, needle):
    with pytest.raises(TraceError, match=needle):
        read_trace(text.encode())


def test_bad_settings_refused():
    trace = read_trace(_blocks_trace([SYSTEM]))
    for bad in ({"block_size": 0}, {"num_blocks": 10**30}, {"server": "sglang"}, {"slots": True}):
        with pytest.raises(Exception) as info:
            predict_trace(trace, **bad)
        assert type(info.value).__module__.startswith("kvlab")
    with pytest.raises(TraceError):
        predict_trace("not a trace")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_random_bytes_refused_with_kvlab_error(data):
    try:
        trace = read_trace(b'{"request": {"prompt": [1]}, "response": ' + data + b"}")
    except TraceError:
        return
    predict_trace(trace)


def _run_cli(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "kvlab", "trace", *args], input=stdin, capture_output=True, timeout=60
    )


def test_cli_table_json_and_errors(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_blocks_trace([SYSTEM + [1], SYSTEM + [2]]))
    out = _run_cli(str(path), "--block-size", "16", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [set(r) for r in rows] == [{"index", "line", "reported", "predicted", "match", "explanation"}] * 2
    assert rows[1]["match"] is True
    table = _run_cli("-", "--block-size", "16", stdin=path.read_bytes())
    assert table.returncode == 0 and "agree: 2 of 2" in table.stdout.decode()
    bad = _run_cli(str(tmp_path / "missing.jsonl"))
    assert (
        bad.returncode == 2 and bad.stderr.decode().count("\n") == 1 and "cannot read" in bad.stderr.decode()
    )
    bad = _run_cli(str(path), "--block-size", "0")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr.decode()
