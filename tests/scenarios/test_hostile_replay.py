"""Hostile scenario input: the reader's limits, every op field's type, the CLI's one-line refusals, deep
radix trees, the iterative JSON writer, and the --changes records folded back to the full ones."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile import hostile_values, nested_list
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab import scenarios
from kvlab.cli.replay import main
from kvlab.core import jsonio
from kvlab.errors import LIMITS, KvlabError, ScenarioError, raised_limits
from kvlab.scenarios import prefix_cache, radix

ROOT = Path(__file__).resolve().parents[2]
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Stdin:
    """A standard input whose bytes are ``data`` (read through ``.buffer``, as the CLI does)."""

    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)


def run_main(argv: list[str], data: bytes | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = _Stdin(data or b"")  # type: ignore[assignment]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def assert_refused(code: int, out: str, err: str) -> None:
    assert code == 2, (code, err)
    assert out == "" and "Traceback" not in err
    assert err.startswith("kvlab replay: ") and err.count("\n") == 1, err


PC = {"block_size": 4, "num_blocks": 8}

HOSTILE_TEXTS = {
    "deep list": b'{"config": {}, "ops": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "deep object": b'{"ops": [' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"]}",
    "huge int size": b'{"config": {"block_size": 4, "num_blocks": 1' + b"0" * 5000 + b'}, "ops": []}',
    "huge int token": b'{"config": {"block_size": 4, "num_blocks": 4}, "ops": [{"op": "probe", "tokens": [9'
    + b"9" * 3000
    + b"]}]}",
    "NaN": b'{"config": {"block_size": NaN, "num_blocks": 4}, "ops": []}',
    "Infinity": b'{"config": {}, "ops": [{"op": "evict", "num_tokens": -Infinity}]}',
    "big float": b'{"config": {}, "ops": [{"op": "evict", "num_tokens": 1e400}]}',
    "invalid utf-8": b'{"config": {}, "ops": [{"op": "insert", "tokens": [1], "extra_key": "\xff\xfe"}]}',
    "lone surrogate escape bytes": b'{"ops": []}\xed\xb3\xbf',
    "bom": b'\xef\xbb\xbf{"ops": []}',
    "ten million blocks": b'{"config": {"block_size": 4, "num_blocks": 10000000}, "ops": []}',
    "absurd block size": b'{"config": {"block_size": 1000000000, "num_blocks": 4}, "ops": []}',
    "absurd page size": b'{"config": {"page_size": 99999999999}, "ops": []}',
    "absurd evict": b'{"config": {}, "ops": [{"op": "evict", "num_tokens": 99999999999999999999}]}',
    "empty": b"",
    "not an object": b"[1, 2]",
}


@pytest.mark.parametrize("model", ["prefix-cache", "radix"])
@pytest.mark.parametrize("case", list(HOSTILE_TEXTS))
def test_hostile_input_on_stdin_and_in_a_file_is_one_line(case, model, tmp_path) -> None:
    data = HOSTILE_TEXTS[case]
    assert_refused(*run_main([model], data))
    path = tmp_path / "scenario.json"
    path.write_bytes(data)
    assert_refused(*run_main([model, str(path)]))
    assert_refused(*run_main([model, "--changes", str(path)]))


def test_the_limits_are_named_in_the_messages() -> None:
    for case, words in [
        ("deep list", "LIMITS.json_depth"),
        ("huge int size", "LIMITS.int_digits"),
        ("invalid utf-8", f"byte {HOSTILE_TEXTS['invalid utf-8'].index(bytes([0xFF]))}"),
        ("ten million blocks", "LIMITS.num_blocks"),
        ("absurd block size", "LIMITS.block_size"),
        ("absurd page size", "LIMITS.block_size"),
        ("NaN", "NaN"),
    ]:
        model = "radix" if "page" in case else "prefix-cache"
        with pytest.raises(ScenarioError, match=words.replace(".", r"\.")):
            _, config, ops = scenarios.load_scenario(HOSTILE_TEXTS[case])
            scenarios.replay(model, config, ops)


def test_size_and_op_count_limits() -> None:
    with raised_limits(scenario_bytes=100):
        with pytest.raises(ScenarioError, match="scenario_bytes"):
            scenarios.load_scenario(b'{"ops": [' + b" " * 200 + b"]}")
        assert_refused(*run_main(["radix"], b'{"ops": [' + b" " * 200 + b"]}"))
    with raised_limits(ops=3):
        with pytest.raises(ScenarioError, match="LIMITS.ops"):
            scenarios.load_scenario(json.dumps({"ops": [{"op": "evict", "num_tokens": 0}] * 4}))
        with pytest.raises(ScenarioError, match="LIMITS.ops"):
            radix.replay({}, [{"op": "evict", "num_tokens": 0}] * 4)
    with pytest.raises(ScenarioError, match="LIMITS.tokens"):
        prefix_cache.replay(PC, [{"op": "probe", "tokens": [1] * (LIMITS.tokens + 1)}])


def test_a_missing_file_and_a_directory_are_one_line(tmp_path) -> None:
    assert_refused(*run_main(["radix", str(tmp_path / "nope.json")]))
    assert_refused(*run_main(["radix", str(tmp_path)]))


@FAST
@given(st.binary(max_size=300))
def test_garbage_bytes_are_refused_in_one_line(data: bytes) -> None:
    assert_refused(*run_main(["prefix-cache"], data))
    assert_refused(*run_main(["radix", "--changes"], data))


JSON_TYPES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
)
PC_FIELDS = ("op", "req", "tokens", "cache_salt")
RX_FIELDS = ("op", "tokens", "as", "extra_key", "node", "num_tokens")


@FAST
@given(st.sampled_from(["alloc", "append", "free", "probe"]), st.sampled_from(PC_FIELDS), JSON_TYPES)
def test_prefix_cache_fields_of_every_json_type(name, field, value) -> None:
    ops = [{"op": "alloc", "req": "A", "tokens": [1, 2, 3]}, {"op": name, "req": "A", "tokens": [4]}]
    ops[1][field] = value
    _replay_or_refuse("prefix-cache", PC, ops)


@FAST
@given(st.sampled_from(list(radix.OP_FIELDS)), st.sampled_from(RX_FIELDS), JSON_TYPES)
def test_radix_fields_of_every_json_type(name, field, value) -> None:
    op = {"op": name, "tokens": [1, 2], "node": "h", "num_tokens": 1}
    op = {k: v for k, v in op.items() if k == "op" or k in radix.OP_FIELDS[name]}
    op[field] = value
    ops = [{"op": "insert", "tokens": [1, 2, 3]}, {"op": "match", "tokens": [1, 2], "as": "h"}, op]
    _replay_or_refuse("radix", {}, ops)


def _replay_or_refuse(model: str, config: dict, ops: list) -> None:
    """Either both modes replay, or both refuse with a ScenarioError; the CLI answers in one line."""
    try:
        full = scenarios.replay(model, config, ops)
    except ScenarioError:
        full = None
    try:
        changes = list(scenarios.module(model).replay_changes(config, ops))
    except ScenarioError:
        changes = None
    assert (full is None) == (changes is None)
    code, out, err = run_main([model], jsonio.dumps({"config": config, "ops": ops}).encode())
    if full is None:
        assert_refused(code, out, err)
    else:
        assert code == 0 and json.loads(out) == full


@FAST
@given(hostile_values())
def test_hostile_python_values_in_any_op_field_or_config(value) -> None:
    for model, config, op in [
        ("prefix-cache", PC, {"op": "alloc", "req": "A", "tokens": [1]}),
        ("radix", {}, {"op": "match", "tokens": [1], "as": "h"}),
    ]:
        for field in op:  # some values are valid ("0" names a request): then it replays
            _either_replays_or_kvlab_error(model, config, [dict(op, **{field: value})])
        for key in config or {"page_size": 1}:
            _either_replays_or_kvlab_error(model, dict(config, **{key: value}), [])
        with pytest.raises(KvlabError):
            scenarios.replay(model, config, [value])
        with pytest.raises(KvlabError):
            scenarios.replay(model, config, [dict(op, op=value)])


def _either_replays_or_kvlab_error(model: str, config: dict, ops: list) -> None:
    with contextlib.suppress(KvlabError):
        scenarios.replay(model, config, ops)


def test_a_playground_refuses_ten_million_blocks_at_once() -> None:
    from kvlab.views import Playground

    start = time.process_time()
    for model in ("prefix-cache", "block-pool"):
        scenario = {"config": {"block_size": 4, "num_blocks": 10_000_000}, "ops": []}
        if model == "block-pool":
            scenario["model"] = model
        with pytest.raises(ScenarioError, match="LIMITS.num_blocks"):
            Playground.from_scenario(scenario)
    with pytest.raises(ScenarioError, match="json_depth"):
        Playground.from_scenario({"config": {"block_size": 4, "num_blocks": 4}, "ops": nested_list(5000)})
    assert time.process_time() - start < 2


# ---------------------------------------------------------------------- the iterative JSON writer

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=6, alphabet=st.characters()),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(
            st.one_of(st.text(max_size=4), st.integers(), st.booleans(), st.none()), inner, max_size=4
        ),
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_the_writer_writes_what_json_dumps_writes(value) -> None:
    assert jsonio.dumps(value) == json.dumps(value)
    fh = io.StringIO()
    jsonio.write_json(value, fh)
    assert fh.getvalue() == json.dumps(value)


def test_the_writer_does_not_recurse_and_refuses_what_json_refuses() -> None:
    deep = nested_list(100_000)
    assert jsonio.dumps(deep) == "[" * 100_001 + "]" * 100_001  # depth 100,000 around the innermost []
    loop: list = []
    loop.append([loop])
    with pytest.raises(ValueError, match="Circular"):
        jsonio.dumps(loop)
    with pytest.raises(KvlabError, match="cannot be written as JSON"):
        jsonio.dumps({"a": [[{1, 2}]]})
    with pytest.raises(KvlabError, match="cannot be written as JSON"):
        jsonio.dumps({(1,): [[1]]})
    for not_json in (float("nan"), float("inf"), {"a": [-float("inf")]}):  # json.dumps would write NaN
        with pytest.raises(KvlabError, match="cannot be written as JSON"):
            jsonio.dumps(not_json)


@FAST
@given(st.integers(0, 200), st.sampled_from(["[", "{", '{"a": ']))
def test_the_depth_scan_agrees_with_the_nesting(depth, opener) -> None:
    closer = {"[": "]", "{": "}", '{"a": ': "}"}[opener]
    inner = "1" if opener == '{"a": ' else ""
    text = '["[[[", ' + opener * depth + inner + closer * depth + ', "]]]"]'
    with raised_limits(json_depth=1):
        assert jsonio.json_depth(text) == max(1 + depth, 0) or depth == 0


# ---------------------------------------------------------------------- deep radix trees


def deep_radix_scenario(depth: int) -> dict:
    """One prompt, then a match of every prefix of it: each splits off one node, a chain ``depth`` deep."""
    base = list(range(1, depth + 2))
    ops = [{"op": "insert", "tokens": base}] + [
        {"op": "match", "tokens": base[:k]} for k in range(1, depth + 1)
    ]
    return {"config": {}, "ops": ops}


@pytest.mark.parametrize("depth", [1500, pytest.param(3000, marks=pytest.mark.slow)])
def test_a_deep_radix_tree_replays_with_changes(depth, tmp_path) -> None:
    """Each match walks the whole chain (as SGLang's does): the replay costs depth**2 / 2 steps."""
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(deep_radix_scenario(depth)))
    code, out, err = run_main(["radix", "--changes", str(path)])
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == depth + 2
    assert all(json.loads(line)["nodes"] for line in lines[1:-1])  # every match split off a node
    final = lines[-1]  # json.loads itself would recurse on it: read it with the scan
    assert final.startswith('{"final": true') and final.count('"children"') == depth + 2
    with raised_limits(json_depth=1):
        assert jsonio.json_depth(final) == 1 + 2 * (depth + 2)  # a chain: a dict and its children per node


