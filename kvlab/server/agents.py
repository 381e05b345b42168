"""Agent history policies and what they cost a prefix cache (lesson example 13).

An agent sends its whole context every turn: a fixed prefix (system prompt and
tool definitions) and the history of tool calls and results. A *history policy*
decides which results the prompt keeps. A cache that holds the previous prompt,
like a llama-server slot, reuses its longest common prefix with the new one; so
a policy that only appends costs each turn its new tokens, and one that drops
old results from the front of the history rewrites everything after the prefix,
every turn.

A policy is any callable ``policy(prefix, results) -> prompt tokens`` (see
``HistoryPolicy``); ``AppendOnly``, ``KeepLast`` and ``SummarizeOnce`` are the
lesson's three. ``run_agent`` plays the turns and records, per turn, the prompt
size, the cached and the processed tokens.

By default the cache is the lesson's: it keeps the previous prompt and reuses
the common prefix. Pass ``server=SlotServer(...)`` to send every prompt through
kvlab's llama-server slot model instead (``max_tokens=0``), which also
reprocesses the last token when a prompt is entirely cached; the lesson's
figures are the same either way, since no prompt repeats the previous one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvlab.errors import (
    LIMITS,
    MAX_TOKEN_ID,
    InvalidArgumentError,
    check_int,
    check_items,
    check_size,
    check_text,
)
from kvlab.server.inputs import call_user, read_tokens
from kvlab.server.slots import SlotServer, _lcp


@runtime_checkable
class HistoryPolicy(Protocol):
    """Builds a turn's prompt from the fixed prefix and every tool result so far (oldest first)."""

    def __call__(self, prefix: Sequence[int], results: Sequence[Sequence[int]]) -> list[int]: ...


def _policy_args(prefix: object, results: object) -> tuple[list[int], list[list[int]]]:
    """A policy's arguments checked: token ids, at most ``LIMITS.turns`` results."""
    pre = read_tokens("prefix", prefix, allow_empty=True)
    rows = check_items("results", results, "turns", what="a list of token lists")
    return pre, [read_tokens(f"results[{i}]", r, allow_empty=True) for i, r in enumerate(rows)]


@dataclass(frozen=True)
class AppendOnly:
    """Keep every result: the prompt only grows at its end."""

    name: str = "append-only"

    def __call__(self, prefix: Sequence[int], results: Sequence[Sequence[int]]) -> list[int]:
        prefix, results = _policy_args(prefix, results)
        return [*prefix, *(t for r in results for t in r)]


@dataclass(frozen=True)
class KeepLast:
    """Keep only the last ``n`` results, dropping older ones from the front of the history."""

    n: int = 5

    def __post_init__(self) -> None:
        """``n`` is 1..``LIMITS.turns``."""
        object.__setattr__(self, "n", check_size("n", self.n, "turns", minimum=1))

    @property
    def name(self) -> str:
        return f"keep only the last {self.n} tool results"

    def __call__(self, prefix: Sequence[int], results: Sequence[Sequence[int]]) -> list[int]:
        prefix, results = _policy_args(prefix, results)
        return [*prefix, *(t for r in results[-self.n :] for t in r)]


@dataclass(frozen=True)
class SummarizeOnce:
    """Append-only, except that once there are more than ``after`` results a fixed summary replaces the first ``after``.

    The summary is the same tokens every later turn, so the history is append-only again after the one rewrite.
    """

    after: int = 12
    summary_tokens: int = 300
    summary_first_id: int = 900_000

    def __post_init__(self) -> None:
        """``after`` is 1..``LIMITS.turns``, the summary at most ``LIMITS.tokens`` ids, all within 0..MAX_TOKEN_ID."""
        object.__setattr__(self, "after", check_size("after", self.after, "turns", minimum=1))
        object.__setattr__(
            self, "summary_tokens", check_size("summary_tokens", self.summary_tokens, "tokens", minimum=0)
        )
        object.__setattr__(
            self,
            "summary_first_id",
            check_int(
                "summary_first_id",
                self.summary_first_id,
                minimum=0,
                maximum=MAX_TOKEN_ID + 1 - max(1, self.summary_tokens),
            ),
        )

    @property
    def name(self) -> str:
        return f"append-only, one summary at {self.after}"

    def __call__(self, prefix: Sequence[int], results: Sequence[Sequence[int]]) -> list[int]:
        prefix, results = _policy_args(prefix, results)
        if len(results) <= self.after:
            return AppendOnly()(prefix, results)
        summary = range(self.summary_first_id, self.summary_first_id + self.summary_tokens)
        return [*prefix, *summary, *(t for r in results[self.after :] for t in r)]


