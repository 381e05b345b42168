"""Hostile input to the server models: refused with kvlab's error, and nothing changes (issue 11).

Every public function and constructor of kvlab.server gets hostile values (``tests/hostile.py``) in
each argument. A value may be accepted (``np.int64(3)`` is a fine slot id); if it is refused, the
refusal is a ``KvlabError`` and the model's state and history are as before. Values that can never
be valid (huge sizes, floats, wrong types) must be refused.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hostile import hostile_values, huge_ints, odd_floats, wrong_types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.core.chat_format import Tokenizer
from kvlab.errors import InvalidArgumentError, KvlabError, SlotBusyError, raised_limits
from kvlab.lessons import ex09, ex10, ex11, ex12, ex13
from kvlab.server import agents, conversation, layout, slot_files, slots, swa
from kvlab.server.slots import SlotServer

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


class Box:
    """A model for ``refuses``: ``state()`` is whatever the wrapped function says."""

    def __init__(self, state: Callable[[], Any] = lambda: None) -> None:
        self._state = state

    def state(self) -> Any:
        return self._state()


def _server() -> SlotServer:
    s = SlotServer(2, n_ctx=64)
    s.complete([1, 2, 3], max_tokens=2, request_id="r0")
    return s


def _server_state(s: SlotServer) -> Any:
    return s.state(), len(s.history), s.records, copy_ids(s)


def copy_ids(s: SlotServer) -> str:
    """The next automatic id, without using it up: ``count(N)``."""
    return repr(s._ids)


class ServerBox(Box):
    def __init__(self, server: SlotServer) -> None:
        super().__init__(lambda: _server_state(server))
        self.server = server
        self.history = server.history


def _swa_slot() -> swa.SwaSlot:
    slot = swa.SwaSlot(swa.SwaConfig(n_ctx=512, n_ubatch=64, n_batch=128, n_swa=32))
    slot.complete(list(range(200)), user_starts=[50])
    return slot


class SwaBox(Box):
    def __init__(self, slot: swa.SwaSlot) -> None:
        super().__init__(
            lambda: (
                list(slot.ring.cells),
                slot.ring.head,
                list(slot.tokens),
                list(slot.checkpoints),
                len(slot.records),
            )
        )
        self.history = slot.history


def _attempt(model: Box, call: Callable[[], object]) -> KvlabError | None:
    """Run ``call``; accepted is fine, refused must be kvlab's error with the model unchanged."""
    before = model.state(), len(getattr(model, "history", None) or ())
    try:
        call()
    except KvlabError as exc:
        assert str(exc)
        assert (model.state(), len(getattr(model, "history", None) or ())) == before
        return exc
    return None


# ---------------------------------------------------------------- SlotServer


SERVER_CALLS: dict[str, Callable[[SlotServer, object], object]] = {
    "complete prompt": lambda s, v: s.complete(v),
    "complete max_tokens": lambda s, v: s.complete([1, 2], max_tokens=v),
    "complete generated": lambda s, v: s.complete([1, 2], max_tokens=2, generated=v),
    "complete id_slot": lambda s, v: s.complete([1, 2], id_slot=v),
    "complete cache_prompt": lambda s, v: s.complete([1, 2], cache_prompt=v),
    "complete request_id": lambda s, v: s.complete([1, 2], request_id=v),
    "start prompt": lambda s, v: s.start(v),
    "finish": lambda s, v: s.finish(v),
    "slot_tokens": lambda s, v: s.slot_tokens(v),
    "load_tokens slot": lambda s, v: s.load_tokens(v, [1]),
    "load_tokens tokens": lambda s, v: s.load_tokens(0, v),
    "erase": lambda s, v: s.erase(v),
    "reply returns": lambda s, v: SlotServer(reply=lambda p, n: v).complete([1], max_tokens=1),
}


