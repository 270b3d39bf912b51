"""Every rule of the control plane, as pure functions: no I/O, no clock, no threads.

`decide(state, command)` answers a command (`commands.py`) with a `Decision`: the events to
apply (in order) and the effects to run afterwards — or raises `CommandRefused`, and then
nothing changes. `react(old, new, event)` gives the effects that follow from an applied
event (a fault starts a recovery attempt or the teardown). Effects are frozen values naming
I/O for `effects.EffectRunner`, the one place that does it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from orchestrator.control.rules import events as ev
from orchestrator.control.rules.commands import (
    AddNode,
    CancelDownload,
    ClearDownloads,
    Command,
    CommandRefused,
    DeleteModel,
    DownloadModel,
    LaunchCluster,
    LaunchSession,
    LaunchSingle,
    PrepareModel,
    PreviewPlan,
    RemoveNode,
    ResumeDownload,
    ResumeSession,
    Split,
    StopSession,
    UpdateSettings,
    VerifyCopy,
)
from orchestrator.control.rules.download_events import DownloadsCleared
from orchestrator.control.rules.measured import lacking
from orchestrator.control.rules.model_rules import (
    ModelEffect,
    decide_cancel,
    decide_delete,
    decide_download,
    decide_resume,
    decide_verify,
    deletion_conflict,
)
from orchestrator.control.rules.planning import (
    PlanningError,
    plan_for,
    plan_settings,
    session_from_plan,
    session_name,
    single_session,
)
from orchestrator.control.rules.state import Health, PreviewedPlan, Session, State
from orchestrator.control.rules.timelines import timeline
from orchestrator.planner import Plan, Refusal, plan_to_cluster_toml

if TYPE_CHECKING:
    from orchestrator.control.rules.download_state import HubRef

LIVE = ("launching", "running", "recovering")  # phases a stop applies to


# --- effects: I/O to do, as values ----------------------------------------------------------
@dataclass(frozen=True)
class StartLaunch:
    """Launch a created session (ordered, all or nothing) in a worker."""

    session: Session
    model_id: str


@dataclass(frozen=True)
class StartTeardown:
    """Deregister and stop every process of a session, then end it with `health` and `reason`."""

    session: Session
    health: Health
    reason: str


@dataclass(frozen=True)
class StartRecovery:
    """One attempt (after its backoff) to replace the session's faulted processes."""

    session: Session


@dataclass(frozen=True)
class CancelWork:
    """Cancel the session's running launch (it rolls back and reports) or recovery (no further start)."""

    session_id: str


@dataclass(frozen=True)
class RunPreparation:
    """Copy a model onto the nodes (progress arrives as events)."""

    model_id: str
    node_ids: tuple[str, ...]
    hub: "HubRef | None" = None


@dataclass(frozen=True)
class MeasureAfterPreview:
    """Measure the links and layer timings a previewed plan lacks, then preview it again."""

    model_id: str
    node_ids: tuple[str, ...]
    context_length: int
    concurrency: int
    manual_split: Split | None
    links: bool  # measure the links between the nodes
    timing: bool  # time the model's layers on a node that holds it
    draft_model: str | None = None  # the preview's draft model, previewed again with it


@dataclass(frozen=True)
class Readopt:
    """After a restart, a session still serving: put its router entry back (by name, never twice)."""

    session: Session


Effect = Union[StartLaunch, StartTeardown, StartRecovery, CancelWork, RunPreparation, MeasureAfterPreview, Readopt,
               ModelEffect]


@dataclass(frozen=True)
class Decision:
    """What a command leads to. `refusal` set: the events are still applied (a refused plan
    stays on screen), then the command is refused with it."""

    events: tuple[ev.Event, ...] = ()
    effects: tuple[Effect, ...] = ()
    refusal: str = ""


# --- decide ---------------------------------------------------------------------------------
def decide(state: State, command: Command) -> Decision:
    """The events and effects of `command` against `state`; CommandRefused names a broken rule."""
    match command:
        case UpdateSettings(settings=settings):
            if settings.port_start > settings.port_end:
                raise CommandRefused(f"transport port range {settings.port_start}–{settings.port_end}: "
                                     "start must not exceed end")
            return Decision((ev.SettingsChanged(settings=settings),))
        case AddNode(node=node):
            return Decision((ev.NodeRegistered(node=node),))
        case RemoveNode(node_id=node_id):
            node = state.node(node_id)
            if node is None:
                raise CommandRefused(f"no registered node {node_id!r}")
            users = [s.name for s in state.sessions if node_id in s.node_ids]
            if users:
                raise CommandRefused(f"node {node.name} serves {', '.join(users)}: stop it first")
            return Decision((ev.NodeRemoved(node_id=node_id),))
        case PrepareModel():
            return _prepare(state, command)
        case PreviewPlan():
            return _preview_plan(state, command)
        case LaunchCluster():
            return _launch_cluster(state, command)
        case LaunchSingle(model_id=model_id, node_id=node_id, session_id=session_id, now=now):
            try:
                session = single_session(state, session_id, model_id, node_id, command.context_length,
                                         command.concurrency)
            except PlanningError as exc:
                raise CommandRefused(str(exc)) from None
            return _launch(state, session, model_id, now)
        case LaunchSession(session=session, model_id=model_id, now=now):
            return _launch(state, session, model_id, now)
        case StopSession(session_id=session_id):
            return _stop(state, session_id)
        case ResumeSession():
            return _resume(state, command)
        case DownloadModel():  # the Models tab's rules: model_rules.py
            return Decision(*decide_download(state, command))
        case ResumeDownload():
            return Decision(*decide_resume(state, command))
        case CancelDownload():
            return Decision(*decide_cancel(state, command))
        case DeleteModel():
            return Decision(*decide_delete(state, command))
        case VerifyCopy():
            return Decision(*decide_verify(state, command))
        case ClearDownloads():
            return Decision((DownloadsCleared(),))
    raise TypeError(f"not a command: {command!r}")