def test_a_deep_radix_tree_replays_in_full_past_the_recursion_limit(tmp_path) -> None:
    depth = 600  # json.dumps took 2 levels a node: past the recursion limit (the records are ops x nodes)
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(deep_radix_scenario(depth)))
    code, out, err = run_main(["radix", str(path)])
    assert code == 0 and err == "" and out.endswith("}]\n")
    assert out.count('{"op": "match"') == depth  # json.loads would recurse: count instead
    with raised_limits(json_depth=1):
        assert jsonio.json_depth(out) == 2 + 2 * (depth + 2)  # the list, the last record, the chain
    state = radix.Run({}, changes=True)  # the full records of 3,000 ops would hold 3000 x 3000 nodes
    for i, op in enumerate(deep_radix_scenario(3000)["ops"]):
        state.apply(op, i)
    assert jsonio.dumps(radix.tree_dict(state.model)).count("children") == 3002  # 3000 deep, no recursion


# ---------------------------------------------------------------------- --changes folds back to the full records


def fold_prefix_cache(config: dict, changes: list[dict]) -> list[list[int]]:
    queue = list(range(1 if config.get("null_block") else 0, config["num_blocks"]))
    tables: dict[str, list[int]] = {}
    queues = []
    for rec in changes[:-1]:
        left = set(rec["left_free"])
        queue = rec["to_front"] + [b for b in queue if b not in left] + rec["to_back"]
        assert len(queue) == rec["num_free"]
        if rec["ok"] and rec["op"] == "alloc":
            tables[rec["req"]] = rec["hit_block_ids"] + rec["new_block_ids"]
        elif rec["ok"] and rec["op"] == "append":
            tables[rec["req"]] += rec["new_block_ids"]
        elif rec["op"] == "free":
            del tables[rec["req"]]
        queues.append(queue)
    assert changes[-1] == {"final": True, "free_queue": queue, "block_tables": tables}
    return queues


