"""Notebook 16's problems: an agent session priced under cached-token pricing, and a router for a fleet.

**The agent session.** ``agent_session()`` is a realistic coding-agent run, as data: a system prompt,
tool definitions, a task, and 48 tool calls whose results range from a line to a few thousand
tokens (three of them are whole documents). Turn ``t`` sends the context built by a *layout*
(``layout(session, t) -> messages``) and receives call ``t``. ``price_session`` replays the
prompts through the course's block cache (``kvlab.models.prefix_cache``: a prefix is reused in whole
blocks, at most ``prompt - 1`` tokens) and prices every turn: uncached input, cached input, the
write surcharge some providers add for tokens stored in the cache, and output. The prices are
parameters (``Pricing``); ``EXAMPLE_PRICING`` has illustrative ratios (cached input at a tenth of
uncached input, cache writes at a quarter extra), not any provider's price list: check yours.

Where this simplifies: a provider's cache has its own granularity (often a minimum prefix length
and coarser increments) and its own lifetime; the block size and pool here stand in for both.

``naive_layout`` is what agents often do: a timestamp on top of the system prompt, tools listed
most-recently-used first, and a history trimmed from the front to stay under a budget. All three
break the cached prefix every turn; the first hides the other two, so ``fault_layout(name)`` adds one
of ``NAIVE_FAULTS`` at a time to append-only and ``fault_lines`` prices each alone. ``information_kept`` states what a better layout must keep: the
system prompt, every tool definition and the task in every prompt, and the last ``KEEP_LAST``
tool results verbatim.

**The router.** ``route_fleet(router)`` sends lesson 002's chat traffic to ``replicas`` replicas,
each with a quarter (for four) of the cache, through any routing function
``router(request, replicas) -> index``; each ``ReplicaView`` says how many of the prompt's tokens the
replica has cached (``cached_tokens``, probed before the call: a probe changes nothing) and how many
requests it took (``requests``).
``round_robin``, ``user_hash``, ``most_cached`` (greedy: it piles everyone onto the replica that
caches the system prompt first) and ``longest_prefix`` (the most cached tokens, within a load bound)
are the routers to compare. Real routers: SGLang's ``sglang-router`` (``cache_aware``: an approximate
radix tree per worker and load-balance thresholds) and vLLM's ``vllm-router``.

Kept as one module (under 650 lines): the three parts are notebook 16's problems and share its
cache settings; each is a few small functions.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.core.chat_format import Message, Tokenizer, as_messages, render_text
from kvlab.errors import (
    InvalidArgumentError,
    KvlabError,
    brief,
    check_choice,
    check_int,
    check_items,
    check_optional_str,
)
from kvlab.fleet.traffic import chat_traffic, prompts_and_answers
from kvlab.models.prefix_cache import PrefixCache
from kvlab.server.slots import common_prefix

KEEP_LAST = 5  # tool results a layout must keep verbatim
BLOCK_SIZE = 16
HISTORY_BUDGET = 6000  # tokens of history the naive layout keeps (it drops from the front)

# fmt: off
_WORDS = [
    "cache", "block", "token", "prefix", "request", "server", "reply", "agent", "tool", "file", "line",
    "test", "build", "error", "value", "table", "index", "slot", "layer", "head", "batch", "queue", "model",
    "prompt", "result", "config", "module", "function", "return", "import", "class", "memory", "pool",
    "chain", "hash", "page", "write", "read", "open", "close", "path", "parse", "check", "count", "order",
    "merge", "split"
]
# fmt: on


# ---------------------------------------------------------------- the agent session


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    result: str


@dataclass(frozen=True)
class AgentSession:
    system: str
    tools: tuple[str, ...]
    task: str
    calls: tuple[ToolCall, ...]

    @property
    def turns(self) -> int:
        return len(self.calls)


TOOLS = {
    "read_file": "read_file(path): return the text of a file in the repository",
    "search": "search(query): lines of the repository that match a regular expression",
    "run_tests": "run_tests(selection): run the test suite or part of it and return its output",
    "edit_file": "edit_file(path, old, new): replace one exact piece of text in a file",
    "list_dir": "list_dir(path): the files and folders under a path",
    "web_fetch": "web_fetch(url): the text of a documentation page",
}


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def agent_session(seed: int = 16, calls: int = 48) -> AgentSession:
    """The capstone's agent run: deterministic for a seed; results from a line to a whole document."""
    seed = check_int("seed", seed, minimum=0, maximum=2**63 - 1)
    calls = check_int("calls", calls, minimum=1, maximum=200)
    rng = random.Random(seed)
    system = (
        "You are a coding agent working in a Python repository. Think step by step, call one tool at a "
        "time, and stop when the tests pass. " + _text(rng, 120)
    )
    tools = tuple(f"## {name}\n{doc}\nparameters: " + _text(rng, 40) for name, doc in TOOLS.items())
    task = "Task: make the failing cache tests pass without changing their assertions. " + _text(rng, 60)
    out = []
    documents = {7, 19, 33}  # whole files or pages read in full
    for i in range(calls):
        name = rng.choice(sorted(TOOLS))
        size = rng.choice([12, 25, 40, 80, 150, 300, 600])
        if i in documents:
            name, size = "read_file", 1800
        out.append(ToolCall(name, f"{name}(" + _text(rng, 6) + ")", f"[result {i}] " + _text(rng, size)))
    return AgentSession(system, tools, task, tuple(out))