def _prepare(state: State, c: PrepareModel) -> Decision:
    prep = state.preparation
    if prep is not None and not prep.finished:
        raise CommandRefused(f"already preparing {prep.model_id}")
    missing = [n for n in c.node_ids if state.node(n) is None]
    if missing or not c.node_ids:
        raise CommandRefused(f"unknown nodes: {', '.join(missing)}" if missing else "select at least one node")
    deleted = deletion_conflict(state, c.model_id, c.node_ids)
    if deleted:
        raise CommandRefused(deleted)
    return Decision((), (RunPreparation(c.model_id, c.node_ids, c.hub),))


def _preview(state: State, model_id: str, node_ids: tuple[str, ...], context_length: int, concurrency: int,
             manual_split: Split | None, draft_model: str | None = None) -> ev.PlanPreviewed:
    """The planner's answer over the registry's latest reports, as the event that shows it."""
    split = [tuple(r) for r in manual_split] if manual_split is not None else None
    try:
        result = plan_for(state, model_id, list(node_ids), plan_settings(state.settings, context_length, concurrency,
                                                                           split), draft_model)
    except PlanningError as exc:
        raise CommandRefused(str(exc)) from None
    return ev.PlanPreviewed(plan=PreviewedPlan(model_id=model_id, node_ids=node_ids, context_length=context_length,
                                               result=result))


def _preview_plan(state: State, c: PreviewPlan) -> Decision:
    """The preview; measuring follows when the nodes lack links or timings of the model."""
    shown = state.plan
    if c.only_if_shown and (shown is None or shown.model_id != c.model_id or set(shown.node_ids) != set(c.node_ids)
                            or shown.context_length != c.context_length):
        return Decision()  # another plan is on screen now (another model, nodes or context length): it stays
    preview = _preview(state, c.model_id, c.node_ids, c.context_length, c.concurrency, c.manual_split, c.draft_model)
    links, timing = lacking(state, c.model_id, c.node_ids) if c.measure else (False, False)
    if not (links or timing):
        return Decision((preview,))
    return Decision((preview,), (MeasureAfterPreview(c.model_id, c.node_ids, c.context_length, c.concurrency,
                                                     c.manual_split, links, timing, c.draft_model),))


def _launch_cluster(state: State, c: LaunchCluster) -> Decision:
    """Launch over prepared nodes: the plan is previewed (every viewer sees what launches, or
    why not), then the session created from it."""
    busy = serving_conflict(state, c.model_id, list(c.node_ids))
    if busy:  # refused before planning: the running cluster's plan stays on every screen
        raise CommandRefused(busy)
    prep = state.preparation
    if prep is None or prep.model_id != c.model_id or not prep.ready or \
            not set(c.node_ids) <= {n.node_id for n in prep.nodes}:
        raise CommandRefused("prepare the model on every selected node first (every copy must be Verified)")
    preview = _preview(state, c.model_id, c.node_ids, c.context_length, c.concurrency, c.manual_split, c.draft_model)
    plan = preview.plan.result
    if isinstance(plan, Refusal):
        return Decision((preview,), refusal="; ".join(r.message for r in plan.reasons))
    assert isinstance(plan, Plan)
    hosts = {n.id: n.host for n in state.nodes}
    toml = plan_to_cluster_toml(plan, session_name(c.model_id, len(plan.stages)), hosts=hosts)
    session = session_from_plan(plan, state, c.session_id, c.model_id, toml)
    try:
        launched = _launch(state, session, c.model_id, c.now)
    except CommandRefused as exc:
        return Decision((preview,), refusal=str(exc))
    return Decision((preview, *launched.events), launched.effects)


