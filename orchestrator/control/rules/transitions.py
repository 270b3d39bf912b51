"""How events change the state: one pure function, `apply(state, event) -> state`."""

from __future__ import annotations

from orchestrator.control.rules import events as ev
from orchestrator.control.rules import verification
from orchestrator.control.rules.download_events import (
    DownloadsCleared,
    ModelDeletionFinished,
    ModelDeletionStarted,
    ModelDownloadFinished,
    ModelDownloadListed,
    ModelDownloadProgressed,
    ModelDownloadStarted,
    apply_download,
)
from orchestrator.control.rules.state import SAMPLES, CopyCheck, Fault, Node, Preparation, Session, Settings, State
from orchestrator.control.rules.timelines import copy_started, recovery_steps, resumed_step, stage_moved
from orchestrator.control.rules.timing_events import LayerTimingChanged, apply_timing

HISTORY = 5  # ended sessions kept for the monitor
FAULTS = 20  # faults kept per session (each with its post-mortems)
RECOVERY_STEPS = 40  # recovery steps kept in a timeline, after the launch's own


def _with_steps(s: Session, steps: tuple) -> tuple:
    """The timeline plus `steps`, keeping the launch's steps and the newest recovery steps."""
    launch = tuple(st for st in s.timeline if not st.key.startswith("recovery-"))
    recovery = tuple(st for st in s.timeline if st.key.startswith("recovery-")) + tuple(steps)
    return launch + recovery[-RECOVERY_STEPS:]


def _last_fault(s: Session, **changes: object) -> tuple[Fault, ...]:
    if not s.faults:
        return s.faults
    return s.faults[:-1] + (s.faults[-1].model_copy(update=changes),)


def _faulted(s: Session, e: ev.SessionFaulted, settings: Settings) -> Session:
    """Running -> recovering (replace the named processes) or stopping (torn down as before)."""
    recover = settings.auto_restart and bool(e.processes)
    fault = Fault(at=e.at, reason=e.reason, processes=e.processes, outcome="recovering" if recover else "stopped",
                  attempts=1 if recover else 0, relaunch=e.relaunch)
    s = s.model_copy(update={"faults": (s.faults + (fault,))[-FAULTS:]})
    if not recover:
        why = "" if e.processes else " (no single process to replace)"
        why = why if settings.auto_restart else " (automatic restarts are off)"
        return s.model_copy(update={"health": "Unhealthy", "phase": "stopping", "reason": e.reason + why})
    steps = recovery_steps(s, e.processes, len(s.faults), 1, relaunch=e.relaunch)
    doing = "relaunching the whole session under the same plan" if e.relaunch else \
        f"restarting {', '.join(e.processes)}"
    return s.model_copy(update={"health": "Unhealthy", "phase": "recovering", "recovery_attempt": 1,
                                "timeline": _with_steps(s, steps),
                                "reason": f"{e.reason}: {doing} (attempt 1 of {settings.restart_attempts})"})


def _recovery_failed(s: Session, e: ev.RecoveryFailed, settings: Settings) -> Session:
    """Another attempt (its steps appended) or, past the limit, stopping."""
    attempt = s.recovery_attempt + 1
    processes = s.faults[-1].processes if s.faults else ()
    if e.final or attempt > settings.restart_attempts or not processes:
        return s.model_copy(update={
            "phase": "stopping", "health": "Unhealthy", "recovery_attempt": 0,
            "faults": _last_fault(s, outcome="stopped"),
            "reason": f"recovery failed after {s.recovery_attempt} attempt(s): {e.reason}"})
    steps = recovery_steps(s, processes, len(s.faults), attempt, relaunch=s.faults[-1].relaunch)
    return s.model_copy(update={"recovery_attempt": attempt, "timeline": _with_steps(s, steps),
                                "faults": _last_fault(s, attempts=attempt),
                                "reason": f"recovery attempt {attempt - 1} failed ({e.reason}): restarting "
                                          f"{', '.join(processes)} (attempt {attempt} of {settings.restart_attempts})"})


def _recovered(s: Session, e: ev.SessionRecovered) -> Session:
    processes = ", ".join(s.faults[-1].processes) if s.faults else "the faulted process"
    done = f"relaunched after a dashboard restart: {processes} started again under the same plan" \
        if s.faults and s.faults[-1].relaunch else f"recovered: {processes} replaced"
    return s.model_copy(update={"phase": "running", "health": "Healthy", "recovery_attempt": 0,
                                "faults": _last_fault(s, outcome="recovered", recovery_s=round(e.seconds, 2)),
                                "reason": f"{done} in {e.seconds:.1f} s" + (f" ({e.detail})" if e.detail else "")})


def _requests_resumed(s: Session, e: ev.RequestsResumed) -> Session:
    """The fault seen at `e.fault_at` gains what became of the answers held during its recovery, and
    the recovery a step saying so; an unknown fault, one that has them already, or a pause another
    fault reported changes nothing."""
    fault = next((f for f in s.faults if f.at == e.fault_at), None)
    if fault is None or fault.resumed is not None or \
            any(f.resumed is not None and f.resumed.pause == e.resumed.pause for f in s.faults):
        return s
    faults = tuple(f.model_copy(update={"resumed": e.resumed}) if f is fault else f for f in s.faults)
    return s.model_copy(update={"faults": faults, "timeline": _with_steps(s, (resumed_step(e.fault, e.resumed),))})