@pytest.mark.parametrize("call", SERVER_CALLS.values(), ids=SERVER_CALLS.keys())
@SETTINGS
@given(value=hostile_values())
def test_server_calls_refuse_hostile_values_and_change_nothing(call, value):
    s = _server()
    _attempt(ServerBox(s), lambda: call(s, value))


SERVER_ARGS = (
    "n_slots",
    "n_ctx",
    "cache_prompt",
    "slot_prompt_similarity",
    "cache_ram_mib",
    "state_bytes_per_token",
    "reply",
    "record",
)


@pytest.mark.parametrize("arg", SERVER_ARGS)
@SETTINGS
@given(value=hostile_values())
def test_server_settings_refuse_hostile_values(arg, value):
    _attempt(Box(), lambda: SlotServer(**{arg: value}))


@pytest.mark.parametrize("arg, limit", [("n_slots", "slots"), ("n_ctx", "tokens"), ("cache_ram_mib", "mib")])
@SETTINGS
@given(value=huge_ints.filter(lambda v: v > 2**31))
def test_server_sizes_are_bounded(arg, limit, value):
    with pytest.raises(InvalidArgumentError, match=f"LIMITS.{limit}"):
        SlotServer(**{arg: value})


def test_huge_servers_are_refused_at_once():
    for kwargs in (
        {"n_slots": 10**30},
        {"n_ctx": 10**30},
        {"cache_ram_mib": 10**30},
        {"state_bytes_per_token": 10**30},
    ):
        with pytest.raises(InvalidArgumentError, match="at most"):
            SlotServer(**kwargs)


def test_a_refused_request_uses_no_automatic_id(refuses):
    s = SlotServer(1)
    refuses(s, lambda s: s.complete([1, 2], generated="xy"), InvalidArgumentError)
    refuses(s, lambda s: s.complete([1, 2], max_tokens=1, generated=[1.5]), InvalidArgumentError)
    refuses(s, lambda s: s.complete([1, 2], max_tokens=1, generated=[-1]), InvalidArgumentError)
    assert s.complete([1, 2]).request_id == "req-0"
    s.start([5, 6])
    refuses(s, lambda s: s.complete([1, 2]), SlotBusyError)  # all slots busy: no id either
    s.finish("req-1")
    assert s.complete([7]).request_id == "req-2"


@pytest.mark.parametrize(
    "returned, words",
    [
        ([1.9], "1.9"),
        (None, "None"),
        ([None], "None"),
        (["a"], "'a'"),
        ([True], "True"),
        ([-1], "-1"),
        ([2**31], "2147483648"),
        ([1, 2], "2 tokens, expected 1"),
        ([], "0 tokens, expected 1"),
        ("x", "'x'"),
        (iter(itertools.count()), "more than 1"),  # an endless generator is not read to the end
        (np.array([1.5]), "1.5"),
    ],
)
def test_a_reply_function_returning_garbage_is_refused(returned, words, refuses):
    s = SlotServer(1, reply=lambda prompt, n: returned)
    s.complete([1, 2], max_tokens=0, generated=[])
    info = refuses(s, lambda s: s.complete([1, 2, 3], max_tokens=1), InvalidArgumentError)
    assert words in str(info.value) and "reply function" in str(info.value)
    assert s.complete([1, 2, 3], max_tokens=0, generated=[]).request_id == "req-1"  # no id used up


def test_a_raising_reply_function_is_wrapped(refuses):
    def boom(prompt, n):
        raise ZeroDivisionError("no")

    s = SlotServer(1, reply=boom)
    info = refuses(s, lambda s: s.complete([1], max_tokens=2), InvalidArgumentError, "ZeroDivisionError")
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_a_reply_function_cannot_call_the_server(refuses):
    box: list[SlotServer] = []
    s = SlotServer(2, reply=lambda prompt, n: [box[0].complete([9], max_tokens=0).cache_n] * n)
    box.append(s)
    refuses(s, lambda s: s.complete([1], max_tokens=1), InvalidArgumentError, "called the server")


