"""Choosing the node that takes a stage whose own node is gone, and recording the move (pure)."""

from __future__ import annotations

import tomllib
from functools import partial

import pytest

from orchestrator.agent.schemas import FileEntry, Manifest, ModelInfo
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.relocation import Move, choose_node, moved_toml, stage_bytes
from orchestrator.control.rules.session_toml import cluster_toml
from orchestrator.control.rules.state import Fault, Node, Session, Settings
from orchestrator.control.rules.timelines import recovery_steps, stage_moved
from tests.support import builders
from tests.support.builders import index_of
from tests.support.planner_inputs import uniform

MB = 1 << 20
SETTINGS = Settings(port_start=39600, port_end=39629)
DESCRIPTION = uniform(4, layer_bytes=100 * MB)
MANIFEST = Manifest(files={"model.safetensors": FileEntry(size=400 * MB, sha256="a" * 64)})
OTHER_MANIFEST = Manifest(files={"model.safetensors": FileEntry(size=400 * MB, sha256="b" * 64)})
MODEL = ModelInfo(id="tiny", mlx_format=True, supported=True, num_layers=4, manifest=MANIFEST, description=DESCRIPTION)
# a node of these tables: the builders' node holding MODEL unless a case says otherwise
peer = partial(builders.node, models=(MODEL,))


def _two_stages() -> Session:
    s = builders.session(phase="launching", name="tiny-2stage", model="tiny", splits=((0, 1), (2, 3)), port=39600,
                         coordinator_port=39601)
    return s.model_copy(update={"config_toml": cluster_toml(s)})


SESSION = _two_stages()  # MODEL's 4 layers: 0-1 on node-a, 2-3 on node-b, with its cluster TOML


NEED_MB = stage_bytes(MODEL, SESSION.stages[1], "") // MB + 1  # what stage 1 needs, rounded up


@pytest.mark.parametrize("nodes, expected", [
    # a spare node with the model and room takes it
    ([peer("node-a"), peer("node-b"), peer("node-c")], "node-c"),
    # outside the session before the session's own nodes, even with less memory
    ([peer("node-a", 90000 * MB), peer("node-b"), peer("node-c", NEED_MB * MB)], "node-c"),
    # among spare nodes, the one with the most free memory
    ([peer("node-a"), peer("node-b"), peer("node-c", NEED_MB * MB), peer("node-d", NEED_MB * 2 * MB)], "node-d"),
    # no spare node fits: a node of the session whose free memory fits it
    ([peer("node-a", NEED_MB * MB), peer("node-b"), peer("node-c", (NEED_MB - 2) * MB)], "node-a"),
    # spare nodes that cannot: unreachable, without the model and the disk for a copy, other
    # weights and no room, no port
    ([peer("node-a", MB), peer("node-b"), peer("node-c", reachable=False), peer("node-d", models=(), disk=0),
      peer("node-e", MB, models=(MODEL.model_copy(update={"manifest": OTHER_MANIFEST}),)), peer("node-f", ports=())],
     "no registered node can take stage 1 (layers 2–3"),
    # holds the model vs can get it: a holder with room wins over a spare node that would copy
    ([peer("node-a", NEED_MB * MB), peer("node-b"), peer("node-c", 90000 * MB, models=())], "node-a"),
    # can get it: no holder has room, a spare node with room and disk copies it from node-a
    ([peer("node-a", MB), peer("node-b"), peer("node-c", models=())], "node-c copying from node-a"),
    # other weights of the same name are replaced by a copy too
    ([peer("node-a", MB), peer("node-b"),
      peer("node-c", models=(MODEL.model_copy(update={"manifest": OTHER_MANIFEST}),))], "node-c copying from node-a"),
    # can get it but no room: memory
    ([peer("node-a", MB), peer("node-b"), peer("node-c", (NEED_MB - 2) * MB, models=())], "node-c: "),
    # can get it but no disk for the copy
    ([peer("node-a", MB), peer("node-b"), peer("node-c", models=(), disk=MB)],
     "node-c: does not hold tiny, and its 1.0 MiB of free disk cannot take a copy (400 MiB)"),
    # nowhere to copy from: the failed node held it, the other holder is unreachable
    ([peer("node-a", models=(), reachable=False), peer("node-b"), peer("node-c", models=())],
     "node-c: does not hold tiny, and no reachable node holds it to copy from"),
    # the failed node itself, even if its last report looks fine, is never chosen
    ([peer("node-b")], "node-b: the stage's own node (its agent is unreachable)"),
])
def test_choose_node(nodes: list[Node], expected: str) -> None:
    choice = choose_node(SESSION, 1, nodes, MODEL, SETTINGS, failed="n1")
    if isinstance(choice, Move):
        name, _, source = expected.partition(" copying from ")
        assert choice.node_name == name and choice.index == 1
        assert SETTINGS.port_start <= choice.port <= SETTINGS.port_end
        assert choice.sources == ((f"n{index_of(source)}",) if source else ()) and choice.copies == bool(source)
    else:
        assert expected in choice, choice


def test_a_refusal_says_why_for_every_node() -> None:
    nodes = [peer("node-a", MB), peer("node-b"), peer("node-c", reachable=False), peer("node-d", models=(), disk=0),
             peer("node-e", MB, models=(MODEL.model_copy(update={"manifest": OTHER_MANIFEST}),)),
             peer("node-f", ports=())]
    why = choose_node(SESSION, 1, nodes, MODEL, SETTINGS, failed="n1")
    assert isinstance(why, str)
    for part in ("node-a: 1.0 MiB free, the stage needs", "node-b: the stage's own node", "node-c: unreachable",
                 "node-d: does not hold tiny, and its 0 B of free disk", "node-e: 1.0 MiB free, the stage needs",
                 "node-f: no free transport port"):
        assert part in why, why