def random_valid_ops(model: str, config: dict, rng: random.Random, n: int) -> list[dict]:
    """``n`` random ops, keeping only those the scenario accepts (so the list replays)."""
    run = scenarios.module(model).Run(config)
    ops: list[dict] = []
    vocab = rng.choice([2, 3, 7])
    for _ in range(n * 3):
        if len(ops) == n:
            break
        toks = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
        if model == "prefix-cache":
            req = rng.choice("ABCDE")
            op = rng.choice(
                [
                    {"op": "alloc", "req": req, "tokens": toks},
                    {"op": "append", "req": req, "tokens": toks[:3]},
                    {"op": "free", "req": req},
                    {"op": "probe", "tokens": toks},
                ]
            )
        else:
            name = rng.choice("xyz")
            op = rng.choice(
                [
                    {"op": "insert", "tokens": toks},
                    {"op": "insert", "tokens": toks, "extra_key": "k"},
                    {"op": "match", "tokens": toks, "as": name},
                    {"op": "lock", "node": name},
                    {"op": "unlock", "node": name},
                    {"op": "evict", "num_tokens": rng.randrange(0, 8)},
                ]
            )
        try:
            run.apply(op, len(ops))
        except ScenarioError:
            continue
        ops.append(op)
    return ops


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 2, 4]), st.integers(2, 12), st.booleans())
def test_prefix_cache_changes_fold_to_the_full_records(seed, block_size, num_blocks, null_block) -> None:
    config = {"block_size": block_size, "num_blocks": num_blocks, "null_block": null_block}
    ops = random_valid_ops("prefix-cache", config, random.Random(seed), 40)
    full = prefix_cache.replay(config, ops)
    changes = list(prefix_cache.replay_changes(config, ops))
    assert [r["free_queue"] for r in full] == fold_prefix_cache(config, changes)
    same = ("op", "req", "ok", "num_cached_tokens", "hit_block_ids", "new_block_ids", "evicted")
    for f, c in zip(full, changes, strict=False):
        assert {k: f[k] for k in same} == {k: c[k] for k in same}


