"""kvlab.views widgets, headless: the stepper's slider drives its figures; the playground records and replays."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from kvlab.cli.replay import replay
from kvlab.errors import InvalidArgumentError, ScenarioError
from kvlab.lessons import ex01, ex02, ex04, ex07, ex08
from kvlab.views import Playground, Stepper, stepper
from kvlab.views._common import STATUS_CODE
from kvlab.views.block_pool import grid_shape
from kvlab.views.live import KERNEL_NOTE
from kvlab.views.text import caption


def same(a, b) -> bool:
    """Equality that treats numpy arrays (what the stepper sends) and lists alike, NaN as a gap."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, np.ndarray)) and isinstance(b, (list, tuple, np.ndarray)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    gap = (None, "")
    if (a in gap or (isinstance(a, float) and np.isnan(a))) and (
        b in gap or (isinstance(b, float) and np.isnan(b))
    ):
        return True
    return a == b


def assert_shows(st: Stepper, index: int) -> None:
    """Every figure of the stepper holds exactly the spec of step ``index``."""
    for v, live in enumerate(st.figures):
        spec = st.spec(v, index)
        fw = live.widget
        assert len(fw.data) == len(spec["data"])
        for trace, want in zip(fw.data, spec["data"], strict=True):
            for key, value in want.items():
                assert same(
                    trace[key] if not isinstance(value, dict) else trace[key].to_plotly_json(), value
                ), f"step {index}, trace {want.get('name')!r}, property {key!r} differs"
        assert fw.layout.title.text == spec["layout"]["title"]["text"]


@pytest.fixture(scope="module")
def example_7():
    return ex07.example_7().history


