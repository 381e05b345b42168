"""Bring your own trace: read what a real server reported and predict, request by request, what it should have.

    from kvlab.traces import read_trace, predict_trace
    report = predict_trace(read_trace("my_server.jsonl"), block_size=16, num_blocks=2048)
    for row in report.rows: print(row.index, row.reported, row.predicted, row.explanation)

``python -m kvlab trace FILE`` does the same from a shell. ``kvlab.traces.read`` documents the
file formats, ``kvlab.traces.predict`` the two models, ``kvlab.traces.explain`` the explanations.
"""

from kvlab.traces.predict import SERVERS, TraceReport, TraceRow, TraceSettings, predict_trace
from kvlab.traces.read import Checkpoint, Exchange, Reported, Trace, TraceError, parse_metrics, read_trace

__all__ = [
    "SERVERS",
    "Checkpoint",
    "Exchange",
    "Reported",
    "Trace",
    "TraceError",
    "TraceReport",
    "TraceRow",
    "TraceSettings",
    "parse_metrics",
    "predict_trace",
    "read_trace",
]