def fold_radix(changes: list[dict]) -> list[dict]:
    nodes: dict[int, dict] = {0: {"key": [], "lock_ref": 1, "children": [], "parent": None}}
    trees = []
    for rec in changes[:-1]:
        for entry in rec["nodes"]:
            if "cut" in entry:
                node, upper = nodes[entry["id"]], nodes[entry["parent"]]
                old = nodes[node["parent"]]["children"]
                old.remove(entry["parent"])  # the upper node was appended: it takes the lower's place
                old[old.index(entry["id"])] = entry["parent"]
                upper["children"].append(entry["id"])
                node["key"] = node["key"][entry["cut"] :]
                node["parent"] = entry["parent"]
            else:
                nodes[entry["id"]] = {
                    "key": entry["key"],
                    "lock_ref": entry["lock_ref"],
                    "children": [],
                    "parent": entry["parent"],
                    **({"extra_key": entry["extra_key"]} if "extra_key" in entry else {}),
                }
                nodes[entry["parent"]]["children"].append(entry["id"])
        for gone in rec["removed"]:
            nodes[nodes[gone]["parent"]]["children"].remove(gone)
            del nodes[gone]
        if rec["op"] in ("lock", "unlock"):
            walk = rec["node"]
            while nodes[walk]["parent"] is not None:
                nodes[walk]["lock_ref"] += 1 if rec["op"] == "lock" else -1
                walk = nodes[walk]["parent"]
        trees.append(_as_tree(nodes))
    assert changes[-1]["tree"] == trees[-1] if trees else True
    return trees