def _check_session(session: object) -> AgentSession:
    """``session`` if it is an AgentSession whose fields are what ``agent_session`` builds (a forged one is refused)."""
    if not isinstance(session, AgentSession):
        raise InvalidArgumentError(f"session must be an AgentSession (agent_session()), got {brief(session)}")
    texts = (session.system, session.task, *session.tools) if type(session.tools) is tuple else None
    calls = session.calls if type(session.calls) is tuple else None
    if (
        texts is None
        or calls is None
        or len(session.tools) != len(TOOLS)
        or not all(type(t) is str for t in texts)
        or not 1 <= len(calls) <= 200
        or not all(
            type(c) is ToolCall and c.name in TOOLS and type(c.arguments) is str and type(c.result) is str
            for c in calls
        )
    ):
        raise InvalidArgumentError(
            "session must be built by agent_session(): text fields, one definition per tool, 1..200 ToolCalls"
        )
    return session


def _check_turn(session: AgentSession, turn: object) -> int:
    """A turn of ``session``: 0 (before the first call) up to ``session.turns`` (after the last)."""
    return check_int("turn", turn, minimum=0, maximum=session.turns)


def _raised(exc: BaseException) -> str:
    """``Type: message`` of an exception from a caller's function; never raises, whatever its ``__str__`` does."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    text = text if type(text) is str else ""
    return type(exc).__name__ + (f": {text[:200]}" if text else "")


def _history(session: AgentSession, turn: int) -> list[dict[str, str]]:
    msgs = []
    for call in session.calls[:turn]:
        msgs.append({"role": "assistant", "content": call.arguments})
        msgs.append({"role": "tool", "content": call.result})
    return msgs


def _stamp(turn: int) -> str:
    """The naive layout's first line: the current time, a new minute every turn."""
    return f"Current time: 2026-12-01 {10 + turn // 60:02d}:{turn % 60:02d}:00\n"


def _tools_by_recent_use(session: AgentSession, turn: int) -> list[str]:
    """The tool definitions, the most recently used first (the order changes as the agent works)."""
    used = [c.name for c in session.calls[:turn]]
    order = sorted(TOOLS, key=lambda n: (-(len(used) - used[::-1].index(n)) if n in used else 0, n))
    return [session.tools[list(TOOLS).index(n)] for n in order]


def _trimmed(history: list[dict[str, str]]) -> list[dict[str, str]]:
    """The history with its oldest calls dropped until it fits ``HISTORY_BUDGET`` tokens."""
    tok = Tokenizer()
    sizes = [len(tok.encode(m["content"])) for m in history]
    kept = sum(sizes)
    while history and kept > HISTORY_BUDGET:  # drop the oldest call and its result
        kept -= sizes[0] + sizes[1]
        history, sizes = history[2:], sizes[2:]
    return history


