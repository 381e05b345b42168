"""Lesson example 10: llama-server's ``cache_n`` across the turns of a chat.

The lesson sent four turns of one conversation to llama-server (a tiny
qwen2-vocab model, ``-np 1 --cache-ram 0``, ``max_tokens`` 8) twice: append-only,
then with a clock line at the start of the system prompt. Its recorded counters
are here next to kvlab's replay of the same two runs (``example_10``), which
uses ``kvlab.server.slots.SlotServer`` and ``kvlab.server.conversation.replay_chat``.

Notebook 10's helpers live here too, so its cells are a few calls: the two agents taking turns on
several slot servers (``take_turns``), the stepper's steps and figure (``counter_steps``,
``counters_figure``) and the chat over HTTP (``chat_over_http``). Kept as one module: the lesson's
recorded counters and every helper notebook 10 calls sit together, in the order the notebook uses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.chat_format import Message, Tokenizer, render, reply_tokens
from kvlab.core.snapshots import RequestRecord, Step
from kvlab.errors import InvalidArgumentError, brief, check_bool, check_items, check_size, check_text
from kvlab.server.conversation import ChatTurn, TurnCounters, predicted_cache_n, replay_chat, tokens_processed
from kvlab.server.slots import SlotServer
from kvlab.views import cache_n_figure
from kvlab.views.animations import animate
from kvlab.views.text import caption

# the lesson's recorded values (llama-server, tiny qwen2-vocab model, -np 1 --cache-ram 0, max_tokens 8)
LESSON_MAX_TOKENS = 8
LESSON_APPEND_ONLY = (
    TurnCounters(34, 0, 34),
    TurnCounters(56, 41, 15),
    TurnCounters(78, 63, 15),
    TurnCounters(100, 85, 15),
)
LESSON_CLOCK = (
    TurnCounters(46, 3, 43),
    TurnCounters(68, 10, 58),
    TurnCounters(90, 10, 80),
    TurnCounters(112, 10, 102),
)
# not the lesson's: kvlab's own run of the same experiment on llama-server 0c1e57098 with a tiny
# random-weight test model (another tokenizer, longer prompts): cache_n = previous + 8 - 1 again
NOTES_APPEND_ONLY = (
    TurnCounters(76, 0, 76),
    TurnCounters(134, 83, 51),
    TurnCounters(184, 141, 43),
    TurnCounters(248, 191, 57),
)

EXAMPLE_SYSTEM = "You are a coding agent. Read files with the tools and answer briefly."
EXAMPLE_MESSAGES = (
    "List the files in src.",
    "Open Main.java and summarize it.",
    "Which function parses the config?",
    "Run the tests and report failures.",
)


def clock_at_ten(turn: int) -> str:
    """The lesson's clock line: "Time: 10:00:00. ", one minute later each turn."""
    turn = check_size("turn", turn, "turns")
    return f"Time: 10:{turn:02d}:00. "


def arithmetic_report(
    append_only: Sequence[TurnCounters] = LESSON_APPEND_ONLY,
    clock: Sequence[TurnCounters] = LESSON_CLOCK,
    max_tokens: int = LESSON_MAX_TOKENS,
) -> list[str]:
    """The lesson's check of recorded counters against the rule, one line per turn plus the totals."""
    append_only, clock = _counters("append_only", append_only), _counters("clock", clock)
    sizes = [t.prompt_tokens for t in append_only]
    predicted = predicted_cache_n(sizes, max_tokens)
    lines = []
    for i, t in enumerate(append_only):
        added = t.prompt_tokens - (sizes[i - 1] if i else 0)
        lines.append(
            f"turn {i + 1}: +{added:2d} tokens, predicted cache_n {predicted[i]:3d}, "
            f"observed {t.cache_n:3d}, processed {t.prompt_tokens - t.cache_n:3d}"
        )
    lines.append(
        f"tokens processed over {len(append_only)} turns: append-only {tokens_processed(append_only)}, "
        f"timestamp in system prompt {tokens_processed(clock)}"
    )
    return lines