def _replace_node(state: State, node_id: str, **changes: object) -> State:
    return state.model_copy(update={"nodes": tuple(
        n.model_copy(update=changes) if n.id == node_id else n for n in state.nodes)})


def _replace_session(state: State, session_id: str, fn) -> State:
    if not any(s.id == session_id for s in state.sessions + state.history):
        return state  # an event about a session nobody knows changes nothing (and bumps no version)
    return state.model_copy(update={"sessions": tuple(fn(s) if s.id == session_id else s for s in state.sessions),
                                    "history": tuple(fn(s) if s.id == session_id else s for s in state.history)})


def _step(session: Session, key: str, step_state: str, detail: str) -> Session:
    steps = tuple(st.model_copy(update={"state": step_state, "detail": detail or st.detail}) if st.key == key else st
                  for st in session.timeline)
    return session.model_copy(update={"timeline": steps})


def _observed(session: Session, e: ev.SessionObserved) -> Session:
    """A session after a look: its stage status, and the sample appended (the last SAMPLES kept)."""
    update: dict[str, object] = {"stage_status": e.stage_status}
    if e.sample is not None:
        update["samples"] = (session.samples + (e.sample,))[-SAMPLES:]
    return session.model_copy(update=update)


def apply(state: State, event: ev.Event) -> State:
    """The state after `event`; events about unknown nodes or sessions change nothing."""
    new = _apply(state, event)
    return new.model_copy(update={"version": state.version + 1}) if new is not state else state