def _layout_with(
    session: AgentSession, turn: int, *, stamp: bool, recent_tools: bool, trim: bool
) -> list[dict[str, str]]:
    session = _check_session(session)
    turn = _check_turn(session, turn)
    tools = _tools_by_recent_use(session, turn) if recent_tools else list(session.tools)
    system = (_stamp(turn) if stamp else "") + session.system + "\n" + "\n".join(tools)
    history = _trimmed(_history(session, turn)) if trim else _history(session, turn)
    return [{"role": "system", "content": system}, {"role": "user", "content": session.task}, *history]


def naive_layout(session: AgentSession, turn: int) -> list[dict[str, str]]:
    """A timestamp first, tools most-recently-used first, history trimmed from the front."""
    return _layout_with(session, turn, stamp=True, recent_tools=True, trim=True)


def append_only_layout(session: AgentSession, turn: int) -> list[dict[str, str]]:
    """A fixed prefix (system, tools in one order, task), then every call and result, appended."""
    session = _check_session(session)
    turn = _check_turn(session, turn)
    messages = [
        {"role": "system", "content": session.system + "\n" + "\n".join(session.tools)},
        {"role": "user", "content": session.task},
    ]
    for call in session.calls[:turn]:  # every earlier call and its result, in order, never changed
        messages.append({"role": "assistant", "content": call.arguments})
        messages.append({"role": "tool", "content": call.result})
    return messages


NAIVE_FAULTS: dict[str, dict[str, bool]] = {
    "timestamp first": {"stamp": True, "recent_tools": False, "trim": False},
    "tools most recently used first": {"stamp": False, "recent_tools": True, "trim": False},
    "history trimmed from the front": {"stamp": False, "recent_tools": False, "trim": True},
}
"""The naive layout's three faults, each on its own on top of append-only (``fault_layout(name)``)."""


def fault_layout(fault: str) -> Layout:
    """Append-only with one of ``NAIVE_FAULTS`` added: what that fault costs on its own."""
    fault = check_choice("fault", fault, tuple(NAIVE_FAULTS), what="naive fault")
    options = NAIVE_FAULTS[fault]

    def layout(session: AgentSession, turn: int) -> list[dict[str, str]]:
        return _layout_with(session, turn, **options)

    layout.__name__ = fault.replace(" ", "_")
    return layout


# ---------------------------------------------------------------- pricing