def _counters(name: str, turns: object) -> list[TurnCounters]:
    """A run's recorded counters: a non-empty list of TurnCounters (at most LIMITS.turns)."""
    items = check_items(name, turns, "turns", what="a list of TurnCounters")
    if not items:
        raise InvalidArgumentError("give at least one turn for each run")
    for i, t in enumerate(items):
        if not isinstance(t, TurnCounters):
            raise InvalidArgumentError(f"{name}[{i}] must be a TurnCounters, got {type(t).__name__}")
    return items


@dataclass(frozen=True)
class Example10:
    """Example 10 side by side: the lesson's recorded counters and kvlab's own replay."""

    lesson_append_only: tuple[TurnCounters, ...]
    lesson_clock: tuple[TurnCounters, ...]
    kvlab_append_only: tuple[ChatTurn, ...]
    kvlab_clock: tuple[ChatTurn, ...]
    max_tokens: int

    def rows(self) -> list[dict[str, object]]:
        """One row per (run, turn) with both sources, for a table or a plot."""
        out: list[dict[str, object]] = []
        for run, lesson, ours in (
            ("append-only", self.lesson_append_only, self.kvlab_append_only),
            ("clock in system prompt", self.lesson_clock, self.kvlab_clock),
        ):
            for i, (a, b) in enumerate(zip(lesson, ours, strict=False)):
                out.append(
                    {
                        "run": run,
                        "turn": i + 1,
                        "lesson_prompt_tokens": a.prompt_tokens,
                        "lesson_cache_n": a.cache_n,
                        "lesson_prompt_n": a.prompt_n,
                        "kvlab_prompt_tokens": b.prompt_tokens,
                        "kvlab_cache_n": b.cache_n,
                        "kvlab_prompt_n": b.prompt_n,
                    }
                )
        return out


def example_10(max_tokens: int = LESSON_MAX_TOKENS) -> Example10:
    """Replay the lesson's two runs on one slot (``-np 1 --cache-ram 0``), append-only first.

    The clock run starts on the slot the append-only run left behind, so its
    first turn matches only ``<|im_start|>system\\n`` (3 tokens), as in the lesson.
    """
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    server = SlotServer(1, cache_ram_mib=0)
    tok = Tokenizer()
    plain = replay_chat(
        EXAMPLE_MESSAGES, system=EXAMPLE_SYSTEM, server=server, tokenizer=tok, max_tokens=max_tokens
    )
    timed = replay_chat(
        EXAMPLE_MESSAGES,
        system=EXAMPLE_SYSTEM,
        server=server,
        tokenizer=tok,
        max_tokens=max_tokens,
        clock=clock_at_ten,
    )
    return Example10(LESSON_APPEND_ONLY, LESSON_CLOCK, tuple(plain), tuple(timed), max_tokens)


def _ids(start: int, n: int) -> tuple[int, ...]:
    """Token ids inside the real tiny model's 512-token vocabulary, deterministic."""
    return tuple(3 + (start + 7 * i) % 509 for i in range(n))


def _lesson_chat() -> list[object]:
    """The lesson's append-only chat as token ids: a 34-token prompt, then 14 new tokens a turn after each reply."""
    from kvlab.lessons.real_llama import Request

    return [Request(_ids(0, 34), 8)] + [Request(_ids(t, 14), 8, after_previous=True) for t in (1, 2, 3)]


