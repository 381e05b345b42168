"""A timing side channel through a shared prefix cache, and the per-tenant salt that closes it (lesson 002).

A victim tenant sends a prompt whose start holds a secret (here a patient's
name in a long, otherwise public form). A prober who knows the form sends it
again with each candidate name and watches how the server answers:

* **without a salt** the cache is shared by all tenants, so the right guess
  reuses the victim's cached blocks: its ``cache_n`` jumps to nearly the whole
  prompt and its time to first token drops, while a wrong guess reuses only the
  form's opening blocks before the name;
* **with a per-tenant salt** (vLLM's ``cache_salt``) the prober's hashes never
  match the victim's blocks: every guess reuses the same amount (the prober's
  own earlier requests) and nothing tells the right one apart.

The prober classifies from ``cache_n``, the counter an OpenAI-compatible server
reports as ``usage.prompt_tokens_details.cached_tokens``: it first sends two
requests with names it knows are wrong (the first warms its own copy of the
form's opening, the second measures what any wrong guess gets) and calls a
guess a hit when it reuses more than that baseline. Times are measured for
real and returned for plotting; they are not needed for the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.chat_format import REPLY_WORDS, Message, render
from kvlab.core.workloads import JavaRandom
from kvlab.engine.engine import Engine
from kvlab.errors import InvalidArgumentError, cdiv, check_int

DEFAULT_CANDIDATES = ("alice", "bruno", "chen", "dana", "emeka", "farah")
DEFAULT_SECRET = "dana"
DECOYS = ("nobody", "noone")


@dataclass(frozen=True)
class ProbeRow:
    """One request of the prober: ``kind`` is "control" (a known-wrong name) or "guess"."""

    kind: str
    name: str
    is_secret: bool
    prompt_tokens: int
    cache_n: int
    prompt_n: int
    ttft_ms: float
    classified_hit: bool


@dataclass(frozen=True)
class ProbeRun:
    """All of one scenario's requests; ``salted`` says whether each tenant had its own cache salt."""

    salted: bool
    secret: str
    victim_cache_n: int
    baseline_cache_n: int
    rows: tuple[ProbeRow, ...]

    @property
    def guesses(self) -> tuple[ProbeRow, ...]:
        return tuple(r for r in self.rows if r.kind == "guess")

    @property
    def found(self) -> tuple[str, ...]:
        """Names the prober classified as the secret (the right one alone when the channel is open)."""
        return tuple(r.name for r in self.guesses if r.classified_hit)

    @property
    def leaked(self) -> bool:
        return self.found == (self.secret,)

    def ttft_ratio(self) -> float | None:
        """Median wrong-guess time over the right guess's time (about 1 when there is no signal)."""
        wrong = sorted(r.ttft_ms for r in self.guesses if not r.is_secret)
        right = [r.ttft_ms for r in self.guesses if r.is_secret]
        if not wrong or not right:
            return None
        return wrong[len(wrong) // 2] / right[0]

    def as_rows(self) -> list[dict[str, object]]:
        """Plain dicts (one per request) for a table or a plot."""
        return [{"salted": self.salted, **r.__dict__} for r in self.rows]


def form_text(name: str, form_tokens: int) -> str:
    """The victim's system prompt: the name near the start, then ``form_tokens`` public tokens."""
    rnd = JavaRandom(form_tokens)
    body = "".join(" " + REPLY_WORDS[rnd.next_int(len(REPLY_WORDS))] for _ in range(form_tokens))
    return f"Patient record. Name: {name}. Intake form follows:{body}"


def tenant_probe(
    *,
    salted: bool,
    secret: str = DEFAULT_SECRET,
    candidates: Sequence[str] = DEFAULT_CANDIDATES,
    form_tokens: int = 512,
    block_size: int = 16,
    engine: Engine | None = None,
) -> ProbeRun:
    """Run the victim's request, then the prober's controls and guesses, on one ``"blocks"`` engine.

    ``salted`` gives each tenant its own ``cache_salt`` ("victim" / "prober").
    A fresh engine is built unless one is passed (it must use ``cache="blocks"``).
    """
    if not isinstance(salted, bool):
        raise InvalidArgumentError("salted must be True or False")
    names = _check_names(secret, candidates)
    check_int("form_tokens", form_tokens, minimum=1)
    check_int("block_size", block_size, minimum=1)
    if engine is None:
        # room for every request's blocks at once, so nothing the victim cached is evicted before the probe
        max_len = form_tokens + 64
        num_blocks = (len(names) + len(DECOYS) + 1) * cdiv(max_len, block_size)
        engine = Engine(cache="blocks", block_size=block_size, max_model_len=max_len, num_blocks=num_blocks)
    elif not isinstance(engine, Engine) or engine.cache_mode != "blocks":
        raise InvalidArgumentError("engine must be a kvlab Engine built with cache='blocks'")

    def prompt(name: str) -> list[int]:
        msgs = [Message("system", form_text(name, form_tokens)), Message("user", "Summarize the record.")]
        return list(render(msgs, engine.tokenizer).tokens)

    victim_salt, prober_salt = ("victim", "prober") if salted else (None, None)
    victim = engine.generate(prompt(secret), max_tokens=1, cache_salt=victim_salt)
    rows: list[ProbeRow] = []
    baseline = 0
    for decoy in DECOYS:  # the first warms the prober's own copy of the opening; the second measures it
        res = engine.generate(prompt(decoy), max_tokens=1, cache_salt=prober_salt)
        rows.append(
            ProbeRow(
                "control", decoy, False, res.prompt_tokens, res.cache_n, res.prompt_n, res.ttft_ms, False
            )
        )
        baseline = res.cache_n
    for name in names:
        res = engine.generate(prompt(name), max_tokens=1, cache_salt=prober_salt)
        rows.append(
            ProbeRow(
                "guess",
                name,
                name == secret,
                res.prompt_tokens,
                res.cache_n,
                res.prompt_n,
                res.ttft_ms,
                res.cache_n > baseline,
            )
        )
    return ProbeRun(salted, secret, victim.cache_n, baseline, tuple(rows))


def tenant_probe_demo(**kwargs: object) -> dict[str, ProbeRun]:
    """Both scenarios side by side: ``{"shared cache": ..., "per-tenant salt": ...}``."""
    return {
        "shared cache": tenant_probe(salted=False, **kwargs),  # type: ignore[arg-type]
        "per-tenant salt": tenant_probe(salted=True, **kwargs),  # type: ignore[arg-type]
    }


def _check_names(secret: object, candidates: object) -> list[str]:
    if not isinstance(secret, str) or not secret.isalpha():
        raise InvalidArgumentError(f"secret must be one word of letters, got {secret!r}")
    if isinstance(candidates, str) or not isinstance(candidates, Sequence) or not candidates:
        raise InvalidArgumentError("candidates must be a non-empty list of names")
    names = list(candidates)
    for n in names:
        if not isinstance(n, str) or not n.isalpha():
            raise InvalidArgumentError(f"every candidate must be one word of letters, got {n!r}")
    if len(set(names)) != len(names):
        raise InvalidArgumentError("candidates must not repeat a name")
    if set(DECOYS) & {secret, *names}:
        raise InvalidArgumentError(
            f"{' and '.join(DECOYS)} are the prober's known-wrong control names; pick others"
        )
    return names
