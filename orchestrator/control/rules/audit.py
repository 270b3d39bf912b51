"""What the control plane writes to its log for each command and each applied event (pure).

An admin reading the dashboard's log must find every command and its outcome — prepare per
node, each launch step, stop, each recovery step, re-adoption, relaunch, teardown — as one
structured line each (`orchestrator/logs.py`: a dotted name, then key=value fields), greppable
by `session=<id>` and `node=<name>`. These functions only word the lines; `core.Orchestrator`
writes them. Observations that repeat twice a second (a node's report, a session's look) and
download progress are left out: they would bury the lines that matter.

Fields never carry a credential, a token or a secret: a command's fields are read by name
from an allow list, never dumped whole.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

from orchestrator.control.rules import events as ev
from orchestrator.control.rules.state import State
from orchestrator.planner import Refusal

Line = tuple[int, str, dict[str, object]]  # level, dotted name, fields

QUIET = frozenset({"node_reported", "session_observed", "node_discovered", "node_vanished"})
# A command's fields that may be logged, as they are named there -> the field in the line
COMMAND_FIELDS = {"session_id": "session", "model_id": "model", "context_length": "context_length",
                  "concurrency": "concurrency", "draft_model": "draft_model", "seen_phase": "seen_phase",
                  "problem": "problem", "culprits": "culprits", "gone": "gone", "revision": "revision"}
_RECOVERY_KEY = re.compile(r"^recovery-(\d+)\.(\d+)\.(.+)$")


def node_name(state: State, node_id: str) -> str:
    """A node's name for a log line (its id's start when it is not registered)."""
    node = state.node(node_id)
    return node.name if node is not None else node_id[:12]


def command_line(state: State, command: Any, refusal: str = "", error: str = "") -> Line:
    """The line of one decided command: accepted, refused (with the reason) or failed (a bug)."""
    fields: dict[str, object] = {"command": type(command).__name__}
    for f in dataclasses.fields(command):
        value = getattr(command, f.name)
        if f.name == "session":  # a placed session: its id and nodes
            fields["session"] = value.id
            fields["nodes"] = ",".join(st.node_name for st in value.stages)
        elif f.name == "node":  # AddNode: the paired node (its credential is never logged)
            fields["node"], fields["url"] = value.name, value.url
        elif f.name == "node_id":
            fields["node"] = node_name(state, value)
        elif f.name == "node_ids":
            fields["nodes"] = ",".join(node_name(state, n) for n in value)
        elif f.name in COMMAND_FIELDS and value not in (None, "", ()):
            fields[COMMAND_FIELDS[f.name]] = ",".join(value) if isinstance(value, tuple) else value
    if error:
        return logging.ERROR, "command.failed", {**fields, "error": error}
    if refusal:
        return logging.WARNING, "command.refused", {**fields, "reason": refusal}
    return logging.INFO, "command.accepted", fields


def _process_node(state: State, session_id: str, process: str) -> str:
    """The node a session's process ("stage-1", "coordinator") runs on, by name ("" unknown)."""
    s = state.session(session_id)
    if s is None:
        return ""
    if process == "coordinator":
        return node_name(state, s.coordinator_node)
    m = re.match(r"^stage-(\d+)$", process)
    if m and int(m.group(1)) < len(s.stages):
        return s.stages[int(m.group(1))].node_name
    return ""


def _step_line(state: State, e: ev.LaunchStepped) -> Line:
    m = _RECOVERY_KEY.match(e.key)
    step = m.group(3) if m else e.key
    fields: dict[str, object] = {"session": e.session_id}
    if m:
        fields.update(fault=int(m.group(1)), attempt=int(m.group(2)))
    fields["step"] = step
    node = _process_node(state, e.session_id, step.split(".", 1)[0])
    if node:
        fields["node"] = node
    fields["state"] = e.state
    if e.detail:
        fields["detail"] = e.detail
    level = logging.WARNING if e.state == "failed" else logging.INFO
    return level, "recovery.step" if m else "launch.step", fields