def real_chat_rows() -> list[tuple[str, list[int], list[int], list[int]]] | None:
    """The lesson's append-only chat (its prompt sizes, 8-token replies) on a real llama-server, run now.

    Rows for ``compare_table(..., sources=("lesson", REAL_SERVER))``: (what, kvlab's model on the
    prompts and replies the real server saw, the lesson's figure, the real server's). None without
    the binary (``python tools/conformance/llama_harness.py --build``).
    """
    from kvlab.lessons.real_llama import available, run_slots

    if not available("llama"):
        return None
    real, ours = run_slots(_lesson_chat(), n_ctx=512)
    lesson = {"prompt": [34, 56, 78, 100], "cache_n": [0, 41, 63, 85], "prompt_n": [34, 15, 15, 15]}
    return [
        (f"append-only: {'prompt_tokens' if key == 'prompt' else key}", [r[key] for r in ours], lesson[key],
         [r[key] for r in real])
        for key in ("prompt", "cache_n", "prompt_n")
    ]  # fmt: skip


def on_real_server(chat: bool = True) -> list[str]:
    """Three runs on a real llama-server next to kvlab's prediction, or one line saying how to get one.

    An append-only chat of token ids (``cache_n`` = previous prompt + 8 - 1), a prompt longer than
    the slot that is refused yet still moves the next request to the other slot, and ``n_predict:
    0``, which samples one token anyway (``kvlab.lessons.real_llama``). ``chat=False`` leaves the
    chat out (notebook 10 shows it as a table with ``real_chat_rows``).
    """
    from kvlab.lessons.real_llama import Request, available, missing_line, run_slots, side_by_side

    chat = check_bool("chat", chat)
    if not available("llama"):
        return [missing_line("each request's slot, cache_n, prompt_n and tokens sampled next to kvlab's")]
    turns = _lesson_chat()
    refusal = [Request(_ids(4, 10)), Request(_ids(5, 300)), Request(_ids(6, 12))]
    zero = [Request(_ids(7, 40), 0), Request(_ids(7, 40) + _ids(8, 5), 0)]
    cols = ["slot", "cache_n", "prompt_n", "n_generated"]
    lines = (
        side_by_side("append-only chat, -np 1, max_tokens 8", *run_slots(turns, n_ctx=512), cols)
        if chat
        else []
    )
    real, ours = run_slots(refusal, n_slots=2, n_ctx=256)
    slots = "a 300-token prompt on 256-token slots: -np 2 -c 512, and each slot gets -c / -np = 512 / 2 = 256 tokens"
    lines += side_by_side(slots, real, ours, cols)
    lines.append(refusal_line(real, ours))
    lines += side_by_side("n_predict 0, -np 1", *run_slots(zero, n_ctx=512), cols)
    return lines


def refusal_line(real: list[dict], ours: list[dict], refused: int = 2) -> str:
    """Which slot the refused request (counted from 1) took in kvlab's model, and where the next one went.

    The real server's HTTP 400 names no slot, so the slot comes from kvlab's model, which the next
    request's slot (real and modelled) then confirms: the refused request's slot was marked as just
    used, so the next request goes to the other, least recently used, one.
    """
    if not 1 <= refused < len(ours) or len(real) != len(ours):
        raise InvalidArgumentError(
            "give the real and kvlab rows of the same requests, with one after the refused one"
        )
    slot = ours[refused - 1]["slot"]
    after_real, after_ours = real[refused].get("slot"), ours[refused].get("slot")
    return (
        f"  request {refused} was refused after kvlab's model placed it on slot {slot} (the real server's HTTP 400 "
        f"names no slot); that slot now counts as just used, so request {refused + 1} went to slot "
        f"{after_real} | {after_ours}"
    )


# ---------------------------------------------------------------------------- notebook 10's helpers

REAL_SERVER = "llama-server 0c1e57098 (tiny test model), observed by kvlab"
"""The column head of counters kvlab itself recorded on a real llama-server (not the lesson's)."""

TWO_AGENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "coder": (
        "Coding agent. Read files with the tools, change as little as you can, and answer briefly.",
        ("List the files in src.", "Open the config.", "Run the tests."),
    ),
    "planner": (
        "Travel planner. Suggest trains before flights, keep to the budget, and answer in short lines.",
        ("Plan a weekend in Lyon.", "Find a cheaper hotel.", "Add a museum visit."),
    ),
}
"""Two agents with different system prompts, three turns each (notebook 10, several slots)."""