def test_a_reply_function_cannot_change_the_prompt():
    s = SlotServer(1, reply=lambda prompt, n: (prompt.clear(), [5] * n)[1])
    s.complete([1, 2, 3], max_tokens=2)
    assert s.slot_tokens(0) == (1, 2, 3, 5)


def test_all_or_nothing_rolls_back_every_step():
    s = _server()
    before = _server_state(s)
    with pytest.raises(SlotBusyError), s.all_or_nothing():
        s.complete([4, 5, 6], max_tokens=3)
        s.erase(0)
        s.start([7])
        s.start([8])
        s.start([9])  # both slots busy
    assert _server_state(s) == before


@SETTINGS
@given(a=hostile_values(), b=hostile_values())
def test_common_prefix_validates_both_lists(a, b):
    _attempt(Box(), lambda: slots.common_prefix(a, b))
    _attempt(Box(), lambda: slots.common_prefix([1, 2], b))


@SETTINGS
@given(prompt=hostile_values(), n=hostile_values())
def test_default_reply_validates(prompt, n):
    _attempt(Box(), lambda: slots.default_reply(prompt, 3))
    _attempt(Box(), lambda: slots.default_reply([1, 2], n))


def test_common_prefix_refuses_what_it_used_to_crash_on():
    for a, b in ((None, [1]), ([1], 5), ([1.5], [1]), ([-1], [1]), ([2**40], [1]), ("ab", "ab")):
        with pytest.raises(InvalidArgumentError):
            slots.common_prefix(a, b)
    assert slots.common_prefix((1, 2, 3), np.array([1, 2, 4])) == 2


# ---------------------------------------------------------------- chats and agents


def test_a_chat_refused_halfway_leaves_the_server_as_it_was(refuses):
    s = SlotServer(1, n_ctx=60, cache_ram_mib=0)
    s.complete([1, 2, 3])
    messages = ["hello", "a much longer message that will not fit " * 2, "third"]
    refuses(
        s,
        lambda s: conversation.replay_chat(messages, system="sys", server=s, tokenizer=Tokenizer()),
        InvalidArgumentError,
        "turn 3",  # turns 1 and 2 ran, and were taken back
    )


CHAT_ARGS: dict[str, Callable[[SlotServer, object], object]] = {
    "user_messages": lambda s, v: conversation.replay_chat(v, system="s", server=s, tokenizer=Tokenizer()),
    "system": lambda s, v: conversation.replay_chat(["hi"], system=v, server=s, tokenizer=Tokenizer()),
    "server": lambda s, v: conversation.replay_chat(["hi"], system="s", server=v, tokenizer=Tokenizer()),
    "tokenizer": lambda s, v: conversation.replay_chat(["hi"], system="s", server=s, tokenizer=v),
    "max_tokens": lambda s, v: conversation.replay_chat(
        ["hi"], system="s", server=s, tokenizer=Tokenizer(), max_tokens=v
    ),
    "clock": lambda s, v: conversation.replay_chat(
        ["hi"], system="s", server=s, tokenizer=Tokenizer(), clock=v
    ),
    "clock returns": lambda s, v: conversation.replay_chat(
        ["hi", "there"], system="s", server=s, tokenizer=Tokenizer(), clock=lambda t: v
    ),
    "predicted sizes": lambda s, v: conversation.predicted_cache_n(v, 8),
    "predicted max_tokens": lambda s, v: conversation.predicted_cache_n([34, 56], v),
    "tokens_processed": lambda s, v: conversation.tokens_processed(v),
    "TurnCounters": lambda s, v: conversation.TurnCounters(v, 0, 0),
    "ex10 report": lambda s, v: ex10.arithmetic_report(v),
    "ex10 report max_tokens": lambda s, v: ex10.arithmetic_report(max_tokens=v),
    "ex10 clock": lambda s, v: ex10.clock_at_ten(v),
}


