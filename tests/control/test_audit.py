"""The control plane's audit trail as tables (issue 38 item 6): each command and each event
that matters gives one structured line, greppable by session and node; the observations that
repeat give none, and no line carries a credential."""

from __future__ import annotations

import logging

import pytest

from orchestrator.control.rules import events as ev
from orchestrator.control.rules.audit import command_line, event_lines
from orchestrator.control.rules.commands import AddNode, LaunchCluster, PrepareModel, ResumeSession, StopSession
from orchestrator.control.rules.state import NodePreparation, PostMortem, Preparation
from orchestrator.control.rules.transitions import apply
from tests.support.builders import MODEL, node
from tests.support.control_states import BASE, SERVING, prepared

PREPARING = BASE.model_copy(update={"preparation": prepared(False)})
NODE_PREP = NodePreparation(node_id="n1", status="present", source="node-a", detail="verified")


def text(line) -> str:
    level, name, fields = line
    return f"{logging.getLevelName(level)} {name} " + " ".join(f"{k}={v}" for k, v in fields.items())


COMMANDS = [
    ("launch accepted", BASE, LaunchCluster(MODEL, ("n0", "n1"), "s9", 1.0), "",
     "INFO command.accepted command=LaunchCluster model=smol nodes=node-a,node-b session=s9 context_length=4096 "
     "concurrency=4"),
    ("stop refused, with why", BASE, StopSession("s1"), "no live session 's1'",
     "WARNING command.refused command=StopSession session=s1 reason=no live session 's1'"),
    ("prepare", BASE, PrepareModel(MODEL, ("n1",)), "",
     "INFO command.accepted command=PrepareModel model=smol nodes=node-b"),
    ("a restart's look", SERVING, ResumeSession("s1", "running", "stage-0 ended", ("stage-0",), 1.0, ("stage-0",)), "",
     "INFO command.accepted command=ResumeSession session=s1 seen_phase=running problem=stage-0 ended "
     "culprits=stage-0 gone=stage-0"),
]


@pytest.mark.parametrize("state, command, refusal, expected", [r[1:] for r in COMMANDS], ids=[r[0] for r in COMMANDS])
def test_each_command_is_one_line_with_its_outcome(state, command, refusal, expected):
    assert text(command_line(state, command, refusal=refusal)) == expected


def test_a_node_added_is_logged_by_name_never_with_its_credential():
    line = text(command_line(BASE, AddNode(node("node-c", node_id="n2"))))
    assert "node=node-c" in line and "secret-credential" not in line, line


EVENTS = [
    ("a launch step, with its node", SERVING, ev.LaunchStepped(session_id="s1", key="stage-1.listen", state="done"),
     ["INFO launch.step session=s1 step=stage-1.listen node=node-b state=done"]),
    ("a failed recovery step", SERVING,
     ev.LaunchStepped(session_id="s1", key="recovery-2.3.coordinator.healthy", state="failed", detail="timed out"),
     ["WARNING recovery.step session=s1 fault=2 attempt=3 step=coordinator.healthy node=node-a state=failed "
      "detail=timed out"]),
    ("a relaunch", SERVING, ev.SessionFaulted(session_id="s1", reason="gone", processes=("stage-0", "coordinator"),
                                             relaunch=True),
     ["WARNING session.faulted session=s1 processes=stage-0,coordinator relaunch=True reason=gone"]),
    ("post-mortems, one per process", SERVING, ev.PostMortemRecorded(session_id="s1", post_mortems=(
        PostMortem(process="stage-1", node_name="node-b", ended="killed by SIGKILL"),)),
     ["INFO session.post_mortem session=s1 process=stage-1 node=node-b ended=killed by SIGKILL"]),
    ("a teardown's end", SERVING, ev.HealthChanged(session_id="s1", health="Stopped", phase="stopped",
                                                   reason="stopped by request"),
     ["INFO session.health session=s1 health=Stopped phase=stopped reason=stopped by request"]),
    ("prepare: a node's status", PREPARING, ev.PreparationProgressed(node=NODE_PREP),
     ["INFO prepare.node model=smol node=node-b status=present source=node-a detail=verified"]),
    ("prepare: progress within a status is not news",
     PREPARING.model_copy(update={"preparation": Preparation(model_id=MODEL, nodes=(NODE_PREP,))}),
     ev.PreparationProgressed(node=NODE_PREP.model_copy(update={"done_bytes": 5})), []),
    ("a session's observation repeats: no line", SERVING, ev.SessionObserved(session_id="s1", stage_status=()), []),
]


@pytest.mark.parametrize("state, event, expected", [r[1:] for r in EVENTS], ids=[r[0] for r in EVENTS])
def test_each_event_that_matters_is_one_line_greppable_by_session_and_node(state, event, expected):
    assert [text(line) for line in event_lines(state, apply(state, event), event)] == expected
