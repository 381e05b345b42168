"""``python -m kvlab trace FILE``: what a server's cache reported, request by request, beside kvlab's prediction.

FILE holds JSON lines, one ``{"request": ..., "response": ...}`` exchange per line in the order the
requests were sent (``kvlab.traces.read`` lists the other accepted lines and the transcript form);
``-`` reads standard input. ``--server`` picks the model (``auto``: llama-server when the responses
carry ``timings``, vLLM's block hashing otherwise); ``--block-size``, ``--num-blocks``, ``--slots``
and ``--n-ctx`` give what the trace does not say. ``--json`` prints a list of ``{"index", "reported",
"predicted", "match", "explanation"}``, one per request, then one per checkpoint (``"index": null``,
``"checkpoint": true``); what was assumed goes to standard error. A malformed file exits 2 with one line naming the line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvlab.cli.options import at_least
from kvlab.core.jsonio import dumps
from kvlab.errors import KvlabError
from kvlab.traces import SERVERS, TraceReport, TraceSettings, predict_trace, read_trace


class _UsageError(Exception):
    """A bad command line; main prints it as one line and returns 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m kvlab trace", description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="the trace: JSON lines of {request, response} exchanges ('-' for stdin)")
    p.add_argument("--server", choices=SERVERS, default="auto", help="which server's cache to model")
    p.add_argument("--block-size", type=at_least(1, "block_size"), help="tokens per block (vLLM)")
    p.add_argument("--num-blocks", type=at_least(1, "num_blocks"), help="blocks in the pool (vLLM)")
    p.add_argument("--slots", type=at_least(1, "slots"), help="llama-server's -np")
    p.add_argument("--n-ctx", type=at_least(1, "tokens"), help="llama-server's context per slot")
    p.add_argument(
        "--cache-ram", type=at_least(1, "mib"), help="llama-server's --cache-ram in MiB (default: off)"
    )
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    return p


def format_report(report: TraceReport) -> str:
    """A table a person reads: one line per request, then the explanation of each mismatch."""

    def counter(d: dict | None) -> str:
        if d is None:
            return "-"
        if "error" in d:
            return f"error {d['error']}"
        if "hits" in d:  # a /metrics checkpoint: hits/queries between two scrapes
            return f"{d['hits']:g}/{d['queries']:g} tokens"
        if not d:
            return "-"
        text = f"{d.get('cached_tokens')}/{d.get('prompt_tokens')}"
        return text + (f" slot {d['slot']}" if d.get("slot") is not None else "")

    checked = (*report.rows, *report.checkpoints)
    agree = sum(1 for r in checked if r.match)
    compared = sum(1 for r in checked if r.match is not None)
    lines = [f"model: {report.server}   (cached/prompt tokens; agree: {agree} of {compared})"]
    lines.append(f"{'#':>4}  {'line':>5}  {'reported':<20}{'predicted':<20}agree")
    for r in (*report.rows, *report.checkpoints):
        mark = {True: "yes", False: "NO", None: "-"}[r.match]
        index = str(r.index) if r.index >= 0 else "chk"
        lines.append(f"{index:>4}  {r.line:>5}  {counter(r.reported):<20}{counter(r.predicted):<20}{mark}")
        lines.append(f"{'':13}{r.explanation}")
    lines += [f"assumed: {note}" for note in report.assumptions]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
        source = sys.stdin.buffer if args.file == "-" else args.file
        settings = TraceSettings(
            server=args.server,
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            slots=args.slots,
            n_ctx=args.n_ctx,
            cache_ram_mib=args.cache_ram or 0,
        )
        report = predict_trace(read_trace(source), settings)
    except _UsageError as exc:
        print(f"kvlab trace: error: {exc} (see python -m kvlab trace --help)", file=sys.stderr)
        return 2
    except KvlabError as exc:
        print(f"kvlab trace: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    rows = [r.as_dict() for r in report.rows]
    rows += [{**r.as_dict(), "index": None, "checkpoint": True} for r in report.checkpoints]
    text = dumps(rows) if args.json else format_report(report)
    if args.json:  # what was assumed still reaches the reader, beside the JSON
        for note in report.assumptions:
            print(f"kvlab trace: assumed: {note}", file=sys.stderr)
    try:
        print(text)
    except BrokenPipeError:
        return 0
    return 0