def test_a_port_the_session_already_uses_on_that_node_is_not_reused() -> None:
    choice = choose_node(SESSION, 1, [peer("node-a", ports=(39600, 39601, 39602))], MODEL, SETTINGS, "n1")
    assert isinstance(choice, Move) and choice.port == 39602  # 39600: stage 0, 39601: the coordinator


def test_the_need_counts_the_kv_cache_the_session_was_planned_for() -> None:
    s = SESSION
    small = stage_bytes(MODEL, s.stages[1], s.config_toml.replace("[cluster]", "[cluster]\ncontext_length = 1024"))
    large = stage_bytes(MODEL, s.stages[1], s.config_toml.replace("[cluster]", "[cluster]\ncontext_length = 65536"))
    assert small is not None and large is not None and small < large
    assert small >= 2 * 100 * MB  # at least its two layers' weights


def test_moved_toml_changes_only_that_stage_address() -> None:
    s = SESSION
    move = Move(index=1, node_id="n2", node_name="node-c", host="10.0.0.9", port=39605)
    before, after = tomllib.loads(s.config_toml), tomllib.loads(moved_toml(s.config_toml, move))
    assert [n for n in after["nodes"] if n["id"] == "stage-1"][0]["address"] == "10.0.0.9:39605"
    assert [n for n in after["nodes"] if n["id"] != "stage-1"] == [n for n in before["nodes"] if n["id"] != "stage-1"]
    assert after["cluster"] == before["cluster"]


def test_the_move_is_recorded_in_the_session_and_its_timeline() -> None:
    s = SESSION
    s = s.model_copy(update={"phase": "recovering", "recovery_attempt": 1,
                             "faults": (Fault(at=1.0, reason="agent unreachable", processes=("stage-1",),
                                              outcome="recovering", attempts=1),)})
    s = s.model_copy(update={"timeline": recovery_steps(s, ("stage-1",), 1, 1)})
    move = Move(index=1, node_id="n2", node_name="node-c", host="10.0.0.9", port=39605)
    moved = stage_moved(s, ev.StageMoved(session_id=s.id, stage=move.placement(s.stages[1]),
                                         config_toml=moved_toml(s.config_toml, move), reason="node-b: unreachable"))
    assert moved.stages[1].node_name == "node-c" and moved.stages[1].port == 39605
    assert moved.stages[1].first_layer == 2 and moved.stages[0] == s.stages[0]
    assert "10.0.0.9:39605" in moved.config_toml and "n1" not in moved.node_ids
    keys = [st.key for st in moved.timeline]
    assert keys.index("recovery-1.1.stage-1.move") == keys.index("recovery-1.1.stage-1.stop") + 1
    assert keys.index("recovery-1.1.stage-1.route") == keys.index("recovery-1.1.stage-1.listen") + 1
    step = {st.key: st for st in moved.timeline}
    assert "stage 1 moved to node-c" in step["recovery-1.1.stage-1.move"].label
    assert step["recovery-1.1.stage-1.move"].state == "done"
    assert "node-c" in step["recovery-1.1.stage-1.start"].label
    assert moved.faults == s.faults  # the fault stays in the history as it was


def test_a_copy_before_the_move_is_a_step_of_the_attempt_with_its_progress() -> None:
    from orchestrator.control.rules.timelines import copy_started, progress_detail

    s = SESSION
    s = s.model_copy(update={"phase": "recovering", "recovery_attempt": 2,
                             "faults": (Fault(at=1.0, reason="agent unreachable", processes=("stage-1",),
                                              outcome="recovering", attempts=2),)})
    s = s.model_copy(update={"timeline": recovery_steps(s, ("stage-1",), 1, 2)})
    copying = copy_started(s, ev.StageCopyStarted(session_id=s.id, index=1, model_id="tiny", node_name="node-c",
                                                  sources=("node-a",), total_bytes=400 * MB))
    assert copy_started(copying, ev.StageCopyStarted(session_id=s.id, index=1, model_id="tiny", node_name="node-c",
                                                     sources=("node-a",), total_bytes=400 * MB)) == copying  # once
    step = {st.key: st for st in copying.timeline}["recovery-1.2.stage-1.copy"]
    assert "tiny copied to node-c over the LAN from node-a" in step.label and step.state == "running"
    assert step.detail == "0 B of 400 MiB (0 %)"
    move = Move(index=1, node_id="n2", node_name="node-c", host="10.0.0.3", port=39605, sources=("n0",))
    moved = stage_moved(copying, ev.StageMoved(session_id=s.id, stage=move.placement(s.stages[1]),
                                               config_toml=moved_toml(s.config_toml, move), reason="node-b: gone"))
    keys = [st.key for st in moved.timeline]
    p = "recovery-1.2.stage-1."
    assert keys.index(p + "copy") == keys.index(p + "stop") + 1 and keys.index(p + "move") == keys.index(p + "copy") + 1
    assert progress_detail(100 * MB, 400 * MB, 2 * MB) == "100 MiB of 400 MiB (25 %), 2.0 MiB/s"
    assert progress_detail(0, 0) == "0 B of 0 B (0 %)"