def _as_tree(nodes: dict[int, dict]) -> dict:
    def own(i: int) -> dict:
        n = nodes[i]
        out = {"key": n["key"], "lock_ref": n["lock_ref"]}
        if "extra_key" in n:
            out["extra_key"] = n["extra_key"]
        out["children"] = []
        return out

    root = own(0)
    stack = [(0, root)]
    while stack:
        i, out = stack.pop()
        for c in nodes[i]["children"]:
            child = own(c)
            out["children"].append(child)
            stack.append((c, child))
    return root


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 2]))
def test_radix_changes_fold_to_the_full_records(seed, page_size) -> None:
    config = {"page_size": page_size}
    ops = random_valid_ops("radix", config, random.Random(seed), 50)
    full = radix.replay(config, ops)
    changes = list(radix.replay_changes(config, ops))
    assert [r["tree"] for r in full] == fold_radix(changes)
    for f, c in zip(full, changes, strict=False):
        assert {k: v for k, v in f.items() if k != "tree"} == {k: c[k] for k in f if k != "tree"}


def test_changes_stream_stops_at_a_bad_op_with_one_line() -> None:
    ops = [{"op": "insert", "tokens": [1]}, {"op": ["insert"]}]
    code, out, err = run_main(["radix", "--changes"], json.dumps({"ops": ops}).encode())
    assert code == 2 and len(out.splitlines()) == 1 and err.count("\n") == 1 and "op 1:" in err


# ---------------------------------------------------------------------- 100,000 ops in --changes mode


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


@pytest.mark.slow
@pytest.mark.parametrize("model", ["prefix-cache", "radix"])
def test_100k_ops_replay_with_changes_streams_one_short_line_per_op(model, tmp_path) -> None:
    """Output grows linearly: one line per op, each short; the CPU time is the benchmarks' to print."""
    if model == "prefix-cache":
        scenario = _benchmark("prefix_cache").make_scenario(100_000, 16_384, 16)
    else:
        scenario = _benchmark("radix").make_scenario(100_000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(scenario))
    driver = (
        "import resource, sys\nfrom kvlab.__main__ import main\ncode = main(sys.argv[1:])\n"
        "u = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(u.ru_utime + u.ru_stime, u.ru_maxrss, file=sys.stderr)\nsys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", driver, "replay", model, "--changes", str(path)], capture_output=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-500:]
    cpu, rss_kib = done.stderr.split()
    assert done.stdout.count(b"\n") == len(scenario["ops"]) + 1
    assert len(done.stdout) < 600 * len(scenario["ops"])  # no per-op state dump (full records: ~100 KB/op)
    assert float(cpu) > 0
    assert int(rss_kib) < 2 * 2**20, rss_kib  # KiB: under 2 GiB