@dataclass(frozen=True)
class AgentTurn:
    turn: int  # 1-based
    prompt_tokens: int
    cached_tokens: int
    processed_tokens: int
    common_prefix: int  # LCP with the previous prompt


@dataclass(frozen=True)
class AgentRun:
    name: str
    turns: tuple[AgentTurn, ...]

    @property
    def total_processed(self) -> int:
        return sum(t.processed_tokens for t in self.turns)

    @property
    def worst_turn(self) -> int:
        return max(t.processed_tokens for t in self.turns)

    @property
    def final_prompt(self) -> int:
        return self.turns[-1].prompt_tokens

    def line(self) -> str:
        """The lesson's result line for this run."""
        return (
            f"{self.name:<34s} processed {self.total_processed:6d} tokens, worst turn {self.worst_turn:5d}, "
            f"final prompt {self.final_prompt:5d}"
        )


def run_agent(
    policy: HistoryPolicy,
    *,
    turns: int = 20,
    prefix_tokens: int = 2000,
    result_tokens: int = 400,
    first_result_id: int = 100_000,
    name: str | None = None,
    server: SlotServer | None = None,
) -> AgentRun:
    """Play ``turns`` agent turns; each adds one tool call and result of ``result_tokens`` tokens."""
    if not callable(policy):
        raise InvalidArgumentError("policy must be a callable (prefix, results) -> prompt tokens")
    # bounds: LIMITS.turns turns, LIMITS.tokens per prefix, result and prompt, LIMITS.total_tokens in all
    turns = check_size("turns", turns, "turns", minimum=1)
    prefix_tokens = check_size("prefix_tokens", prefix_tokens, "tokens", minimum=0)
    result_tokens = check_size("result_tokens", result_tokens, "tokens", minimum=1)
    first_result_id = check_int(
        "first_result_id",
        first_result_id,
        minimum=prefix_tokens,
        maximum=MAX_TOKEN_ID + 1 - turns * result_tokens,
    )
    if turns * result_tokens > LIMITS.total_tokens:
        raise InvalidArgumentError(
            f"{turns} turns of {result_tokens} tokens are more than LIMITS.total_tokens ({LIMITS.total_tokens:,})"
        )
    if name is None:
        name = call_user(
            "reading the policy's name",
            lambda: getattr(policy, "name", None) or getattr(policy, "__name__", "custom policy"),
        )
    name = check_text("name", name)
    if server is not None and not isinstance(server, SlotServer):
        raise InvalidArgumentError("server must be a kvlab.server.slots.SlotServer or None")
    prefix = tuple(range(prefix_tokens))
    results: list[tuple[int, ...]] = []
    prompts: list[list[int]] = []
    next_id = first_result_id
    total = 0
    for turn in range(turns):  # build every prompt first, so a bad policy changes nothing
        results.append(tuple(range(next_id, next_id + result_tokens)))
        next_id += result_tokens
        built = call_user(f"the policy on turn {turn + 1}", policy, prefix, tuple(results))
        prompt = read_tokens(f"the policy's prompt on turn {turn + 1}", built)
        total += len(prompt)
        if total > LIMITS.total_tokens:
            raise InvalidArgumentError(
                f"the policy's prompts add up to more than LIMITS.total_tokens ({LIMITS.total_tokens:,}) by turn {turn + 1}"
            )
        if server is not None and len(prompt) >= server.n_ctx:
            raise InvalidArgumentError(
                f"turn {turn + 1}'s prompt ({len(prompt)} tokens) does not fit n_ctx {server.n_ctx}"
            )
        prompts.append(prompt)
    if server is None:
        return AgentRun(name, _play(prompts, None))
    with server.all_or_nothing():  # a turn the server refuses leaves it as it was before the run
        return AgentRun(name, _play(prompts, server))


def _play(prompts: list[list[int]], server: SlotServer | None) -> tuple[AgentTurn, ...]:
    cached: list[int] = []
    out: list[AgentTurn] = []
    for turn, prompt in enumerate(prompts):
        lcp = _lcp(cached, prompt)
        hit = lcp if server is None else server.complete(prompt, max_tokens=0).cache_n
        out.append(AgentTurn(turn + 1, len(prompt), hit, len(prompt) - hit, lcp))
        cached = prompt
    return tuple(out)