def _launch(state: State, session: Session, model_id: str, now: float) -> Decision:
    """Create the session (its launch timeline all pending) and launch it in the background."""
    for nid in session.node_ids:
        if state.node(nid) is None:
            raise CommandRefused(f"node {nid!r} is not registered")
    if any(s.name == session.name for s in state.sessions):
        raise CommandRefused(f"a session named {session.name!r} is already live: stop it first")
    deleted = deletion_conflict(state, model_id, session.node_ids)
    if deleted:
        raise CommandRefused(deleted)
    # The plan decided the transport and why it may differ from the setting (session_from_plan);
    # a single-node session has no boundary between nodes.
    created = session.model_copy(update={"timeline": timeline(session), "created_at": now})
    return Decision((ev.SessionCreated(session=created),), (StartLaunch(created, model_id),))


def _stop(state: State, session_id: str) -> Decision:
    """The same teardown as an unhealthy cluster, reason "stopped"; a launch is cancelled instead
    (the launcher rolls back and reports)."""
    s = state.session(session_id)
    if s is None or s.phase not in LIVE:
        raise CommandRefused(f"no live session {session_id!r}")
    if s.phase == "launching":
        return Decision((), (CancelWork(s.id),))
    cancel = (CancelWork(s.id),) if s.phase == "recovering" else ()  # no further start of a process
    return Decision((ev.HealthChanged(session_id=s.id, health=s.health, phase="stopping", reason="stop requested"),),
                    (*cancel, StartTeardown(s, "Stopped", "stopped by request")))


def _resume(state: State, c: ResumeSession) -> Decision:
    """After a restart: carry on a recovery, repair a running session with a known culprit (as
    if the fault had been seen live), relaunch one whose every stage is gone (their leases ran
    out while the dashboard was away: the whole session, in launch order, under the same plan),
    re-adopt one that serves, clean up the rest."""
    s = next((x for x in state.sessions if x.id == c.session_id), None)
    if s is None or s.phase != c.seen_phase:
        return Decision()  # it moved on since it was looked at: what moved it decides
    if s.phase == "recovering":  # the dashboard went away mid-recovery
        return Decision((), (StartRecovery(s),))
    everything = tuple(f"stage-{st.index}" for st in s.stages) + ("coordinator",)
    if s.phase == "running" and c.problem and state.settings.auto_restart and \
            all(p in c.gone for p in everything[:-1]):
        # Every stage is gone: a coordinator restarted alone would wait for stages that no longer
        # exist. Everything starts again in the launch's order (a coordinator left alive too: it
        # would hold links to nothing).
        gone = "every stage" if len(s.stages) > 1 else "its stage"
        return Decision((ev.SessionFaulted(session_id=s.id, processes=everything, at=c.at, relaunch=True,
                                           reason=f"relaunched after a dashboard restart: {gone} had ended "
                                                  f"while it was away ({c.problem})"),))
    if s.phase == "running" and c.problem and c.culprits and state.settings.auto_restart:
        # Tearing down a whole cluster for one lost process would turn it into an outage.
        return Decision((ev.SessionFaulted(session_id=s.id, reason=f"seen after a dashboard restart: {c.problem}",
                                           processes=c.culprits, at=c.at),))
    if s.phase == "running" and not c.problem:
        return Decision((), (Readopt(s),))
    reason = f"cleaned up after a dashboard restart: {c.problem or 'it was ' + s.phase}"
    return Decision((ev.HealthChanged(session_id=s.id, health="Unhealthy", phase="stopping", reason=reason),),
                    (StartTeardown(s, "Unhealthy", reason),))


def serving_conflict(state: State, model_id: str | None, node_ids: list[str]) -> str | None:
    """Why Launch cluster must wait when selected nodes already serve this model (None if they
    do not): the planner would count the running stages' memory as taken and refuse with a
    misleading "does not fit" (the form disables Launch with this reason, too)."""
    chosen = set(node_ids)
    for s in state.sessions:
        shared = chosen & set(s.node_ids)
        if s.model_id != model_id or not shared:
            continue
        names = [n.name for n in state.nodes if n.id in shared] or sorted(shared)
        who = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        return (f"{who} already serve{'s' if len(names) == 1 else ''} {s.model_name} as {s.name}: "
                f"stop that cluster first to launch it again")
    return None


# --- react ----------------------------------------------------------------------------------
def react(old: State, new: State, event: ev.Event) -> tuple[Effect, ...]:
    """Effects that follow from an applied event: a fault (or a failed recovery attempt) of a
    running or recovering session starts another attempt or, when none may follow, the teardown.
    An event that changed nothing (a second fault of a session already recovering) has no effect."""
    if new is old:
        return ()
    match event:
        case ev.SessionFaulted(session_id=sid) | ev.RecoveryFailed(session_id=sid):
            s, before = new.session(sid), old.session(sid)
            if s is None or before is None or before.phase not in ("running", "recovering"):
                return ()
            if s.phase == "stopping":
                return (StartTeardown(s, "Unhealthy", s.reason),)
            if s.phase == "recovering":
                return (StartRecovery(s),)
    return ()