@dataclass(frozen=True)
class Pricing:
    """Dollars per million tokens; ``cache_write`` is a surcharge on input tokens written to the cache."""

    uncached_input: float
    cached_input: float
    output: float
    cache_write: float = 0.0

    def __post_init__(self) -> None:
        for name in ("uncached_input", "cached_input", "output", "cache_write"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
                raise InvalidArgumentError(
                    f"{name} must be dollars per million tokens (0 up to 1e6), got {brief(value)}"
                )


EXAMPLE_PRICING = Pricing(uncached_input=3.0, cached_input=0.30, output=15.0, cache_write=0.75)


@dataclass(frozen=True)
class PricedTurn:
    turn: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    dollars: float

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class SessionCost:
    turns: tuple[PricedTurn, ...]

    @property
    def dollars(self) -> float:
        return sum(t.dollars for t in self.turns)

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    @property
    def cached_tokens(self) -> int:
        return sum(t.cached_tokens for t in self.turns)

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens computed (not read from the cache): what the server spends time on."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_row(self) -> dict[str, Any]:
        return {
            "turns": len(self.turns),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_tokens": self.prefill_tokens,
            "hit_rate": round(self.hit_rate, 4),
            "dollars": round(self.dollars, 4),
        }


Layout = Callable[[AgentSession, int], Sequence[Any]]


def _check_layout(layout: object) -> Layout:
    if not callable(layout):
        raise InvalidArgumentError(
            f"layout must be a function (session, turn) -> messages, got {brief(layout)}"
        )
    return layout  # type: ignore[return-value]


def _messages(session: AgentSession, layout: Layout, turn: int) -> list[Message]:
    """What ``layout`` gives for ``turn``, read as chat messages (bounded, checked).

    The layout's own errors are its own (the caller wrote it) and pass through unchanged; what it
    returns is refused with kvlab's error when it is not a list of role/content messages.
    """
    got = layout(session, turn)
    try:
        return as_messages(got)
    except KvlabError as exc:
        raise InvalidArgumentError(
            f"layout(session, {turn}) gave messages kvlab cannot render: {exc}"
        ) from None
    except Exception as exc:  # a message whose own methods raise
        raise InvalidArgumentError(
            f"layout(session, {turn}) gave messages kvlab cannot read ({_raised(exc)}): "
            "return a list of {'role': ..., 'content': ...} dicts"
        ) from None


def session_prompts(session: AgentSession, layout: Layout) -> list[tuple[int, ...]]:
    """Each turn's prompt tokens under ``layout``, rendered with kvlab's chat template."""
    session, layout = _check_session(session), _check_layout(layout)
    tok = Tokenizer()
    known: dict[tuple[str, str], list[int]] = {}  # a message repeats turn after turn: encode it once
    opening = tok.encode(render_text([], add_generation_prompt=True))
    prompts = []
    for t in range(session.turns):
        tokens: list[int] = []
        for m in _messages(session, layout, t):
            key = (m.role, m.content)
            if key not in known:
                known[key] = tok.encode(render_text([m], add_generation_prompt=False))
            tokens += known[key]
        prompts.append(tuple(tokens + opening))  # the same tokens as chat_format.render
    return prompts


def first_differences(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Where each prompt first differs from the one before it (its length when it only extends it)."""
    items = check_items("prompts", prompts)
    return [common_prefix(a, b) for a, b in zip(items, items[1:], strict=False)]


def price_session(
    session: AgentSession,
    layout: Layout,
    pricing: Pricing = EXAMPLE_PRICING,
    *,
    block_size: int = BLOCK_SIZE,
    num_blocks: int = 8192,
) -> SessionCost:
    """Replay the session under ``layout`` through a block cache and price every turn."""
    if not isinstance(pricing, Pricing):
        raise InvalidArgumentError(f"pricing must be a Pricing, got {brief(pricing)}")
    cache = PrefixCache(num_blocks, block_size)
    tok = Tokenizer()
    turns = []
    for t, prompt in enumerate(session_prompts(session, layout)):
        out = tok.encode(session.calls[t].arguments)
        cached = cache.allocate(f"turn-{t}", prompt).num_cached_tokens
        cache.append(f"turn-{t}", out[:-1])
        cache.free(f"turn-{t}")
        uncached = len(prompt) - cached
        dollars = (
            uncached * (pricing.uncached_input + pricing.cache_write)
            + cached * pricing.cached_input
            + len(out) * pricing.output
        ) / 1e6
        turns.append(PricedTurn(t, len(prompt), cached, len(out), dollars))
    return SessionCost(tuple(turns))


def fault_lines(session: AgentSession, pricing: Pricing = EXAMPLE_PRICING) -> list[str]:
    """Append-only, each naive fault alone, and all three (the naive layout): tokens cached and dollars."""
    rows = [("append-only", append_only_layout)]
    rows += [(f"append-only + {name}", fault_layout(name)) for name in NAIVE_FAULTS]
    rows.append(("naive (all three)", naive_layout))
    lines = [f"{'layout':<48}{'prompt tokens':>14}{'cached':>10}{'hit rate':>10}{'cost':>9}"]
    for name, layout in rows:
        cost = price_session(session, layout, pricing)
        lines.append(
            f"{name:<48}{cost.prompt_tokens:>14,}{cost.cached_tokens:>10,}{cost.hit_rate:>10.1%}{'$' + format(cost.dollars, '.4f'):>9}"
        )
    return lines


def information_kept(session: AgentSession, layout: Layout, keep_last: int = KEEP_LAST) -> tuple[bool, str]:
    """Does every turn's prompt keep the system prompt, each tool, the task and the last results verbatim?"""
    session, layout = _check_session(session), _check_layout(layout)
    keep_last = check_int("keep_last", keep_last, minimum=0, maximum=200)
    for t in range(session.turns):
        text = "\n".join(m.content for m in _messages(session, layout, t))
        for what, piece in (("the system prompt", session.system), ("the task", session.task)):
            if piece not in text:
                return False, f"turn {t}: {what} is missing"
        for i, tool in enumerate(session.tools):
            if tool not in text:
                return False, f"turn {t}: tool definition {i} ({list(TOOLS)[i]}) is missing"
        for call in session.calls[max(0, t - keep_last) : t]:
            if call.result not in text:
                return (
                    False,
                    f"turn {t}: the result of an earlier call ({call.result[:12]}...) is not kept verbatim",
                )
    return True, f"every turn keeps the system prompt, all tools, the task and the last {keep_last} results"


# ---------------------------------------------------------------- the router


@dataclass(frozen=True)
class RoutedRequest:
    index: int
    user: int
    turn: int
    prompt: tuple[int, ...]


@dataclass(frozen=True)
class ReplicaView:
    """What a router sees of a replica: how many of this request's prompt tokens it has cached, and its load.

    Plain numbers, probed before the router is called (a probe changes nothing in the cache), so a
    router can run anywhere, in another process too.
    """

    index: int
    cached_tokens: int  # of this request's prompt, in whole blocks, as the replica would reuse them
    requests: int  # requests it took so far


@dataclass(frozen=True)
class RoutingResult:
    name: str
    replicas: int
    hit_rate: float
    requests: tuple[int, ...]
    replica_hit_rates: tuple[float, ...]

    @property
    def imbalance(self) -> float:
        """The busiest replica's requests over the mean (1.0: perfectly balanced)."""
        mean = sum(self.requests) / len(self.requests)
        return max(self.requests) / mean if mean else 1.0

    def as_row(self) -> dict[str, Any]:
        return {
            "router": self.name,
            "hit_rate": round(self.hit_rate, 4),
            "imbalance": round(self.imbalance, 3),
            "requests": list(self.requests),
        }


Router = Callable[[RoutedRequest, Sequence[ReplicaView]], int]


def round_robin(request: RoutedRequest, replicas: Sequence[ReplicaView]) -> int:
    return request.index % len(replicas)


def user_hash(request: RoutedRequest, replicas: Sequence[ReplicaView]) -> int:
    digest = hashlib.blake2b(str(request.user).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % len(replicas)


def most_cached(request: RoutedRequest, replicas: Sequence[ReplicaView]) -> int:
    """Greedy: the replica with the most cached tokens, whatever its load (ties: the lowest index)."""
    return max(replicas, key=lambda r: (r.cached_tokens, -r.index)).index


def longest_prefix(request: RoutedRequest, replicas: Sequence[ReplicaView], load_bound: float = 1.10) -> int:
    """The replica with the most cached tokens among those within ``load_bound`` x the mean load.

    The default is exercise 16.4's bound: counting this request, no replica goes past 1.10 x the mean.
    """
    mean = (sum(r.requests for r in replicas) + 1) / len(replicas)
    allowed = [r for r in replicas if r.requests + 1 <= load_bound * mean] or list(replicas)
    return max(allowed, key=lambda r: (r.cached_tokens, -r.requests, -r.index)).index


def _router_name(router: object) -> str:
    """The router's ``__name__`` as plain text, or "router" (a callable object may have none, or a strange one)."""
    try:
        named = getattr(router, "__name__", None)
    except Exception:
        named = None
    return str.__str__(named) if isinstance(named, str) and named else "router"


def route_fleet(
    router: Router,
    *,
    replicas: int = 4,
    users: int = 48,
    turns: int = 4,
    system_tokens: int = 600,
    capacity_blocks: int = 2400,
    block_size: int = BLOCK_SIZE,
    seed: int = 1,
    name: str | None = None,
) -> RoutingResult:
    """Lesson 002's traffic over ``replicas`` replicas that split ``capacity_blocks``, routed by ``router``."""
    if not callable(router):
        raise InvalidArgumentError(
            f"router must be a function (request, replicas) -> index, got {brief(router)}"
        )
    name = check_optional_str("name", name, allow_empty=False)
    replicas = check_int("replicas", replicas, minimum=1, maximum=64)
    capacity_blocks = check_int("capacity_blocks", capacity_blocks, minimum=replicas, maximum=1 << 20)
    traffic = chat_traffic(users=users, turns=turns, seed=seed, system_tokens=system_tokens)
    caches = [PrefixCache(capacity_blocks // replicas, block_size) for _ in range(replicas)]
    taken = [0] * replicas
    hits = [0] * replicas
    sent = [0] * replicas
    seen_turns: dict[int, int] = {}
    for i, ((prompt, answer), req) in enumerate(
        zip(prompts_and_answers(traffic, "none"), traffic.requests, strict=True)
    ):
        turn = seen_turns[req.user] = seen_turns.get(req.user, -1) + 1
        request = RoutedRequest(i, req.user, turn, tuple(prompt))
        views = tuple(
            ReplicaView(k, c.probe(prompt).num_cached_tokens, taken[k]) for k, c in enumerate(caches)
        )
        try:
            choice = router(request, views)
        except Exception as exc:  # the student's router: report it (the cause is kept for a checker)
            raise InvalidArgumentError(f"the router raised on request {i}: {_raised(exc)}") from exc
        if type(choice) is not int or not 0 <= choice < replicas:
            raise InvalidArgumentError(
                f"the router must return a replica index 0..{replicas - 1}, got {brief(choice)}"
            )
        cache = caches[choice]
        try:
            got = cache.allocate(f"r{i}", prompt).num_cached_tokens
            cache.append(f"r{i}", answer[:-1])
        except KvlabError:
            got = 0  # a replica too small for this request: it computes it without caching
        if f"r{i}" in cache.requests:
            cache.free(f"r{i}")
        taken[choice] += 1
        hits[choice] += got
        sent[choice] += len(prompt)
    total = sum(sent)
    return RoutingResult(
        name or _router_name(router),
        replicas,
        sum(hits) / total if total else 0.0,
        tuple(taken),
        tuple(h / s if s else 0.0 for h, s in zip(hits, sent, strict=True)),
    )


# ---------------------------------------------------------------- part 1: a trace of two tenants

CHAT_SYSTEM = "You are a careful assistant who explains caches. " * 12
CHAT_TENANTS = ("alice", "bob")
CHAT_TURNS = 3
CHAT_MAX_TOKENS = 13  # the reply pushes turn 1's cached tokens past the next block boundary
SAMPLE_TRACE = "two_tenants.jsonl"  # kvlab/traces/samples/: this chat, recorded from kvlab serve


def two_tenant_chat(recorder: Any) -> None:
    """Notebook 16's chat: two tenants, three turns each, behind one system prompt, each with its salt.

    ``recorder`` is a ``kvlab.traces.record.TraceRecorder``; ``/metrics`` is scraped before and after.
    """
    recorder.metrics()
    for tenant in CHAT_TENANTS:
        messages = [{"role": "system", "content": CHAT_SYSTEM}]
        for turn in range(CHAT_TURNS):
            messages.append({"role": "user", "content": f"{tenant} asks question {turn} about blocks"})
            reply = recorder.chat(messages, max_tokens=CHAT_MAX_TOKENS, cache_salt=tenant)
            messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    recorder.metrics()


def sample_trace_path() -> str:
    """The recorded trace of ``two_tenant_chat`` against ``kvlab serve`` (blocks, 16-token blocks, 64 blocks)."""
    from importlib.resources import files

    return str(files("kvlab.traces").joinpath("samples", SAMPLE_TRACE))