@pytest.mark.parametrize("call", CHAT_ARGS.values(), ids=CHAT_ARGS.keys())
@SETTINGS
@given(value=hostile_values())
def test_chat_helpers_refuse_hostile_values(call, value):
    s = SlotServer(1, n_ctx=512, cache_ram_mib=0)
    _attempt(ServerBox(s), lambda: call(s, value))


def _bad_policy(value: object) -> Callable[..., object]:
    return lambda prefix, results: value


AGENT_CALLS: dict[str, Callable[[SlotServer, object], object]] = {
    "policy": lambda s, v: agents.run_agent(v, turns=3, server=s),
    "policy returns": lambda s, v: agents.run_agent(_bad_policy(v), turns=3, server=s),
    "turns": lambda s, v: agents.run_agent(
        agents.AppendOnly(), turns=v, prefix_tokens=10, result_tokens=5, server=s
    ),
    "prefix_tokens": lambda s, v: agents.run_agent(agents.AppendOnly(), turns=2, prefix_tokens=v, server=s),
    "result_tokens": lambda s, v: agents.run_agent(
        agents.AppendOnly(), turns=2, prefix_tokens=10, result_tokens=v
    ),
    "first_result_id": lambda s, v: agents.run_agent(agents.AppendOnly(), turns=2, first_result_id=v),
    "name": lambda s, v: agents.run_agent(agents.AppendOnly(), turns=2, name=v),
    "server": lambda s, v: agents.run_agent(agents.AppendOnly(), turns=2, server=v),
    "KeepLast": lambda s, v: agents.KeepLast(v),
    "SummarizeOnce after": lambda s, v: agents.SummarizeOnce(v),
    "SummarizeOnce tokens": lambda s, v: agents.SummarizeOnce(3, v),
    "SummarizeOnce first id": lambda s, v: agents.SummarizeOnce(3, 10, v),
    "AppendOnly prefix": lambda s, v: agents.AppendOnly()(v, [[1]]),
    "AppendOnly results": lambda s, v: agents.AppendOnly()([1], v),
    "KeepLast results": lambda s, v: agents.KeepLast(2)([1], v),
    "SummarizeOnce results": lambda s, v: agents.SummarizeOnce(1)([1], v),
    "ex13 server_ctx": lambda s, v: ex13.example_13(v) if not isinstance(v, int) else None,
}


@pytest.mark.parametrize("call", AGENT_CALLS.values(), ids=AGENT_CALLS.keys())
@SETTINGS
@given(value=hostile_values())
def test_agent_helpers_refuse_hostile_values(call, value):
    s = SlotServer(1, n_ctx=8192, cache_ram_mib=0)
    _attempt(ServerBox(s), lambda: call(s, value))


def test_policies_that_misbehave_are_refused(refuses):
    s = SlotServer(1, n_ctx=8192, cache_ram_mib=0)
    for bad in ([1.9], None, [-3], [2**31], "abc", [[1]]):
        refuses(
            s, lambda s, bad=bad: agents.run_agent(_bad_policy(bad), turns=2, server=s), InvalidArgumentError
        )

    def boom(prefix, results):
        raise KeyError("policy bug")

    info = refuses(s, lambda s: agents.run_agent(boom, server=s), InvalidArgumentError, "KeyError")
    assert isinstance(info.value.__cause__, KeyError)


def test_agent_sizes_are_bounded():
    for kwargs in (
        {"turns": 10**30},
        {"prefix_tokens": 10**30},
        {"result_tokens": 10**30},
        {"first_result_id": 2**31},
    ):
        with pytest.raises(InvalidArgumentError, match="at most"):
            agents.run_agent(agents.AppendOnly(), **kwargs)
    with raised_limits(total_tokens=1000), pytest.raises(InvalidArgumentError, match="total_tokens"):
        agents.run_agent(agents.AppendOnly(), turns=20)


# ---------------------------------------------------------------- layouts