AgentRun = list[tuple[str, RequestRecord]]


def _agent_run(name: str, run: object) -> AgentRun:
    """A run of ``take_turns``: a list of (agent name, RequestRecord)."""
    items = check_items(name, run, what="a list of (agent, RequestRecord) pairs")
    pairs: AgentRun = []
    for item in items:  # read through tuple's own methods: a subclass's may raise or lie
        pair = tuple.__getitem__(item, slice(None)) if isinstance(item, tuple) else ()
        if not (len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], RequestRecord)):
            raise InvalidArgumentError(
                f"{name} must hold (agent, RequestRecord) pairs, as take_turns returns"
            )
        pairs.append((check_text("an agent's name", pair[0]), pair[1]))
    return pairs


def _server(server: object) -> SlotServer:
    if not isinstance(server, SlotServer):
        raise InvalidArgumentError(f"server must be a SlotServer, got {type(server).__name__}")
    return server


def take_turns(server: SlotServer, max_tokens: int = LESSON_MAX_TOKENS) -> AgentRun:
    """The two agents of ``TWO_AGENTS`` taking turns on ``server``, coder first; one (agent, record) per request.

    Each turn is what ``replay_chat`` does for one conversation: render the history and a new
    message, send it with the simulated model's greedy reply, keep the reply in the history.
    """
    server = _server(server)
    max_tokens = check_size("max_tokens", max_tokens, "tokens", minimum=1)
    tokenizer = Tokenizer()
    histories = {name: [Message("system", system)] for name, (system, _) in TWO_AGENTS.items()}
    out: AgentRun = []
    for turn in range(3):
        for name, (_, texts) in TWO_AGENTS.items():
            history = histories[name] + [Message("user", texts[turn])]
            prompt = render(history, tokenizer)
            reply = reply_tokens(tokenizer, prompt.tokens, max_tokens)
            out.append((name, server.complete(prompt.tokens, max_tokens=max_tokens, generated=reply)))
            histories[name] = history + [Message("assistant", tokenizer.decode(reply))]
    return out


def two_agents_on_three_servers() -> dict[str, AgentRun]:
    """The two agents on ``-np 1``, ``-np 2`` (both ``--cache-ram 0``) and ``-np 1`` with the default RAM cache."""
    servers = {
        "-np 1": SlotServer(1, cache_ram_mib=0),
        "-np 2": SlotServer(2, cache_ram_mib=0),
        "-np 1 + RAM cache": SlotServer(1),  # --cache-ram 8192, the default
    }
    return {label: take_turns(server) for label, server in servers.items()}


_HOW = {"lru": "least recently used", "lcp": "similarity", "id": "id_slot"}
"""How ``agent_lines`` names a ``RequestRecord.selected_by``: ``lcp`` is the longest common prefix's share of the prompt."""


def agent_lines(results: dict[str, AgentRun]) -> list[str]:
    """One line per request: the agent, its slot and how it was chosen, its counters and the RAM cache's moves.

    A slot chosen by similarity shows the share of the prompt that its longest common prefix with the
    slot covers (llama-server's ``lcp`` similarity).
    """
    pairs = list(dict.items(results)) if isinstance(results, dict) else None  # dict's own, not a subclass's
    if pairs is None or not all(isinstance(k, str) for k, _ in pairs):
        raise InvalidArgumentError(
            "results must map a server's label to its run, as two_agents_on_three_servers returns"
        )
    results = {
        check_text("a server's label", label): _agent_run(f"results[{brief(label)}]", run)
        for label, run in pairs
    }
    lines = [
        "(slot chosen by similarity: the share of the prompt its longest common prefix with the slot covers)"
    ]
    for label, records in results.items():
        lines.append(label)
        for i, (name, r) in enumerate(records, 1):
            how = _HOW.get(r.selected_by, r.selected_by) + (
                "" if r.similarity is None else f" {r.similarity:.2f}"
            )
            ram = (", saved to RAM" if r.ram_saved else "") + (", loaded from RAM" if r.ram_loaded else "")
            lines.append(
                f"  {i}. {name:<8} slot {r.slot_id} by {how:<19}  prompt {r.prompt_tokens:>3}  "
                f"cache_n {r.cache_n:>3}  prompt_n {r.prompt_n:>3}{ram}"
            )
    return lines