def event_lines(old: State, new: State, event: ev.Event) -> list[Line]:
    """The lines of one applied event (none for the observations that repeat)."""
    if event.kind in QUIET or event.kind.startswith("model_download_progress"):
        return []
    info, warn = logging.INFO, logging.WARNING
    match event:
        case ev.LaunchStepped():
            return [_step_line(new, event)]
        case ev.SessionCreated(session=s):
            return [(info, "session.created", {"session": s.id, "name": s.name, "model": s.model_id,
                                               "nodes": ",".join(st.node_name for st in s.stages),
                                               "coordinator": node_name(new, s.coordinator_node)})]
        case ev.SessionFaulted(session_id=sid):
            return [(warn, "session.faulted", {"session": sid, "processes": ",".join(event.processes) or "none",
                                               "relaunch": event.relaunch, "reason": event.reason})]
        case ev.PostMortemRecorded(session_id=sid):
            return [(info, "session.post_mortem", {"session": sid, "process": p.process, "node": p.node_name,
                                                   "ended": p.ended}) for p in event.post_mortems]
        case ev.StageMoved(session_id=sid):
            before = old.session(sid)
            was = before.stages[event.stage.index].node_name if before and event.stage.index < len(before.stages) \
                else "?"
            return [(warn, "session.stage_moved", {"session": sid, "stage": event.stage.index,
                                                   "node": event.stage.node_name, "from": was,
                                                   "reason": event.reason})]
        case ev.RecoveryFailed(session_id=sid):
            return [(warn, "session.recovery_failed", {"session": sid, "final": event.final, "reason": event.reason})]
        case ev.SessionRecovered(session_id=sid):
            s = new.session(sid)
            return [(info, "session.recovered", {"session": sid, "seconds": round(event.seconds, 2),
                                                 "reason": s.reason if s else ""})]
        case ev.RequestsResumed(session_id=sid, resumed=r):
            return [(warn if r.lost else info, "session.requests_resumed",
                     {"session": sid, "fault": event.fault, "held": r.held, "resumed": r.resumed, "lost": r.lost,
                      "seconds": r.seconds})]
        case ev.HealthChanged(session_id=sid):
            return [(info if event.health != "Unhealthy" else warn, "session.health",
                     {"session": sid, "health": event.health, "phase": event.phase, "reason": event.reason})]
        case ev.SessionRemoved(session_id=sid):
            ended = next((s for s in reversed(new.history) if s.id == sid), None)
            return [(info, "session.removed", {"session": sid, "health": ended.health if ended else "?",
                                               "reason": event.reason})]
        case ev.LaunchEnded(session_id=sid):
            ended = next((s for s in reversed(new.history) if s.id == sid), None)
            return [(warn, "launch.ended", {"session": sid, "cancelled": event.cancelled,
                                            "reason": ended.reason if ended else ""})]
        case ev.SessionRegistered(session_id=sid):
            return [(info, "session.router_entry", {"session": sid, "registered": event.registered})]
        case ev.PreparationStarted(preparation=p):
            return [(info, "prepare.started", {"model": p.model_id,
                                               "nodes": ",".join(node_name(new, n.node_id) for n in p.nodes)})]
        case ev.PreparationProgressed(node=n):
            was = next((x for x in old.preparation.nodes if x.node_id == n.node_id), None) \
                if old.preparation else None
            if was is not None and was.status == n.status:
                return []  # progress within one status: the bytes, not news
            model = new.preparation.model_id if new.preparation else ""
            return [(warn if n.status == "mismatch" else info, "prepare.node",
                     {"model": model, "node": node_name(new, n.node_id), "status": n.status,
                      "source": n.source or "-", "detail": n.detail or "-"})]
        case ev.PreparationFinished():
            return [(warn if event.error else info, "prepare.finished",
                     {"model": event.model_id, "outcome": event.error or "ok"})]
        case ev.NodeRegistered(node=n):
            return [(info, "node.registered", {"node": n.name, "url": n.url})]
        case ev.NodeRemoved(node_id=nid):
            return [(info, "node.removed", {"node": node_name(old, nid)})]
        case ev.NodeUnreachable(node_id=nid):
            was = old.node(nid)
            if was is not None and was.error == event.error:
                return []  # still unreachable for the same reason: said once
            return [(warn, "node.unreachable", {"node": node_name(new, nid), "error": event.error})]
        case ev.PlanPreviewed(plan=p):
            verdict = "; ".join(r.message for r in p.result.reasons) if isinstance(p.result, Refusal) else "fits"
            return [(info, "plan.previewed", {"model": p.model_id, "nodes": ",".join(
                node_name(new, n) for n in p.node_ids), "outcome": verdict})]
    fields: dict[str, object] = {}
    for name in ("session_id", "model_id", "node_id"):
        value = getattr(event, name, None)
        if value:
            fields[name.removesuffix("_id")] = node_name(new, value) if name == "node_id" else value
    return [(info, f"event.{event.kind}", fields)]
