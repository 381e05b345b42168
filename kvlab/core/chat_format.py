"""A deterministic tokenizer and a ChatML-style chat template (lesson example 10).

A prompt cache compares token ids, not text, so replaying a conversation turn by
turn needs two things that behave like a real server's front end:

* a tokenizer that gives the same ids for the same text in every process, and
  that gives back the same ids when a reply it produced is sent again inside the
  history (otherwise the match with the cached prompt would stop in the reply);
* a chat template that renders messages the way Qwen-style ChatML models do:
  ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, and the generation
  prompt ``<|im_start|>assistant\\n`` at the end.

``Tokenizer`` splits text into pieces the way byte-pair tokenizers pre-split it
(special tokens, single digits as Qwen2 does, words with their leading space,
punctuation, newlines, other whitespace) and numbers each piece by a hash of its
text, so ids are stable without a vocabulary file. It is not a BPE: every piece
is one token, which keeps prompts short and easy to read aloud.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

from kvlab.core.workloads import JavaRandom, java_list_hash
from kvlab.errors import (
    LIMITS,
    MAX_TOKEN_ID,
    InvalidArgumentError,
    KvlabError,
    brief,
    check_bool,
    check_choice,
    check_int,
    check_size,
    check_tokens,
)

SPECIAL_TOKENS: dict[str, int] = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
FIRST_ORDINARY_ID = 16
_ID_SPACE = MAX_TOKEN_ID + 1 - FIRST_ORDINARY_ID  # ids stay 4-byte signed ints, as the lesson's hashes need

# order matters: specials, then single digits (" 1" splits into " " and "1"), words with an
# optional leading space, one punctuation mark with an optional leading space, a newline,
# any other run of whitespace. Every character matches one alternative, so nothing is lost.
_PIECE = re.compile("|".join(re.escape(s) for s in SPECIAL_TOKENS) + r"|\d| ?[^\W\d]+| ?[^\s\w]|\n|[^\S\n]+")

ROLES = ("system", "user", "assistant", "tool")

# words a simulated model answers with; each is one token with its leading space
REPLY_WORDS = (
    "the",
    "file",
    "reads",
    "config",
    "then",
    "calls",
    "a",
    "helper",
    "to",
    "parse",
    "each",
    "line",
    "and",
    "returns",
    "list",
    "of",
    "tokens",
    "so",
    "we",
    "should",
    "open",
    "main",
    "check",
    "tests",
    "next",
    "run",
    "build",
    "fix",
    "import",
    "error",
    "in",
    "module",
)


class Tokenizer:
    """Text <-> token ids; ids depend only on the text of a piece, never on call order."""

    def __init__(self) -> None:
        self._pieces: dict[int, str] = {i: s for s, i in SPECIAL_TOKENS.items()}

    @staticmethod
    def piece_id(piece: str) -> int:
        """The id of one piece: a special token's fixed id, or a hash of the piece's UTF-8 bytes."""
        piece = _check_text("piece", piece)
        if piece in SPECIAL_TOKENS:
            return SPECIAL_TOKENS[piece]
        digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
        return FIRST_ORDINARY_ID + int.from_bytes(digest, "big") % _ID_SPACE

    @staticmethod
    def split(text: str) -> list[str]:
        """The pieces of ``text``, in order; joining them gives ``text`` back."""
        return _PIECE.findall(_check_text("text", text))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; remembers each piece so ``decode`` can give the text back.

        At most ``LIMITS.tokens`` pieces: longer text is refused before anything is remembered.
        """
        pieces = self.split(text)
        if len(pieces) > LIMITS.tokens:
            raise InvalidArgumentError(
                f"text has {len(pieces):,} tokens, more than {LIMITS.tokens:,} (kvlab's limit LIMITS.tokens); "
                "for a deliberately larger run use kvlab.errors.raised_limits(tokens=...)"
            )
        ids = [self.piece_id(p) for p in pieces]
        for i, p in zip(ids, pieces, strict=True):
            known = self._pieces.get(i)
            if known is not None and known != p:  # pragma: no cover - a 63-bit hash collision
                raise KvlabError(f"pieces {known!r} and {p!r} hash to the same id {i}; rename one")
        self._pieces.update(zip(ids, pieces, strict=True))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; each id must have been produced by this tokenizer."""
        toks = check_tokens("ids", ids, allow_empty=True)
        unknown = [t for t in toks if t not in self._pieces]
        if unknown:
            raise InvalidArgumentError(
                f"token id {unknown[0]} was never produced by this tokenizer: encode its text first"
            )
        return "".join(self._pieces[t] for t in toks)

    def piece(self, token_id: int) -> str:
        """The text of one token id (see ``decode``)."""
        return self.decode([check_int("token_id", token_id)])


def _check_text(name: str, text: object) -> str:
    """A plain ``str`` that UTF-8 can encode (token ids hash its bytes); a str subclass becomes its text."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"{name} must be a string, got {brief(text)} ({type(text).__name__})")
    text = text if type(text) is str else str.__str__(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{name} is not valid text: UTF-8 cannot encode character {exc.start} (a lone surrogate); "
            "decode your input properly first"
        ) from None
    return text


@dataclass(frozen=True)
class Message:
    """One chat message: ``role`` is one of ``ROLES``, ``content`` its text."""

    role: str
    content: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", check_choice("role", self.role, ROLES))
        object.__setattr__(self, "content", _check_text("content", self.content))