def _apply(state: State, event: ev.Event) -> State:
    match event:
        case ModelDownloadProgressed(model_id=model_id, node=node) if node.status == "verified":
            # verified on arrival (hub sha256, or the first node's files over the LAN)
            return verification.record(apply_download(state, event), model_id, node.node_id,
                                       "downloaded from the hub, then verified" if node.source.startswith("hub")
                                       else f"copied over the {node.source or 'LAN'}, then verified")
        case ModelDeletionFinished(model_id=model_id, node_id=node_id, error=error):
            new = apply_download(state, event)
            return new if error else verification.forget(new, model_id, node_id)
        case (ModelDownloadStarted() | ModelDownloadProgressed() | ModelDownloadListed() | ModelDownloadFinished()
              | ModelDeletionStarted() | DownloadsCleared()):
            return apply_download(state, event)  # the Models tab's downloads and deletions: their own module
        case LayerTimingChanged():
            return apply_timing(state, event)
        case ev.CopyCheckStarted(model_id=model_id, node_id=node_id):
            others = tuple(c for c in state.checks if (c.model_id, c.node_id) != (model_id, node_id))
            return state.model_copy(update={"checks": others + (CopyCheck(model_id=model_id, node_id=node_id),)})
        case ev.CopyCheckFinished(model_id=model_id, node_id=node_id, ok=ok, message=message):
            others = tuple(c for c in state.checks if (c.model_id, c.node_id) != (model_id, node_id))
            check = CopyCheck(model_id=model_id, node_id=node_id, phase="verified" if ok else "failed", message=message)
            new = state.model_copy(update={"checks": others + (check,)})
            return (verification.record(new, model_id, node_id, message or "checked by Verify") if ok
                    else verification.forget(new, model_id, node_id))
        case ev.SettingsChanged(settings=settings):
            return state.model_copy(update={"settings": settings})
        case ev.NodeRegistered(node=node):
            others = tuple(n for n in state.nodes if n.id != node.id)
            discovered = tuple(d for d in state.discovered if d.fingerprint != node.id)
            return state.model_copy(update={"nodes": others + (node,), "discovered": discovered})
        case ev.NodeRemoved(node_id=node_id):
            gone = verification.forget(state, None, node_id)
            return gone.model_copy(update={"nodes": tuple(n for n in state.nodes if n.id != node_id)})
        case ev.NodeReported(node_id=node_id, report=report, at=at):
            if state.node(node_id) is None:
                return state
            return verification.reconcile(_replace_node(state, node_id, report=report, status="reachable", error=None,
                                                        last_seen=at, name=report.name), node_id)
        case ev.NodeUnreachable(node_id=node_id, error=error):
            node = state.node(node_id)
            if node is None or (node.status == "unreachable" and node.error == error):
                return state
            return _replace_node(state, node_id, status="unreachable", error=error)
        case ev.NodeDiscovered(node=seen):
            if state.node(seen.fingerprint) is not None or seen in state.discovered:
                return state
            others = tuple(d for d in state.discovered if d.fingerprint != seen.fingerprint)
            return state.model_copy(update={"discovered": others + (seen,)})
        case ev.NodeVanished(fingerprint=fingerprint):
            kept = tuple(d for d in state.discovered if d.fingerprint != fingerprint)
            return state if len(kept) == len(state.discovered) else state.model_copy(update={"discovered": kept})
        case ev.PlanPreviewed(plan=plan):
            return state.model_copy(update={"plan": plan})
        case ev.PreparationStarted(preparation=preparation):
            return state.model_copy(update={"preparation": preparation})
        case ev.PreparationProgressed(node=node):
            prep = state.preparation
            if prep is None:
                return state
            nodes = tuple(node if n.node_id == node.node_id else n for n in prep.nodes)
            new = state.model_copy(update={"preparation": prep.model_copy(update={"nodes": nodes})})
            if node.status != "present":
                return new
            # Present: its files matched the reference copy's manifest, sha256 by sha256
            how = (f"downloaded from the {node.source}, then verified" if node.source.startswith("hub ")
                   else f"copied over the LAN from {node.source}, then verified" if node.source
                   else "checked by Prepare against the reference copy")
            return verification.record(new, prep.model_id, node.node_id, how)
        case ev.PreparationFinished(model_id=model_id, error=error):
            prep = state.preparation
            if prep is None or prep.model_id != model_id:
                return state
            return state.model_copy(update={"preparation": prep.model_copy(update={"finished": True, "error": error})})
        case ev.SessionCreated(session=session):
            return state.model_copy(update={"sessions": tuple(s for s in state.sessions if s.id != session.id)
                                            + (session,)})
        case ev.LaunchStepped(session_id=sid, key=key, state=step_state, detail=detail):
            return _replace_session(state, sid, lambda s: _step(s, key, step_state, detail))
        case ev.SessionRegistered(session_id=sid, registered=registered):
            return _replace_session(state, sid, lambda s: s.model_copy(update={"registered": registered}))
        case ev.SessionObserved(session_id=sid):
            if state.session(sid) is None:
                return state
            return _replace_session(state, sid, lambda s: _observed(s, event))
        case ev.SessionFaulted(session_id=sid):
            s = state.session(sid)
            if s is None or s.phase != "running":
                return state  # already being recovered or stopped: the first fault is the reason shown
            return _replace_session(state, sid, lambda s: _faulted(s, event, state.settings))
        case ev.PostMortemRecorded(session_id=sid, post_mortems=post_mortems):
            s = state.session(sid)
            if s is None or not s.faults:
                return state
            return _replace_session(state, sid, lambda s: s.model_copy(update={"faults": _last_fault(
                s, post_mortems=s.faults[-1].post_mortems + post_mortems)}))
        case ev.StageMoved(session_id=sid):
            s = state.session(sid)
            if s is None or s.phase != "recovering":
                return state
            return _replace_session(state, sid, lambda s: stage_moved(s, event))
        case ev.StageCopyStarted(session_id=sid):
            s = state.session(sid)
            if s is None or s.phase != "recovering":
                return state
            return _replace_session(state, sid, lambda s: copy_started(s, event))
        case ev.RecoveryFailed(session_id=sid):
            s = state.session(sid)
            if s is None or s.phase != "recovering":
                return state
            return _replace_session(state, sid, lambda s: _recovery_failed(s, event, state.settings))
        case ev.SessionRecovered(session_id=sid):
            s = state.session(sid)
            if s is None or s.phase != "recovering":
                return state
            return _replace_session(state, sid, lambda s: _recovered(s, event))
        case ev.RequestsResumed(session_id=sid):
            return _replace_session(state, sid, lambda s: _requests_resumed(s, event))
        case ev.HealthChanged(session_id=sid, health=health, phase=phase, reason=reason):
            return _replace_session(state, sid, lambda s: s.model_copy(
                update={"health": health, "phase": phase, "reason": reason}))
        case ev.SessionRemoved(session_id=sid, reason=reason):
            return _ended(state, sid, lambda s: s.model_copy(update={"reason": reason or s.reason}))
        case ev.LaunchEnded(session_id=sid, cancelled=cancelled):
            return _ended(state, sid, lambda s: s.model_copy(update={
                "health": "Stopped", "phase": "failed", "reason": launch_failure(s, cancelled)}))
    return state


def _ended(state: State, session_id: str, fn) -> State:
    """`fn` of the live session moved to the history (unknown sessions change nothing)."""
    gone = [s for s in state.sessions if s.id == session_id]
    if not gone:
        return state
    return state.model_copy(update={"sessions": tuple(s for s in state.sessions if s.id != session_id),
                                    "history": (state.history + (fn(gone[0]),))[-HISTORY:]})


def launch_failure(s: Session, cancelled: bool) -> str:
    """Why a launch ended without serving, from its timeline: the step that failed and its detail."""
    if cancelled:
        return "launch cancelled"
    failed = next((st for st in s.timeline if st.state == "failed"), None)
    return f"launch failed at “{failed.label}”: {failed.detail}" if failed else "launch failed"


def serving_node_ids(state: State) -> set[str]:
    """Nodes that a live session runs on (they cannot be removed)."""
    return {nid for s in state.sessions for nid in s.node_ids}


__all__ = ["Node", "Preparation", "apply", "serving_node_ids"]
