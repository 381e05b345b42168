"""``/metrics`` in Prometheus text format, with vLLM 0.33.0's metric names.

vLLM's v1 ``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py``) defines counters
``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (in tokens), which the
Prometheus client exposes with a ``_total`` suffix, gauges ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (a fraction, 0..1), and
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:request_success_total{finished_reason}``, ``vllm:num_preemptions_total`` and the
``vllm:time_to_first_token_seconds`` histogram. Every sample carries ``engine="0"`` and
``model_name``. kvlab adds ``kvlab:decode_steps_total`` and
``kvlab:decoded_sequences_total``: their ratio is the mean decode batch size.
"""

from __future__ import annotations

from kvlab.engine.scheduler import Counters
from kvlab.serve.runner import Gauges

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""vLLM's buckets for ``time_to_first_token_seconds`` (its first ones)."""


def render_metrics(counters: Counters, gauges: Gauges, model_name: str) -> str:
    labels = f'engine="0",model_name="{_escape(model_name)}"'
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, value: float, extra: str = "") -> None:
        base = name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name
        lines.append(f"# HELP {base} {help_}")
        lines.append(f"# TYPE {base} {kind}")
        lines.append(f"{name}{{{labels}{extra}}} {float(value)}")

    metric(
        "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", gauges.running
    )
    metric(
        "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", gauges.waiting
    )
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        gauges.kv_cache_usage,
    )
    metric("vllm:prefix_cache_queries_total", "counter",
           "Prefix cache queries, in terms of number of queried tokens.", counters.prefix_cache_queries)  # fmt: skip
    metric("vllm:prefix_cache_hits_total", "counter",
           "Prefix cache hits, in terms of number of cached tokens.", counters.prefix_cache_hits)  # fmt: skip
    metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
           counters.num_preemptions)  # fmt: skip
    metric(
        "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", counters.prompt_tokens
    )
    metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
           counters.generation_tokens)  # fmt: skip
    lines.append("# HELP vllm:request_success Count of successfully processed requests.")
    lines.append("# TYPE vllm:request_success counter")
    lines.append(
        f'vllm:request_success_total{{{labels},finished_reason="length"}} {float(counters.request_success)}'
    )
    lines.append(
        f'vllm:request_success_total{{{labels},finished_reason="abort"}} {float(counters.request_aborted)}'
    )
    ttft = list(counters.ttft_seconds)
    lines.append("# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.")
    lines.append("# TYPE vllm:time_to_first_token_seconds histogram")
    for edge in TTFT_BUCKETS:
        n = sum(1 for t in ttft if t <= edge)
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{edge}"}} {float(n)}')
    lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {float(len(ttft))}')
    lines.append(f"vllm:time_to_first_token_seconds_count{{{labels}}} {float(len(ttft))}")
    lines.append(f"vllm:time_to_first_token_seconds_sum{{{labels}}} {float(sum(ttft))}")
    metric("kvlab:decode_steps_total", "counter", "Batched decode forward passes.", counters.decode_steps)
    metric("kvlab:decoded_sequences_total", "counter", "Sequences advanced by those passes, all together.",
           counters.decoded_sequences)  # fmt: skip
    return "\n".join(lines) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """``{"name{labels}": value}`` and ``{"name": value}`` (labels dropped, values summed) from a metrics page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            number = float(value)
        except ValueError:
            continue
        out[key] = number
        name = key.split("{", 1)[0]
        if name != key:
            out[name] = out.get(name, 0.0) + number
    return out


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