@dataclass(frozen=True)
class MessageSpan:
    """Where one rendered message sits in the prompt: ``start`` is its ``<|im_start|>`` token."""

    role: str
    start: int
    length: int


@dataclass(frozen=True)
class RenderedPrompt:
    tokens: tuple[int, ...]
    spans: tuple[MessageSpan, ...]

    @property
    def user_starts(self) -> tuple[int, ...]:
        """Token positions where user messages start (llama-server checkpoints there, example 12)."""
        return tuple(s.start for s in self.spans if s.role == "user")

    def __len__(self) -> int:
        return len(self.tokens)


def as_messages(messages: Iterable[Message | Mapping[str, str]]) -> list[Message]:
    """Accept ``Message`` objects or ``{"role": ..., "content": ...}`` dicts; validate roles and text."""
    if isinstance(messages, (str, bytes, Mapping)) or not hasattr(messages, "__iter__"):
        raise InvalidArgumentError("messages must be a list of messages (dicts with 'role' and 'content')")
    bound = LIMITS.count
    try:
        items = list(islice(messages, bound + 1))  # type: ignore[call-overload]
    except Exception:
        raise InvalidArgumentError(
            f"messages must be a list of messages, got {brief(messages)} ({type(messages).__name__})"
        ) from None
    if len(items) > bound:
        raise InvalidArgumentError(
            f"more than {bound:,} messages (kvlab's limit LIMITS.count); "
            "for a deliberately larger run use kvlab.errors.raised_limits(count=...)"
        )
    out: list[Message] = []
    for i, m in enumerate(items):
        if isinstance(m, Mapping):
            role, content = _role_and_content(i, m)
        elif isinstance(m, Message):
            role, content = m.role, m.content
        else:
            raise InvalidArgumentError(f"messages[{i}] must be a Message or a dict, got {type(m).__name__}")
        out.append(
            Message(
                check_choice(f"messages[{i}] role", role, ROLES, what="role"),
                _check_text(f"messages[{i}] content", content),
            )
        )
    return out


def _role_and_content(i: int, m: Mapping[str, str]) -> tuple[object, object]:
    """A message dict's two fields, read at most three keys deep: a mapping's own iteration or lookup may raise or never end."""
    try:
        keys = set(islice(iter(m), 3))
        if keys == {"role", "content"}:
            return m["role"], m["content"]
    except Exception:  # a mapping subclass whose iteration or lookup raises
        raise InvalidArgumentError(
            f"messages[{i}] could not be read as a dict ({type(m).__name__}); pass a plain dict "
            "with 'role' and 'content'"
        ) from None
    raise InvalidArgumentError(f"messages[{i}] must have exactly the keys 'role' and 'content'")


def render_text(
    messages: Iterable[Message | Mapping[str, str]], *, add_generation_prompt: bool = True
) -> str:
    """The ChatML text of ``messages``, as the template would produce it."""
    check_bool("add_generation_prompt", add_generation_prompt)
    msgs = as_messages(messages)
    text = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in msgs)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def render(
    messages: Iterable[Message | Mapping[str, str]],
    tokenizer: Tokenizer,
    *,
    add_generation_prompt: bool = True,
) -> RenderedPrompt:
    """Render and tokenize ``messages``; each message's span is recorded for checkpoint placement."""
    _check_tokenizer(tokenizer)
    check_bool("add_generation_prompt", add_generation_prompt)
    msgs = as_messages(messages)
    if not msgs and not add_generation_prompt:
        raise InvalidArgumentError("nothing to render: give at least one message")
    tokens: list[int] = []
    spans: list[MessageSpan] = []
    for m in msgs:
        ids = tokenizer.encode(render_text([m], add_generation_prompt=False))
        spans.append(MessageSpan(m.role, len(tokens), len(ids)))
        tokens += ids
        if len(tokens) > LIMITS.tokens:
            raise InvalidArgumentError(
                f"the rendered prompt has more than {LIMITS.tokens:,} tokens (kvlab's limit LIMITS.tokens); "
                "send fewer or shorter messages"
            )
    if add_generation_prompt:
        tokens += tokenizer.encode("<|im_start|>assistant\n")
    return RenderedPrompt(tuple(tokens), tuple(spans))


def reply_tokens(tokenizer: Tokenizer, prompt: Sequence[int], n: int) -> list[int]:
    """A simulated model's ``n`` sampled tokens for ``prompt``: words picked by a seeded generator.

    Greedy decoding is deterministic, so the same prompt always gets the same
    reply; here the seed is the prompt's list hash. Each word is one token with
    its leading space, so the reply text tokenizes back to the same ids when it
    is sent again inside the history.
    """
    _check_tokenizer(tokenizer)
    toks = check_tokens("prompt", prompt)
    n = check_size("n", n, "tokens")
    rnd = JavaRandom(java_list_hash(toks))
    return [tokenizer.encode(" " + REPLY_WORDS[rnd.next_int(len(REPLY_WORDS))])[0] for _ in range(n)]


def _check_tokenizer(tokenizer: object) -> None:
    if not isinstance(tokenizer, Tokenizer):
        raise InvalidArgumentError(f"tokenizer must be a kvlab Tokenizer, got {type(tokenizer).__name__}")
