"""Checks the block-pool scenario modules share: an op's shape and fields, and which requests are live.

Each check raises ``ScenarioError`` with the op's index and a message that says
what to write instead, before anything of the op is applied.
"""

from __future__ import annotations

from typing import Any

from kvlab.errors import MAX_TOKEN_ID, ScenarioError, brief

OpFields = dict[str, tuple[set[str], set[str]]]  # op -> (required fields, optional fields)


def check_op(op: Any, index: int, op_fields: OpFields) -> None:
    """Reject a malformed op: not an object, an unknown op, a missing or extra field, a bad value."""
    if not isinstance(op, dict):
        raise ScenarioError(f'each op must be an object like {{"op": "alloc", ...}}, got {brief(op)}', index)
    name = op.get("op")
    if not isinstance(name, str) or name not in op_fields:
        raise ScenarioError(f"unknown op {brief(name)}: use one of {', '.join(op_fields)}", index)
    required, optional = op_fields[name]
    missing = sorted(required - set(op))
    if missing:
        raise ScenarioError(f"{name} needs field(s) {missing}", index)
    extra = sorted(set(op) - required - optional - {"op"})
    if extra:
        allowed = ", ".join(sorted(required | optional))
        raise ScenarioError(f"{name} does not take field(s) {extra}; it takes {allowed}", index)
    for key in ("req", "child"):
        if key in op and (not isinstance(op[key], str) or not op[key]):
            raise ScenarioError(f"'{key}' must be a non-empty string, got {brief(op[key])}", index)
    if "tokens" in op:
        tokens = op["tokens"]
        if not isinstance(tokens, list):
            raise ScenarioError(f"'tokens' must be a list of integer token ids, got {brief(tokens)}", index)
        if not tokens:
            what = "a prompt" if name in ("alloc", "probe") else "an append"
            raise ScenarioError(f"'tokens' is empty: {what} needs at least one token", index)
        for i, t in enumerate(tokens):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_TOKEN_ID:
                raise ScenarioError(
                    f"tokens[{i}] = {brief(t)} is not a token id (an integer 0..{MAX_TOKEN_ID})", index
                )
    if "cache_salt" in op and op["cache_salt"] is not None:
        salt = op["cache_salt"]
        if not isinstance(salt, str) or not salt:
            raise ScenarioError(f"'cache_salt' must be a non-empty string, got {brief(salt)}", index)


class LiveRequests:
    """Which request ids hold blocks and which were freed, so a bad reference is named precisely."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.freed: set[str] = set()

    def check_new(self, request_id: str, index: int) -> None:
        if request_id in self.live:
            raise ScenarioError(
                f"request {request_id!r} is already allocated; free it first or use a new id", index
            )

    def check_live(self, op: str, request_id: str, index: int) -> None:
        if request_id not in self.live:
            if request_id in self.freed:
                what = {"free": "a double free", "append": "an append after free"}.get(
                    op, f"a {op} after free"
                )
                raise ScenarioError(f"request {request_id!r} was already freed ({what})", index)
            raise ScenarioError(f"unknown request {request_id!r}: allocate it first", index)

    def added(self, request_id: str) -> None:
        self.live.add(request_id)
        self.freed.discard(request_id)

    def removed(self, request_id: str) -> None:
        self.live.discard(request_id)
        self.freed.add(request_id)