def test_setting_the_slider_updates_the_figures_to_that_snapshot(example_7) -> None:
    st = Stepper(example_7)
    titles = [f.widget.layout.title.text for f in st.figures]
    assert titles[0].startswith("<b>Step 0 of 7:") and titles[1].startswith("<b>Free queue · Step 0 of 7:")
    for index in (3, 6, 1, 7, 0, 5):
        st.slider.value = index
        assert_shows(st, index)
        state = example_7[index].state
        cols, _ = grid_shape(state.num_blocks)
        z = st.figures[0].widget.data[0].z
        assert [z[b // cols][b % cols] for b in range(state.num_blocks)] == [
            STATUS_CODE[b.status] for b in state.blocks
        ]
        queue = [t.split("</b>")[0][3:] for t in st.figures[1].widget.data[0].text[1] if t]
        assert queue == [str(b) for b in state.free_queue]
        assert caption(example_7[index]) in st.caption.value
    st.slider.value = 6
    assert 0 < st.figures[0].updates < 40  # only what changed is sent


def test_buttons_step_and_stop_at_the_ends(example_7) -> None:
    st = Stepper(example_7, "free_queue")
    assert st.back.disabled and not st.forward.disabled
    assert st.children[0].layout.flex_flow == "row wrap"  # the slider goes under the buttons when narrow
    st.forward.click()
    st.forward.click()
    assert st.index == 2
    assert_shows(st, 2)
    st.back.click()
    assert st.index == 1
    st.go_to(-1)
    assert st.index == len(example_7) - 1 and st.forward.disabled
    st.step(+5)
    assert st.index == len(example_7) - 1
    with pytest.raises(InvalidArgumentError):
        st.go_to(len(example_7))


def test_stepper_kinds_cover_every_model() -> None:
    cases = {
        "contiguous": ex01.example_1().exact_fit.history,
        "block_pool": ex04.example_4().history,
        "prefix_cache": ex07.example_7().history,
        "radix": ex08.example_8().history,
    }
    for kind, history in cases.items():
        st = stepper(history, kind)
        st.slider.value = len(history) - 1
        assert_shows(st, len(history) - 1)
    assert len(stepper(cases["prefix_cache"]).figures) == 2  # by default: pool and free queue


def test_stepper_with_a_custom_view_and_highlight() -> None:
    history = ex02.example_2().history
    st = Stepper(history, ["block_pool", lambda state, previous: {"data": [{"type": "bar", "y": [state.num_blocks]}],
                                                                  "layout": {"title": {"text": "custom"}}}],
                 highlight=("A", 36))  # fmt: skip
    st.slider.value = len(history) - 1
    assert "slot 9×16+4 = 148" in st.figures[0].widget.layout.title.text
    assert list(st.figures[1].widget.data[0].y) == [12]


@pytest.mark.parametrize("views", ["radix", ["nope"], [], 3])
def test_stepper_rejects_bad_views(example_7, views) -> None:
    with pytest.raises(InvalidArgumentError):
        Stepper(example_7, views)


def test_stepper_rejects_bad_histories() -> None:
    with pytest.raises(InvalidArgumentError):
        Stepper([])
    with pytest.raises(InvalidArgumentError):
        stepper(ex07.example_7().history, "pie")


# ---------------------------------------------------------------------- playground


def test_prefix_cache_playground_round_trips_through_the_replay_cli() -> None:
    pg = Playground(num_blocks=8, block_size=4)
    pg.allocate("A", 10, prefix=8)
    pg.allocate("B", 9, prefix=8, cache_salt=None)
    pg.append("A", 3)
    pg.free("A")
    pg.allocate("C", 12, prefix=8)  # hits A's cached prefix, evicts what it must
    pg.free("B")
    scenario = json.loads(pg.to_json())
    assert scenario["config"] == {"block_size": 4, "num_blocks": 8, "null_block": False, "hash": "lesson"}
    assert [op["op"] for op in scenario["ops"]] == ["alloc", "alloc", "append", "free", "alloc", "free"]
    assert scenario["ops"][0]["tokens"][:8] == scenario["ops"][1]["tokens"][:8] == list(range(1000, 1008))
    records = replay("prefix-cache", scenario["config"], scenario["ops"])
    assert len(records) == len(pg.ops) == len(pg.history) - 1
    for record, step in zip(records, pg.history.steps[1:], strict=True):
        state = step.state
        assert record["ok"]
        assert record["free_queue"] == list(state.free_queue)
        if record["op"] != "free":
            assert record["block_table"] == list(state.table(record["req"]))
            assert record["hit_block_ids"] == list(state.hit_block_ids)
            assert record["new_block_ids"] == list(state.new_block_ids)
            assert record["evicted"] == list(state.evicted_block_ids)
    assert records[4]["num_cached_tokens"] == 8  # C reused the two shared blocks A left cached
    again = Playground.from_scenario(pg.to_json())
    assert again.state == pg.state
    assert again.scenario() == pg.scenario()


def test_the_lesson_scenario_replays_in_the_playground() -> None:
    pg = Playground.from_scenario(ex07.example_7_scenario())
    assert list(pg.state.free_queue) == [5, 1, 0]
    queue = [t.split("</b>")[0][3:] for t in pg.queue_figure.widget.data[0].text[1] if t]
    assert queue == ["5", "1", "0"]


def test_playground_buttons_use_the_fields_and_update_the_figures() -> None:
    pg = Playground(num_blocks=6, block_size=4)
    pg.new_id_box.value, pg.tokens_box.value, pg.prefix_box.value = "A", 9, 8
    pg.buttons["allocate"].click()
    assert pg.message.value.count("✓") == 1
    assert pg.request_pick.options == ("A",) and pg.request_pick.value == "A"
    assert pg.new_id_box.value == "B"  # the next free id
    pg.buttons["allocate"].click()
    assert pg.state.hit_block_ids == pg.state.table("A")[:2]  # B shares A's two full prefix blocks
    assert "B · 9 tok" in pg.pool_figure.widget.layout.yaxis2.ticktext
    pg.request_pick.value = "A"
    pg.buttons["free"].click()
    assert [rid for rid, _ in pg.state.tables] == ["B"]
    pg.buttons["undo"].click()
    assert [rid for rid, _ in pg.state.tables] == ["A", "B"]
    pg.export_button.click()
    assert json.loads(pg.scenario_box.value) == pg.scenario()


@pytest.mark.parametrize("setup, expected", [
    (lambda pg: setattr(pg.new_id_box, "value", "A"), "already"),  # a duplicate id
    (lambda pg: setattr(pg.prefix_box, "value", 50), "shared prefix"),  # prefix longer than the request
])  # fmt: skip
def test_playground_shows_bad_input_as_a_message(setup, expected) -> None:
    pg = Playground(num_blocks=6, block_size=4)
    pg.allocate("A", 5)
    before = (pg.state, list(pg.ops))
    setup(pg)
    pg.buttons["allocate"].click()  # raises nothing into the notebook
    assert "✗" in pg.message.value and expected in pg.message.value
    assert (pg.state, pg.ops) == before


@pytest.mark.parametrize("salt", ["", "t1"])
def test_a_refused_allocation_is_recorded_and_replays_as_not_ok(salt) -> None:
    pg = Playground(num_blocks=6, block_size=4)
    pg.allocate("A", 5)
    before = pg.state
    pg.new_id_box.value, pg.tokens_box.value, pg.salt_box.value = "B", 500, salt  # more than the pool holds
    pg.buttons["allocate"].click()
    assert (
        "✗" in pg.message.value and "cannot allocate" in pg.message.value and "ok: false" in pg.message.value
    )
    assert pg.state == before and len(pg.history) == 2  # the pool is unchanged: no step
    assert [op["op"] for op in pg.ops] == ["alloc", "alloc"] and list(pg.refused) == [1]
    assert "refused" in pg.log()[1] and "refused" in pg.log_view.value
    assert pg.new_id_box.value == "C"  # B's id was used by the refused op
    assert pg.append("A", 3) and not pg.append("A", 100)  # a refused append is recorded too
    assert not pg.allocate("B", 500)
    assert pg.allocate("B", 4)  # the refused B left no request behind
    scenario = json.loads(pg.to_json())
    assert "model" not in scenario  # exactly the replay CLI's JSON
    records = replay("prefix-cache", scenario["config"], scenario["ops"])
    assert [r["ok"] for r in records] == [True, False, True, False, False, True]
    steps = iter(pg.history.steps[1:])
    for record in records:
        state = next(steps).state if record["ok"] else None
        if state is not None:
            assert record["free_queue"] == list(state.free_queue)
    again = Playground.from_scenario(pg.to_json())
    assert again.scenario() == pg.scenario() and again.refused.keys() == pg.refused.keys()
    assert again.state == pg.state and again.log() == pg.log()
    pg.undo()  # takes back the last op; the refusals before it stay
    assert list(pg.refused) == [1, 3, 4] and pg.state == again.history[-2].state


def test_playground_errors_from_every_button_are_messages() -> None:
    pg = Playground(num_blocks=4, block_size=4)
    for name in ("append", "free", "undo"):
        pg.buttons[name].click()
        assert "✗" in pg.message.value
    assert pg.buttons["fork"].disabled  # vLLM's prefix cache has no fork
    pg.scenario_box.value = "{not json"
    pg.replay_button.click()
    assert "not valid JSON" in pg.message.value
    pg.scenario_box.value = json.dumps(
        {"config": {"block_size": 4, "num_blocks": 4}, "ops": [{"op": "free", "req": "X"}]}
    )
    pg.replay_button.click()
    assert "op 0" in pg.message.value and pg.ops == []


def test_block_pool_playground_forks_and_copies_on_write() -> None:
    pg = Playground("block-pool", num_blocks=8, block_size=4)
    pg.allocate("A", 6)
    pg.fork("A", "B")
    pg.append("B", 1)  # B writes into the shared, partly filled last block: copy-on-write
    state = pg.state
    assert len(state.copied_blocks) == 1
    source, target = state.copied_blocks[0]
    assert state.table("A")[-1] == source and state.table("B")[-1] == target
    copied = [t for t in pg.pool_figure.widget.data if t.name == "copy-on-write target of this op"][0]
    assert any(x is not None and not np.isnan(x) for x in copied.x)
    again = Playground.from_scenario(pg.scenario(), model="block-pool")
    assert again.state == state
    with pytest.raises(ScenarioError):
        Playground.from_scenario(
            {k: v for k, v in pg.scenario().items() if k != "model"}
        )  # fork: not prefix-cache


def test_a_block_pool_scenario_says_it_cannot_go_through_the_replay_cli(tmp_path) -> None:
    pg = Playground("block-pool", num_blocks=3, block_size=4)
    pg.allocate("A", 6)
    pg.fork("A", "B")
    assert not pg.allocate("C", 40)  # refused: recorded
    pg.append("B", 1)  # copy-on-write
    scenario = pg.scenario()
    assert scenario["model"] == "block-pool" and [op["op"] for op in scenario["ops"]] == [
        "alloc",
        "fork",
        "alloc",
        "append",
    ]
    pg.export_button.click()
    assert "block-pool" in pg.message.value and "Playground.from_scenario" in pg.message.value
    assert json.loads(pg.scenario_box.value) == scenario
    again = Playground.from_scenario(pg.to_json())  # the model comes from the scenario
    assert again.model_name == "block-pool" and again.state == pg.state and again.refused.keys() == {2}
    with pytest.raises(ScenarioError, match="block-pool"):
        Playground.from_scenario(scenario, model="prefix-cache")
    with pytest.raises(ScenarioError, match="block-pool"):
        Playground(num_blocks=3, block_size=4).load(scenario)  # a prefix-cache playground says which model
    path = tmp_path / "scenario.json"
    path.write_text(pg.to_json())
    from kvlab.cli.replay import main

    assert (
        main(["prefix-cache", str(path)]) == 2
    )  # the replay CLI refuses it, with a message, not a traceback


def test_playground_rejects_bad_construction() -> None:
    for kwargs in (
        {"model": "slab"},
        {"num_blocks": 0},
        {"block_size": "4"},
        {"model": "block-pool", "null_block": True},
    ):
        with pytest.raises(InvalidArgumentError):
            Playground(**kwargs)


# ---------------------------------------------------------------------- the still copy for pages without a kernel

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _figure_json(page: str) -> list[dict]:
    """The figures a still copy draws, read back from its scripts."""
    return [json.loads(m.replace("<\\/", "</")) for m in re.findall(r"fig = (\{.*?\});\n", page, flags=re.S)]


def test_a_stepper_shows_its_steps_as_animations_without_a_kernel(example_7) -> None:
    st = Stepper(example_7)
    bundle = st._repr_mimebundle_()
    assert WIDGET_VIEW in bundle  # JupyterLab with a kernel draws the live widget
    page = bundle["text/html"]
    assert KERNEL_NOTE in page and page.count('class="plotly-graph-div"') == 2
    figures = _figure_json(page)
    assert [len(f["frames"]) for f in figures] == [len(example_7)] * 2
    last = figures[1]["frames"][-1]["data"]
    assert same(last, st.spec(1, len(example_7) - 1)["data"])  # each frame is the stepper's own step
    assert figures[0]["layout"]["sliders"][0]["steps"][-1]["label"] == str(len(example_7) - 1)


def test_a_long_history_shows_its_last_step_and_a_bad_budget_is_refused(example_7) -> None:
    st = Stepper(example_7, "free_queue")
    figures, which = st.still_figures(budget=1)
    assert len(figures) == 1 and not figures[0].frames and "last of its 8 steps" in which
    assert figures[0].layout.title.text == st.spec(0, -1)["layout"]["title"]["text"]
    for budget in (0, "big", 2.5):
        with pytest.raises(InvalidArgumentError):
            st.still_figures(budget=budget)


def test_a_still_copy_cannot_close_its_script() -> None:
    evil = "</script><script>alert(1)</script>"
    st = Stepper([1, 2], [lambda state, previous: {"data": [{"type": "bar", "y": [state]}],
                                                   "layout": {"title": {"text": evil}}}])  # fmt: skip
    page = st.still_html()
    assert evil not in page and page.count("</script>") == 1
    assert _figure_json(page)[0]["layout"]["title"]["text"] == evil


def test_a_playground_shows_its_state_and_operations_without_a_kernel() -> None:
    pg = Playground.from_scenario(ex07.example_7_scenario(block_size=4))
    bundle = pg._repr_mimebundle_()
    assert WIDGET_VIEW in bundle
    page = bundle["text/html"]
    assert KERNEL_NOTE in page and "after its 7 operations" in page
    pool, queue = _figure_json(page)
    for drawn, spec in ((pool, pg._pool_spec()), (queue, pg._queue_spec())):
        assert same(drawn["data"], spec["data"]) and drawn["layout"]["title"] == spec["layout"]["title"]
        assert isinstance(drawn["layout"]["template"], dict)  # written out: plotly.js knows no name
    assert "7. free C" in page
    pg.allocate("E", 4)
    assert "after its 8 operations" in pg.still_html() and "8. allocate E" in pg.still_html()
