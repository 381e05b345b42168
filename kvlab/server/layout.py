"""Prompt layout and prefix-cache hit rates (lesson example 9).

A prompt is an ordered list of named segments -- system prompt, tool
definitions, history, the new message, a timestamp. Each turn of an agent
session builds a prompt from its layout, and a prefix cache counts how many of
its tokens it already holds. Because every block hash covers all blocks before
it, a hit run stops at the first block that differs from what was cached:
whatever changes between turns must come late, and whatever is fixed must come
first, in a fixed order.

Counting follows the lesson's program and a server's prefix cache: split the
prompt into full 16-token blocks, walk their chained hashes from the start,
count a block as cached while every block so far was seen in an earlier turn,
and remember every hash (nothing is evicted here). Two chains are available and
give the same counts: ``scheme="java"`` ports the lesson's 64-bit chain
(``h = h * 1_000_003 + List.hashCode(block)`` from 17, wrapping like a Java
long), and ``"lesson"`` / ``"vllm"`` use ``kvlab.core.hashing``'s SHA-256 chains,
as a server does. SHA-256 makes a false hit practically impossible; the Java
chain is only there to show the figures do not depend on the hash.

A layout is a list of ``Segment``; build your own with ``fixed``, ``per_turn``
or any ``Segment(name, build)`` whose ``build(session, turn)`` returns token ids.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvlab.core import hashing
from kvlab.core.workloads import JavaRandom, java_list_hash
from kvlab.errors import (
    LIMITS,
    InvalidArgumentError,
    check_bool,
    check_choice,
    check_int,
    check_items,
    check_size,
    check_text,
)
from kvlab.server.inputs import call_user, read_tokens

SCHEMES = ("java", "lesson", "vllm")
_LONG = 1 << 64
JAVA_LONG = (-(2**63), 2**63 - 1)  # the seed of java.util.Random is a long


def _rng(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


class AgentSession:
    """The content of the lesson's agent session; a layout decides the order it is sent in.

    Token ids follow the lesson: system prompt 10,000+, tool t at 20,000 + 100 t,
    the turn's message at 50,000 + 1,000 turn, its answer at 60,000 + 1,000 turn,
    a timestamp at 90,000 + 10 turn. After each turn the message and the answer
    are appended to the history. ``random`` is a ``java.util.Random(seed)`` shared
    by the whole run, so shuffles match the lesson's ``Collections.shuffle``.
    """

    def __init__(
        self,
        *,
        system_tokens: int = 300,
        n_tools: int = 10,
        tool_tokens: int = 50,
        message_tokens: int = 30,
        answer_tokens: int = 90,
        timestamp_tokens: int = 10,
        seed: int = 1,
    ) -> None:
        for name, v in (
            ("system_tokens", system_tokens),
            ("n_tools", n_tools),
            ("tool_tokens", tool_tokens),
            ("message_tokens", message_tokens),
            ("answer_tokens", answer_tokens),
            ("timestamp_tokens", timestamp_tokens),
        ):
            check_size(name, v, "tokens", minimum=0)  # each part at most LIMITS.tokens
        if n_tools * tool_tokens > LIMITS.tokens:
            raise InvalidArgumentError(
                f"{n_tools} tools of {tool_tokens} tokens are more than LIMITS.tokens ({LIMITS.tokens:,})"
            )
        if tool_tokens > 100 or message_tokens + answer_tokens > 1000 or timestamp_tokens > 10:
            raise InvalidArgumentError(
                "tool_tokens <= 100, message_tokens + answer_tokens <= 1000 and timestamp_tokens <= 10 "
                "keep the id ranges of different parts apart"
            )
        seed = check_int("seed", seed, minimum=JAVA_LONG[0], maximum=JAVA_LONG[1])
        system_tokens, n_tools, tool_tokens = int(system_tokens), int(n_tools), int(tool_tokens)
        message_tokens, answer_tokens, timestamp_tokens = (
            int(message_tokens),
            int(answer_tokens),
            int(timestamp_tokens),
        )
        self.system_tokens, self.n_tools, self.tool_tokens = system_tokens, n_tools, tool_tokens
        self.message_tokens, self.answer_tokens, self.timestamp_tokens = (
            message_tokens,
            answer_tokens,
            timestamp_tokens,
        )
        self.random = JavaRandom(seed)
        self.history: list[int] = []

    def system(self) -> list[int]:
        return _rng(10_000, self.system_tokens)

    def tools(self) -> list[list[int]]:
        return [_rng(20_000 + t * 100, self.tool_tokens) for t in range(self.n_tools)]

    def timestamp(self, turn: int) -> list[int]:
        return _rng(90_000 + _turn(turn) * 10, self.timestamp_tokens)

    def message(self, turn: int) -> list[int]:
        return _rng(50_000 + _turn(turn) * 1000, self.message_tokens)

    def answer(self, turn: int) -> list[int]:
        return _rng(60_000 + _turn(turn) * 1000, self.answer_tokens)

    def end_turn(self, turn: int) -> None:
        """The user message stays in the history; the answer and tool results are appended."""
        self.history += self.message(turn) + self.answer(turn)


def _turn(turn: object) -> int:
    """A turn number, 0..``LIMITS.turns`` (its ids stay far below MAX_TOKEN_ID)."""
    return check_size("turn", turn, "turns")


@dataclass(frozen=True)
class Segment:
    """A named part of the prompt; ``build(session, turn)`` gives its token ids for that turn."""

    name: str
    build: Callable[[AgentSession, int], Sequence[int]]

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", check_text("a segment's name", self.name, allow_empty=False))
        if not callable(self.build):
            raise InvalidArgumentError(
                f"segment {self.name!r}: build must be a callable (session, turn) -> tokens"
            )


def fixed(name: str, tokens: Sequence[int]) -> Segment:
    """A segment that is the same every turn (at most ``LIMITS.tokens`` ids)."""
    toks = tuple(read_tokens("tokens", tokens, allow_empty=True))
    return Segment(name, lambda session, turn: toks)


def per_turn(name: str, build: Callable[[int], Sequence[int]]) -> Segment:
    """A segment that depends only on the turn number, e.g. a date or a request id."""
    if not callable(build):
        raise InvalidArgumentError("build must be a callable turn -> tokens")
    return Segment(name, lambda session, turn: build(turn))


def system_prompt() -> Segment:
    return Segment("system prompt", lambda s, t: s.system())


def tool_definitions(*, shuffled: bool = False) -> Segment:
    """The tools in a fixed order, or reshuffled every turn (a tool list built from an unordered map)."""
    check_bool("shuffled", shuffled)

    def build(s: AgentSession, t: int) -> list[int]:
        tools = s.tools()
        if shuffled:
            s.random.shuffle(tools)
        return [tok for tool in tools for tok in tool]

    return Segment("tools", build)


def timestamp() -> Segment:
    return Segment("timestamp", lambda s, t: s.timestamp(t))


def history() -> Segment:
    return Segment("history", lambda s, t: s.history)


def new_message() -> Segment:
    return Segment("new message", lambda s, t: s.message(t))


@dataclass(frozen=True)
class SegmentSpan:
    name: str
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class LayoutTurn:
    """One turn: prompt size, cached tokens, where the segments sit, and where it first changed.

    ``first_change`` is the first position where the prompt differs from the
    previous turn's (None on turn 0, or if it only grew at the end, then it is
    that prompt's length); ``changed_segment`` names the segment there.
    ``first_miss_segment`` names the segment of the first token not served from
    cache (None if all were).
    """

    turn: int
    prompt_tokens: int
    cached_tokens: int
    segments: tuple[SegmentSpan, ...]
    first_change: int | None
    changed_segment: str | None
    first_miss_segment: str | None

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class LayoutRun:
    name: str
    turns: tuple[LayoutTurn, ...]
    block_size: int
    scheme: str

    @property
    def total_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    @property
    def cached_tokens(self) -> int:
        return sum(t.cached_tokens for t in self.turns)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.total_tokens if self.total_tokens else 0.0

    def line(self) -> str:
        """The lesson's result line for this run."""
        return (
            f"{self.name:<22s} prompt tokens {self.total_tokens:6d}, cached {self.cached_tokens:6d}, "
            f"hit rate {100.0 * self.hit_rate:5.1f}%"
        )


