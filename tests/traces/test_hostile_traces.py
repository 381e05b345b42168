"""Hostile trace files: ``kvlab trace`` exits 2 with one line naming the line, never a traceback.

Each case here once crashed (a ``TypeError`` from a wrong type), built a model sized by a number in
the file, or refused without saying which line; ``TraceRecorder`` once let a body it cannot send as
JSON, or an endpoint that climbs out of its base URL, through.
"""

from __future__ import annotations

import json

import pytest

from kvlab.cli.trace import main
from kvlab.errors import InvalidArgumentError
from kvlab.traces import predict_trace, read_trace
from kvlab.traces.read import TraceError

LLAMA = {
    "content": "x",
    "tokens": [],
    "id_slot": 0,
    "timings": {"cache_n": 0, "prompt_n": 3},
    "tokens_cached": 4,
}
OPENAI_USAGE = {"usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}}


def _lines(*rows: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


REFUSED = {
    "a content part whose text is a number": _lines(
        {
            "request": {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "response": OPENAI_USAGE,
        }
    ),  # fmt: skip
    "a lone surrogate in the prompt": '{"request": {"prompt": "\\ud800"}, "response": {"usage": {}}}\n',
    "a lone surrogate in the output": _lines({"request": {"prompt": "hi"}, "response": LLAMA}).replace(
        '"content": "x"', '"content": "\\ud800"'
    ),
    "a response slot id of 10**19": _lines(
        {"request": {"prompt": "hi"}, "response": {**LLAMA, "id_slot": 10**19}}
    ),
    "a request slot id of 10**7": _lines({"request": {"prompt": "hi", "id_slot": 10**7}, "response": LLAMA}),
    "a /slots dump with n_ctx 10**19": _lines(
        {"slots": [{"id": 0, "n_ctx": 10**19}]}, {"request": {"prompt": "hi"}, "response": LLAMA}
    ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_hostile_trace_exits_2_naming_the_line(tmp_path, capsys, name):
    path = tmp_path / "trace.jsonl"
    path.write_bytes(REFUSED[name].encode("utf-8", "surrogatepass"))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvlab trace: error: line 1") and "\n" not in err, err


@pytest.mark.parametrize("choices", [{"a": 1}, 5, "text", [7]])
def test_choices_of_the_wrong_type_are_not_a_crash(choices):
    text = _lines({"request": {"prompt": "hi"}, "response": {"choices": choices, **OPENAI_USAGE}})
    report = predict_trace(read_trace(text))
    assert report.rows[0].reported["prompt_tokens"] == 3


def test_non_finite_counters_are_not_called_a_counter_reset(capsys, tmp_path):
    scrape = "vllm:prefix_cache_queries_total {}\nvllm:prefix_cache_hits_total 0\n"
    text = _lines({"metrics": scrape.format(0)}, {"request": {"prompt": "hi"}, "response": OPENAI_USAGE},
                  {"metrics": scrape.format("NaN")})  # fmt: skip
    report = predict_trace(read_trace(text))
    assert "NaN or infinite" in report.checkpoints[0].explanation
    assert report.checkpoints[0].match is None
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    assert main([str(path)]) == 0
    assert "None/None" not in capsys.readouterr().out


def test_a_counter_reset_shows_the_differences(capsys, tmp_path):
    scrape = "vllm:prefix_cache_queries_total {}\nvllm:prefix_cache_hits_total 0\n"
    text = _lines({"metrics": scrape.format(100)}, {"request": {"prompt": "hi"}, "response": OPENAI_USAGE},
                  {"metrics": scrape.format(1)})  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "counter reset" in out and "0/-99 tokens" in out


def test_read_trace_refuses_with_trace_error_not_type_error():
    with pytest.raises(TraceError, match=r"line 1: request messages\[0\]\.content\[0\]\.text"):
        read_trace(REFUSED["a content part whose text is a number"])


def _recorder():
    pytest.importorskip("httpx")
    from kvlab.traces.record import TraceRecorder

    return TraceRecorder("http://127.0.0.1:9/base", timeout=1)


@pytest.mark.parametrize("endpoint", ["/../metrics", "/a/./b", "//elsewhere/x", "/a\\b", "/a#b"])
def test_the_recorder_keeps_to_its_base_url(endpoint):
    with _recorder() as rec, pytest.raises(InvalidArgumentError, match="plain path"):
        rec.post(endpoint, {"prompt": "hi"})
    assert rec.lines == []


def _cycle() -> dict:
    d: dict = {}
    d["self"] = d
    return d


@pytest.mark.parametrize("body", [{"x": float("nan")}, {"x": {1, 2}}, _cycle()], ids=["nan", "set", "cycle"])
def test_the_recorder_refuses_a_body_that_is_not_plain_json(body):
    with _recorder() as rec, pytest.raises(InvalidArgumentError, match="plain JSON"):
        rec.post("/completion", body)
    assert rec.lines == []