def same_counters_from(a: AgentRun, b: AgentRun) -> int | None:
    """The first request (counting from 1) from which ``a`` and ``b`` report the same cache_n and prompt_n
    on every request to the end, or None when their last requests already differ."""
    a, b = _agent_run("a", a), _agent_run("b", b)
    if len(a) != len(b) or not a:
        raise InvalidArgumentError("give two runs of the same, non-zero number of requests")
    first = None
    for i in range(len(a), 0, -1):
        (_, x), (_, y) = a[i - 1], b[i - 1]
        if (x.cache_n, x.prompt_n) != (y.cache_n, y.prompt_n):
            break
        first = i
    return first


def where_matches_stop(
    server: SlotServer, tokenizer: Tokenizer, requests: Sequence[int] = (2, 6)
) -> list[str]:
    """For each request the server placed (numbered from 1 in arrival order), its ``cache_n`` and the text on both sides of it."""
    server = _server(server)
    if not isinstance(tokenizer, Tokenizer):
        raise InvalidArgumentError(f"tokenizer must be a kvlab Tokenizer, got {type(tokenizer).__name__}")
    placed = [step for step in server.history if step.event.kind == "slots.place"]
    numbers = [
        check_size("a request number", n, "count", minimum=1) for n in check_items("requests", requests)
    ]
    for n in numbers:
        if n > len(placed):
            raise InvalidArgumentError(f"the server placed {len(placed)} requests; there is no request {n}")
    lines = []
    for n in numbers:
        step = placed[n - 1]
        prompt, cache_n = step.state.slots[step.state.last.slot_id].tokens, step.state.last.cache_n
        lines += [
            f"request {n}: cache_n {cache_n} of {len(prompt)} tokens",
            "  end of the reused part: " + repr(_tail_text(tokenizer, prompt[:cache_n])),
            "  processed:              " + repr(tokenizer.decode(prompt[cache_n:])[:90]),
        ]
    return lines


def _tail_text(tokenizer: Tokenizer, tokens: Sequence[int], chars: int = 50) -> str:
    """The last whole tokens of ``tokens`` that fit in about ``chars`` characters (at least one token),
    so the snippet never starts inside a token."""
    start = max(len(tokens) - 1, 0)
    while start > 0 and len(tokenizer.decode(tokens[start - 1 :])) <= chars:
        start -= 1
    return tokenizer.decode(tokens[start:])


def _runs_up_to(server: SlotServer, index: int, turns: int) -> dict[str, list[object]]:
    """Each request placed up to step ``index``, split into the append-only and the clock run; unsent turns are (0, 0)."""
    latest: dict[str, RequestRecord] = {}
    for step in server.history.steps[: index + 1]:
        if step.state.last is not None:
            latest[step.state.last.request_id] = step.state.last
    records: list[object] = list(latest.values())
    unsent: list[object] = [(0, 0)] * turns
    return {
        "append-only": (records[:turns] + unsent)[:turns],
        "clock in the system prompt": (records[turns:] + unsent)[:turns],
    }


def counter_steps(server: SlotServer, turns: int = 4) -> list[Step]:
    """One Step per step of the server's history: its caption and every request's counters so far, by run."""
    server = _server(server)
    turns = check_size("turns", turns, "turns", minimum=1)
    return [
        Step(step.index, caption(step), _runs_up_to(server, step.index, turns)) for step in server.history
    ]