def _segment_at(spans: Sequence[SegmentSpan], pos: int) -> str | None:
    for s in spans:
        if s.start <= pos < s.end:
            return s.name
    return None


def chained_hashes(tokens: Sequence[int], block_size: int, scheme: str = "lesson") -> list[object]:
    """One chained hash per full block of ``tokens``, under ``scheme`` (see the module docstring).

    Token ids are 0..MAX_TOKEN_ID (a Java int too), at most ``LIMITS.tokens``; blocks at most ``LIMITS.block_size``.
    """
    scheme = check_choice("scheme", scheme, SCHEMES)
    toks = read_tokens("tokens", tokens, allow_empty=True)
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    if scheme != "java":
        return list(hashing.block_hashes(toks, block_size, scheme=scheme))
    out: list[object] = []
    h = 17
    for start in range(0, len(toks) - block_size + 1, block_size):
        h = (h * 1_000_003 + java_list_hash(toks[start : start + block_size])) % _LONG
        out.append(h)
    return out


def run_layout(
    segments: Sequence[Segment],
    *,
    name: str = "custom",
    turns: int = 10,
    block_size: int = 16,
    scheme: str = "lesson",
    session: AgentSession | None = None,
) -> LayoutRun:
    """Run ``turns`` turns of an agent session with this layout and count cached tokens per turn."""
    if isinstance(segments, Segment):
        raise InvalidArgumentError(
            "segments must be a non-empty list of Segment, not one Segment: use [segment]"
        )
    segments = check_items("segments", segments, what="a non-empty list of Segment")
    if not segments:
        raise InvalidArgumentError("segments must be a non-empty list of Segment, got an empty one")
    for i, s in enumerate(segments):
        if not isinstance(s, Segment):
            raise InvalidArgumentError(f"segments[{i}] must be a Segment, got {type(s).__name__}")
    name = check_text("name", name)
    turns = check_size("turns", turns, "turns", minimum=1)
    block_size = check_size("block_size", block_size, "block_size", minimum=1)
    scheme = check_choice("scheme", scheme, SCHEMES)
    if session is None:
        session = AgentSession()
    elif not isinstance(session, AgentSession):
        raise InvalidArgumentError("session must be an AgentSession")
    backup = copy.deepcopy(session.__dict__)
    try:
        return _run(segments, name, turns, block_size, scheme, session)
    except BaseException:
        session.__dict__.update(backup)  # a failed run leaves the session as it was
        raise