LAYOUT_CALLS: dict[str, Callable[[object], object]] = {
    "segments": lambda v: layout.run_layout(v, turns=2),
    "name": lambda v: layout.run_layout([layout.system_prompt()], name=v, turns=2),
    "turns": lambda v: layout.run_layout([layout.system_prompt()], turns=v),
    "block_size": lambda v: layout.run_layout([layout.system_prompt()], block_size=v, turns=2),
    "scheme": lambda v: layout.run_layout([layout.system_prompt()], scheme=v, turns=2),
    "session": lambda v: layout.run_layout([layout.system_prompt()], session=v, turns=2),
    "build returns": lambda v: layout.run_layout([layout.per_turn("x", lambda t: v)], turns=2),
    "fixed": lambda v: layout.fixed("x", v),
    "fixed name": lambda v: layout.fixed(v, [1]),
    "per_turn": lambda v: layout.per_turn("x", v),
    "Segment name": lambda v: layout.Segment(v, lambda s, t: []),
    "Segment build": lambda v: layout.Segment("x", v),
    "tool_definitions": lambda v: layout.tool_definitions(shuffled=v),
    "chained tokens": lambda v: layout.chained_hashes(v, 16),
    "chained java tokens": lambda v: layout.chained_hashes(v, 2, "java"),
    "chained block_size": lambda v: layout.chained_hashes([1, 2, 3], v),
    "chained scheme": lambda v: layout.chained_hashes([1, 2, 3], 2, v),
    "session system_tokens": lambda v: layout.AgentSession(system_tokens=v),
    "session n_tools": lambda v: layout.AgentSession(n_tools=v),
    "session seed": lambda v: layout.AgentSession(seed=v),
    "session turn": lambda v: layout.AgentSession().message(v),
    "ex09 scheme": lambda v: ex09.example_9(v),
}


@pytest.mark.parametrize("call", LAYOUT_CALLS.values(), ids=LAYOUT_CALLS.keys())
@SETTINGS
@given(value=hostile_values())
def test_layout_helpers_refuse_hostile_values(call, value):
    _attempt(Box(), lambda: call(value))