def counters_figure(runs: dict[str, list[object]], title: str = "Each request so far: cache_n and prompt_n"):
    """cache_n_figure of both runs with one y axis for every step (0-125 tokens), so the bars do not jump."""
    figure = cache_n_figure(runs, title=title).update_annotations(xanchor="center")
    return figure.update_yaxes(range=[0, 125])


def counters_animation(server: SlotServer, turns: int = 4):
    """The plotly animation of ``counter_steps``: one frame per request placed (the steps where the bars change).

    It opens on the first request, not on the empty start, so a page without a kernel shows bars at once.
    """
    server = _server(server)
    steps = counter_steps(server, turns)
    placed = [s for s in steps if server.history[s.index].event.kind == "slots.place"] or steps[:1]
    return animate(
        [counters_figure(s.state, caption(s)).to_dict() for s in placed], [caption(s) for s in placed]
    )


def chat_over_http(
    server: object, messages: Sequence[str], system: str = EXAMPLE_SYSTEM
) -> list[tuple[str, list[int], list[int]]]:
    """Play an append-only chat as llama-server's client does, and kvlab's prediction beside the server's counters.

    Each turn: ``POST /tokenize`` for the rendered history's ids, then ``POST /completion`` with those
    ids and ``n_predict`` 8, the reply kept in the history. The recorded exchanges go through
    ``kvlab.traces`` (llama-server's slots, one slot). ``server`` is what ``kvlab.serve.start_server``
    returns. One row per turn: (what, kvlab's [cache_n, prompt_n], the server's [cache_n, prompt_n]).
    """
    from kvlab.core.chat_format import render_text
    from kvlab.traces import predict_trace, read_trace
    from kvlab.traces.record import TraceRecorder

    if not hasattr(server, "url") or not hasattr(server, "post"):
        raise InvalidArgumentError(f"server must be what start_server returns, got {type(server).__name__}")
    texts = [
        check_text("a message", m, allow_empty=False) for m in check_items("messages", messages, "turns")
    ]
    history = [{"role": "system", "content": check_text("system", system)}]
    with TraceRecorder(server.url) as recorder:
        for text in texts:
            history.append({"role": "user", "content": text})
            ids = server.post("/tokenize", {"content": render_text(history)})["tokens"]  # the server's ids
            reply = recorder.completion(ids, n_predict=LESSON_MAX_TOKENS, return_tokens=True)
            history.append({"role": "assistant", "content": reply["content"]})
        report = predict_trace(read_trace(recorder.text()), server="llama", slots=1)

    def split(counters: dict) -> list[int]:
        return [counters["cached_tokens"], counters["prompt_tokens"] - counters["cached_tokens"]]

    return [
        (f"turn {r.index + 1}: cache_n, prompt_n", split(r.predicted), split(r.reported)) for r in report.rows
    ]


def compare_runs(a: AgentRun, b: AgentRun, a_name: str, b_name: str) -> list[str]:
    """From which request ``b``'s counters equal ``a``'s to the end, and each earlier request where they differ."""
    a_name, b_name = check_text("a_name", a_name), check_text("b_name", b_name)
    a, b = _agent_run("a", a), _agent_run("b", b)
    agree = same_counters_from(a, b)
    lines = [
        f"{b_name}: cache_n and prompt_n equal {a_name}'s from request {agree} on"
        if agree
        else f"{b_name}: the last request's counters differ from {a_name}'s"
    ]
    for i, ((name, x), (_, y)) in enumerate(zip(a, b, strict=True), 1):
        if (agree is None or i < agree) and (x.cache_n, x.prompt_n) != (y.cache_n, y.prompt_n):
            lines.append(
                f"  request {i} ({name}) differs: cache_n {y.cache_n}, prompt_n {y.prompt_n} "
                f"against {x.cache_n} and {x.prompt_n}"
            )
    return lines