def _run(
    segments: Sequence[Segment], name: str, turns: int, block_size: int, scheme: str, session: AgentSession
) -> LayoutRun:
    seen: set[object] = set()
    out: list[LayoutTurn] = []
    previous: list[int] | None = None
    total = 0
    for turn in range(turns):
        prompt: list[int] = []
        spans: list[SegmentSpan] = []
        for seg in segments:
            built = call_user(f"segment {seg.name!r}'s build (turn {turn})", seg.build, session, turn)
            toks = read_tokens(f"segment {seg.name!r} (turn {turn}) tokens", built, allow_empty=True)
            spans.append(SegmentSpan(seg.name, len(prompt), len(toks)))
            prompt += toks
            if len(prompt) > LIMITS.tokens:
                raise InvalidArgumentError(
                    f"turn {turn}'s prompt is longer than LIMITS.tokens ({LIMITS.tokens:,}) at segment {seg.name!r}"
                )
        total += len(prompt)
        if total > LIMITS.total_tokens:
            raise InvalidArgumentError(
                f"the layout's prompts add up to more than LIMITS.total_tokens ({LIMITS.total_tokens:,}) by turn {turn}"
            )
        cached = 0
        prefix = True
        for h in chained_hashes(prompt, block_size, scheme):
            if prefix and h in seen:
                cached += block_size
            else:
                prefix = False
            seen.add(h)
        change = None
        if previous is not None:
            change = 0
            while change < min(len(previous), len(prompt)) and previous[change] == prompt[change]:
                change += 1
        out.append(
            LayoutTurn(
                turn=turn,
                prompt_tokens=len(prompt),
                cached_tokens=cached,
                segments=tuple(spans),
                first_change=change,
                changed_segment=None if change is None else _segment_at(spans, change),
                first_miss_segment=_segment_at(spans, cached),
            )
        )
        previous = prompt
        session.end_turn(turn)
    return LayoutRun(name, tuple(out), block_size, scheme)