def test_layout_sizes_are_bounded():
    for call in (
        lambda: layout.run_layout([layout.system_prompt()], turns=10**30),
        lambda: layout.AgentSession(system_tokens=10**30),
        lambda: layout.AgentSession(n_tools=10**7, tool_tokens=100),
        lambda: layout.AgentSession(seed=2**63),
        lambda: layout.chained_hashes([1], 10**30),
        lambda: layout.chained_hashes([-1, 5], 1, "java"),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
    with raised_limits(total_tokens=5000), pytest.raises(InvalidArgumentError, match="total_tokens"):
        layout.run_layout([layout.system_prompt(), layout.history()], turns=30)


def test_an_endless_segment_is_not_read_to_the_end():
    with raised_limits(tokens=1000), pytest.raises(InvalidArgumentError, match="more than 1,000"):
        layout.run_layout([layout.per_turn("endless", lambda t: itertools.count())], turns=1)


# ---------------------------------------------------------------- sliding window


SWA_CALLS: dict[str, Callable[[swa.SwaSlot, object], object]] = {
    "prompt": lambda s, v: s.complete(v),
    "max_tokens": lambda s, v: s.complete([1, 2], max_tokens=v),
    "user_starts": lambda s, v: s.complete(list(range(10)), user_starts=v),
    "generated": lambda s, v: s.complete([1, 2], max_tokens=2, generated=v),
    "cache_prompt": lambda s, v: s.complete([1, 2], cache_prompt=v),
    "checkpoint_plan n": lambda s, v: swa.checkpoint_plan(v, swa.SwaConfig(n_ctx=256)),
    "checkpoint_plan config": lambda s, v: swa.checkpoint_plan(10, v),
    "checkpoint_usable": lambda s, v: swa.checkpoint_usable(v, 3, 4),
    "checkpoint_usable n_past": lambda s, v: swa.checkpoint_usable(s.checkpoints[0], v, 4),
    "checkpoint_usable n_swa": lambda s, v: swa.checkpoint_usable(s.checkpoints[0], 3, v),
    "swa_cache_cells n_swa": lambda s, v: swa.swa_cache_cells(v),
    "swa_cache_cells n_ctx": lambda s, v: swa.swa_cache_cells(128, v),
    "swa_cache_cells n_seq": lambda s, v: swa.swa_cache_cells(128, 4096, 512, v),
    "swa_cache_cells swa_full": lambda s, v: swa.swa_cache_cells(128, swa_full=v),
    "SwaSlot": lambda s, v: swa.SwaSlot(v),
    "SwaRing size": lambda s, v: swa.SwaRing(v, 4),
    "ex12 follow_up": lambda s, v: ex12.example_12(v) if not isinstance(v, (int, np.integer)) else None,
}


@pytest.mark.parametrize("call", SWA_CALLS.values(), ids=SWA_CALLS.keys())
@SETTINGS
@given(value=hostile_values())
def test_swa_calls_refuse_hostile_values_and_change_nothing(call, value):
    slot = _swa_slot()
    _attempt(SwaBox(slot), lambda: call(slot, value))


@pytest.mark.parametrize(
    "field",
    [
        "n_swa",
        "n_ctx",
        "n_ubatch",
        "n_batch",
        "swa_full",
        "ctx_checkpoints",
        "checkpoint_min_step",
        "cache_prompt",
    ],
)
@SETTINGS
@given(value=hostile_values())
def test_swa_config_refuses_hostile_values(field, value):
    _attempt(Box(), lambda: swa.SwaConfig(**{field: value}))


def test_swa_sizes_are_bounded():
    for call in (
        lambda: swa.checkpoint_plan(10**30),
        lambda: swa.checkpoint_plan(10_000),  # longer than the default n_ctx: refused before it is built
        lambda: swa.SwaConfig(n_ctx=10**30),
        lambda: swa.SwaConfig(ctx_checkpoints=10**30),
        lambda: swa.swa_cache_cells(10**30),
        lambda: swa.SwaRing(10**30, 4),
    ):
        with pytest.raises(InvalidArgumentError, match="at most|slot holds"):
            call()


def test_swa_work_per_request_is_bounded(refuses):
    slot = swa.SwaSlot(swa.SwaConfig(n_ctx=20_000, n_ubatch=1, n_batch=1, swa_full=True))
    box = SwaBox(slot)
    with raised_limits(total_tokens=10**6):
        refuses(box, lambda b: slot.complete(list(range(5000))), InvalidArgumentError, "total_tokens")


# ---------------------------------------------------------------- slot files


def _files_state(server: SlotServer, d) -> Any:
    return _server_state(server), sorted(p.name for p in d.iterdir())


FILE_CALLS: dict[str, Callable[[SlotServer, Any, object], object]] = {
    "save filename": lambda s, d, v: slot_files.save_slot(s, 0, v, directory=d),
    "save slot": lambda s, d, v: slot_files.save_slot(s, v, "p.bin", directory=d),
    "save directory": lambda s, d, v: slot_files.save_slot(s, 0, "q.bin", directory=v),
    "save shape": lambda s, d, v: slot_files.save_slot(s, 0, "q.bin", directory=d, shape=v),
    "save seed": lambda s, d, v: slot_files.save_slot(s, 0, "q.bin", directory=d, seed=v),
    "save server": lambda s, d, v: slot_files.save_slot(v, 0, "q.bin", directory=d),
    "restore filename": lambda s, d, v: slot_files.restore_slot(s, 0, v, directory=d),
    "restore slot": lambda s, d, v: slot_files.restore_slot(s, v, "p.bin", directory=d),
    "restore directory": lambda s, d, v: slot_files.restore_slot(s, 0, "p.bin", directory=v),
    "restore shape": lambda s, d, v: slot_files.restore_slot(s, 0, "p.bin", directory=d, shape=v),
    "check_filename": lambda s, d, v: slot_files.check_filename(v),
    "read_slot_file": lambda s, d, v: slot_files.read_slot_file(d, v, slot_files.TINY_MODEL),
    "write_slot_file data": lambda s, d, v: slot_files.write_slot_file(d, "q.bin", v),
    "decode blob": lambda s, d, v: slot_files.decode_slot(v, slot_files.TINY_MODEL),
    "decode shape": lambda s, d, v: slot_files.decode_slot(b"x" * 64, v),
    "encode": lambda s, d, v: slot_files.encode_slot(v),
    "synthetic tokens": lambda s, d, v: slot_files.synthetic_kv(slot_files.TINY_MODEL, v),
    "synthetic seed": lambda s, d, v: slot_files.synthetic_kv(slot_files.TINY_MODEL, [1], seed=v),
    "ModelShape layers": lambda s, d, v: slot_files.ModelShape(v, 2, 32),
    "ModelShape heads": lambda s, d, v: slot_files.ModelShape(4, v, 32),
    "ModelShape dim": lambda s, d, v: slot_files.ModelShape(4, 2, v),
    "ModelShape dtype": lambda s, d, v: slot_files.ModelShape(4, 2, 32, v),
    "SlotData tokens": lambda s, d, v: slot_files.SlotData(
        slot_files.TINY_MODEL, v, np.zeros(0), np.zeros(0)
    ),
    "SlotData keys": lambda s, d, v: slot_files.SlotData(slot_files.TINY_MODEL, (), v, v),
    "slot_file_size": lambda s, d, v: slot_files.slot_file_size(slot_files.TINY_MODEL, v),
    "header_bytes": lambda s, d, v: slot_files.header_bytes(v),
    "offload n_tokens": lambda s, d, v: slot_files.offload_estimate(v, 131_072),
    "offload bytes": lambda s, d, v: slot_files.offload_estimate(748, v),
    "offload n_params": lambda s, d, v: slot_files.offload_estimate(748, 131_072, n_params=v),
    "offload efficiency": lambda s, d, v: slot_files.offload_estimate(748, 131_072, gpu_efficiency=v),
    "ex11 n_tokens": lambda s, d, v: ex11.arithmetic_report(v),
    "ex11 written": lambda s, d, v: ex11.arithmetic_report(748, v),
}


@pytest.mark.parametrize("call", FILE_CALLS.values(), ids=FILE_CALLS.keys())
@SETTINGS
@given(value=hostile_values())
def test_slot_file_calls_refuse_hostile_values(tmp_path_factory, call, value):
    d = tmp_path_factory.mktemp("slots")
    s = SlotServer(1, cache_ram_mib=0)
    s.complete([1, 2, 3], max_tokens=0)
    slot_files.save_slot(s, 0, "p.bin", directory=d)
    box = Box(lambda: _files_state(s, d))
    box.history = s.history  # type: ignore[attr-defined]
    with contextlib.chdir(d):  # a value such as "." or "" names the working directory: keep it in d
        _attempt(box, lambda: call(s, d, value))
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


NEVER_VALID = st.one_of(
    huge_ints.filter(lambda v: v > 2**31 or v < 0),
    odd_floats,
    wrong_types.filter(lambda v: not isinstance(v, (bool, list))),
)


@SETTINGS
@given(value=NEVER_VALID)
def test_never_valid_sizes_are_always_refused(value, refuses):
    s = _server()
    box = ServerBox(s)
    for call in (
        lambda b: s.complete([1, 2], max_tokens=value),
        lambda b: s.slot_tokens(value),
        lambda b: s.erase(value),
        lambda b: SlotServer(value),
        lambda b: swa.checkpoint_plan(value),
        lambda b: slot_files.slot_file_size(slot_files.TINY_MODEL, value),
        lambda b: agents.KeepLast(value),
        lambda b: layout.run_layout([layout.system_prompt()], turns=value),
    ):
        refuses(box, call, KvlabError)
