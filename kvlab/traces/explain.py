"""Why a request got the cache hit it got, and, when a server reported something else, what explains it.

Each explanation names the course's ideas: the earlier request the prompt shares tokens with, where
the two first differ (a volatile segment there breaks the hash chain or the slot's common prefix),
block rounding and the last-token rule (vLLM 0.33 reuses whole blocks, at most ``prompt - 1``
tokens), eviction under a given pool size, another tenant's ``cache_salt``, and for llama-server
which slot was chosen and why. A mismatch is explained by testing each alternative against the
reported number, not by guessing: only the alternatives that reproduce it are named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.core.snapshots import RequestRecord
from kvlab.server.slots import common_prefix
from kvlab.traces.read import Exchange

LOOK_BACK = 256  # earlier requests searched for the longest shared prefix (bounds the work per row)
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # block sizes a server may have used instead


@dataclass(frozen=True)
class Seen:
    """An earlier request as the cache kept it: its index, salt and tokens (prompt + sampled but the last)."""

    index: int
    salt: str | None
    tokens: list[int]


@dataclass(frozen=True)
class Overlap:
    index: int
    shared: int  # tokens in common from the start
    same_later: (
        int  # tokens after the first difference that equal the earlier request's, position by position
    )
    salt: str | None


def best_overlap(prompt: Sequence[int], seen: Sequence[Seen], *, salt: object = ..., skip_salt: bool = False):
    """The earlier request sharing the longest prefix with ``prompt`` (same salt unless ``skip_salt``)."""
    best: Overlap | None = None
    for s in seen[-LOOK_BACK:]:
        if not skip_salt and s.salt != salt:
            continue
        n = common_prefix(s.tokens, prompt)
        if best is None or n > best.shared:
            later = sum(1 for a, b in zip(s.tokens[n + 1 :], prompt[n + 1 :], strict=False) if a == b)
            best = Overlap(s.index, n, later, s.salt)
    return best


def _volatile(prompt: Sequence[int], ov: Overlap) -> str:
    rest = len(prompt) - ov.shared - 1
    if ov.shared >= len(prompt) or rest <= 0 or ov.same_later < max(8, rest // 2):
        return ""
    return (
        f" A volatile segment at token {ov.shared} breaks the chain: {ov.same_later} of the {rest} tokens "
        f"after it equal request {ov.index}'s, position by position, but everything after a change is "
        "recomputed. Move what changes to the end of the prompt."
    )


def explain_blocks(
    ex: Exchange, predicted: dict[str, Any], seen: Sequence[Seen], block_size: int, no_evict: dict | None
) -> str:
    """How vLLM's block hashing arrives at the predicted hit for ``ex``."""
    if "error" in predicted:
        return "the pool cannot hold this request's blocks at once: vLLM would queue it until blocks free up"
    prompt, bs = ex.prompt, block_size
    cached = predicted["cached_tokens"]
    ov = best_overlap(prompt, seen, salt=ex.cache_salt)
    if ov is None or ov.shared == 0:
        text = "Cold: no earlier request with the same salt shares its first token."
        other = best_overlap(prompt, seen, skip_salt=True)
        if other is not None and other.shared >= bs and other.salt != ex.cache_salt:
            text += (
                f" Request {other.index} shares {other.shared} tokens, but under another cache_salt "
                f"({other.salt!r} vs {ex.cache_salt!r}): salts keep tenants apart."
            )
        return text
    text = f"Shares {ov.shared} tokens with what request {ov.index} left in the cache (its prompt and reply)"
    text += "." if ov.shared >= len(prompt) else f", then differs at token {ov.shared}."
    full = min(ov.shared, len(prompt) - 1) // bs * bs
    if ov.shared >= len(prompt) and len(prompt) % bs == 0:
        text += (
            f" The whole prompt is cached, but vLLM computes at least its last token (the last-token rule), "
            f"so its last block is recomputed: {full} tokens reused."
        )
    elif ov.shared % bs:
        text += f" In whole blocks of {bs}: {full} tokens (block rounding)."
    if no_evict is not None and "cached_tokens" in no_evict and no_evict["cached_tokens"] > cached:
        text += (
            f" With a pool that never evicts, {no_evict['cached_tokens']} would be reused: the pool "
            f"evicted {no_evict['cached_tokens'] - cached} of those tokens' blocks (LRU) before this request."
        )
    return text + _volatile(prompt, ov)


def mismatch_blocks(
    ex: Exchange,
    predicted: dict[str, Any],
    reported: dict[str, Any] | None,
    seen: Sequence[Seen],
    block_size: int,
    no_evict: dict | None,
) -> str:
    """The alternatives that reproduce what the server reported, tested one by one."""
    if reported is None or reported.get("cached_tokens") is None or "cached_tokens" not in predicted:
        return ""
    got, want = reported["cached_tokens"], predicted["cached_tokens"]
    prompt = ex.prompt
    causes = []
    ov = best_overlap(prompt, seen, salt=ex.cache_salt)
    shared = ov.shared if ov else 0
    if reported.get("prompt_tokens") is not None and reported["prompt_tokens"] != len(prompt):
        causes.append(
            f"the server counted {reported['prompt_tokens']} prompt tokens where kvlab has {len(prompt)} "
            f"(tokenized by {ex.tokenized_by}): record the server's token ids"
        )
    if got == min(shared, len(prompt) - 1) and got % block_size:
        causes.append(
            "the server reused token by token, not in whole blocks: is it llama-server (--server llama)?"
        )
    if no_evict is not None and no_evict.get("cached_tokens") == got:
        causes.append(
            "with no eviction kvlab predicts exactly this: the server's pool is larger than --num-blocks"
        )
    other = best_overlap(prompt, seen, skip_salt=True)
    if (
        other is not None
        and got > want
        and min(other.shared, len(prompt) - 1) // block_size * block_size == got
    ):
        causes.append(
            f"request {other.index} under another salt explains it: the server did not keep salts apart"
        )
    for b in BLOCK_SIZES:
        if b != block_size and got and min(shared, len(prompt) - 1) // b * b == got:
            causes.append(f"a block size of {b} reproduces it (--block-size {b})")
            break
    if got < want and not causes:
        causes.append(
            "the server reused less than kvlab predicts: blocks evicted by traffic not in this trace or a "
            "smaller pool (give --num-blocks), prefix caching off, or requests that overlapped"
        )
    if got > want and not causes:
        causes.append(
            "the server reused more than kvlab predicts: requests not in this trace warmed its cache"
        )
    return f"Reported {got}, kvlab predicts {want}: " + "; ".join(causes) + "."


def explain_slot(
    ex: Exchange,
    record: RequestRecord,
    before: dict[int, tuple[int, ...]],
    followed: int | None,
    server_record: RequestRecord,
) -> str:
    """How llama-server's slot choice and longest common prefix give the predicted ``cache_n``."""
    if record.error is not None:
        return (
            f"refused ({record.error}): the prompt does not fit a slot's context; the server still chose "
            f"slot {record.slot_id} first and marks it used"
        )
    how = {"lcp": "prompt similarity", "lru": "least recently used", "id": "the request's id_slot"}
    text = f"Slot {record.slot_id}, chosen by {how.get(record.selected_by, record.selected_by)}"
    if record.similarity is not None:
        text += f" ({record.similarity:.2f} of the prompt in common)"
    held = before.get(record.slot_id, ())
    shared = common_prefix(held, ex.prompt)
    text += f": the slot held {len(held)} tokens, {shared} in common with the prompt."
    if record.ram_loaded:
        text += " A better entry came back from the RAM prompt cache first."
    if not ex.cache_prompt:
        text += " cache_prompt is false: nothing is reused."
    elif shared >= len(ex.prompt) and record.cache_n == len(ex.prompt) - 1:
        text += " The whole prompt was there; the server evaluates its last token again to get logits."
    if followed is not None:
        real = server_record
        text += (
            f" The server put it on slot {followed} instead (cache_n there: {real.cache_n}); kvlab follows "
            "the server from here, so later predictions start from the real slots. Check the slot count, "
            "--slot-prompt-similarity and the RAM cache settings."
        )
    return text
