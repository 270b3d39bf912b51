"""The one place that does the control plane's I/O: effects (`decide.py`) in, workers out.

`EffectRunner.run` is called on the orchestrator thread with the effects of a decision or a
reaction, and must never block it: each effect becomes a worker thread (launch, teardown,
recovery, preparation, measuring, re-adoption, a model's download or deletion) that talks to
agents, coordinators and the router and answers with events (`Orchestrator.post`) or, when what
it found needs a rule, a command. The runner also owns the cancel flags of running launches and
recoveries.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.agent.client import AgentClient
from orchestrator.control.capabilities import Capabilities
from orchestrator.control.launcher import Launcher
from orchestrator.control.perf import refresh_after_preview
from orchestrator.control.preparer import prepare
from orchestrator.control.recovery import Recovery, elapsed_since, follow_resume
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.commands import PreviewPlan, ResumeSession
from orchestrator.control.rules.decide import (
    CancelWork,
    Effect,
    MeasureAfterPreview,
    Readopt,
    RunPreparation,
    StartLaunch,
    StartRecovery,
    StartTeardown,
)
from orchestrator.control.rules.model_rules import CancelDownloadWork, CheckCopyFiles, DeleteModelFiles, RunDownload
from orchestrator.control.rules.state import Session
from orchestrator.control.rules.timelines import backoff

if TYPE_CHECKING:
    from orchestrator.control.models import ModelManager


class EffectRunner:
    """Maps each effect type to its worker; one per Orchestrator."""

    def __init__(self, caps: Capabilities, models: ModelManager,
                 inspect: Callable[[Session], tuple[Any, str, tuple[str, ...], tuple[str, ...]]],
                 release: Callable[[str], None] = lambda _: None) -> None:
        self.caps = caps
        self.models = models  # the Models tab's worker: downloads and deletions
        self.inspect = inspect  # the watcher's one look at a session (after a restart), leases renewed first
        self.release = release  # the watcher judges the session again (once decide has said what becomes of it)
        self.log = caps.log
        # session id -> cancel flag of its launch or recovery; only the orchestrator thread adds
        # flags (run), workers only read and set them
        self._cancels: dict[str, threading.Event] = {}

    def run(self, effects: tuple[Effect, ...]) -> None:
        """Start every effect (on the orchestrator thread: nothing here blocks)."""
        for effect in effects:
            match effect:
                case StartLaunch(session=s, model_id=model_id):
                    self._spawn(self._launch, s, model_id, self._cancels.setdefault(s.id, threading.Event()))
                case StartTeardown(session=s, health=health, reason=reason):
                    if health == "Unhealthy":
                        self.log.warning("session.unhealthy", session=s.id, reason=reason)
                    self._spawn(self.teardown, s, health, reason)
                case StartRecovery(session=s):
                    self.log.warning("session.recovering", session=s.id, reason=s.reason, attempt=s.recovery_attempt)
                    self._spawn(self._recover, s, self._cancels.setdefault(s.id, threading.Event()))
                case CancelWork(session_id=sid):
                    self._cancels.setdefault(sid, threading.Event()).set()
                case RunPreparation():
                    self._prepare(effect)
                case MeasureAfterPreview():
                    again = PreviewPlan(effect.model_id, effect.node_ids, effect.context_length, effect.concurrency,
                                        effect.manual_split, measure=False, only_if_shown=True,
                                        draft_model=effect.draft_model)
                    self._spawn(refresh_after_preview, self.caps, effect.model_id, list(effect.node_ids),
                                effect.links, effect.timing, functools.partial(self.caps.submit, again))
                case Readopt(session=s):
                    self._spawn(self._readopt, s)
                case RunDownload(download=dl):
                    self.models.run(dl)  # its own worker thread
                case CancelDownloadWork(model_id=model_id):
                    self.models.cancel_work(model_id)
                case DeleteModelFiles(model_id=model_id, node_id=node_id):
                    self._spawn(self.models.delete_files, model_id, node_id)
                case CheckCopyFiles(model_id=model_id, node_id=node_id, reference=reference):
                    self._spawn(self.models.check_files, model_id, node_id, reference)
                case _:
                    raise TypeError(f"not an effect: {effect!r}")

    def inspect_after_restart(self, s: Session) -> None:
        """Look at a persisted session once (a worker), then let `decide` say what becomes of it."""
        self._spawn(self._inspect, s)

    @staticmethod
    def _spawn(fn: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=fn, args=args, name=fn.__name__.strip("_"), daemon=True).start()

    def _agents_for(self, s: Session) -> dict[str, AgentClient]:
        agents = {nid: self.caps.agent(nid) for nid in s.node_ids}
        return {k: v for k, v in agents.items() if v is not None}

    # --- workers (each in its own thread) ---------------------------------------------------
    def _launch(self, s: Session, model_id: str, cancel: threading.Event) -> None:
        secret = secrets.token_hex(24)
        self.caps.secrets.put(s.id, secret)  # a replaced stage rejoins with it
        launcher = Launcher(s, self._agents_for(s), self.caps.registrar, self.caps.post, self.caps.timeouts, cancel)
        ok = launcher.launch(model_id, secret, "tcp")
        if ok and not cancel.is_set():
            self.caps.post(ev.HealthChanged(session_id=s.id, health="Healthy", phase="running", reason="serving"))
            return
        if ok:  # stopped while the last step finished: take it down again
            launcher.teardown()
        self.caps.post(ev.LaunchEnded(session_id=s.id, cancelled=cancel.is_set()))  # apply words the reason

    def teardown(self, s: Session, health: str, reason: str) -> None:
        """Deregister, stop every process, then report the session ended."""
        launcher = Launcher(s, self._agents_for(s), self.caps.registrar, self.caps.post, self.caps.timeouts)
        problems = launcher.teardown()
        if problems:
            self.log.error("teardown.incomplete", session=s.id, problems="; ".join(problems))
            reason = f"{reason} (cleanup problems: {'; '.join(problems)})"
        self.caps.post(ev.HealthChanged(session_id=s.id, health=health, phase="stopped", reason=reason))
        self.caps.post(ev.SessionRemoved(session_id=s.id, reason=reason))
        self.caps.secrets.keep_only({x.id for x in self.caps.state().sessions if x.id != s.id})

    def _recover(self, s: Session, cancel: threading.Event) -> None:
        """One recovery attempt (after its backoff); reports SessionRecovered or RecoveryFailed."""
        if cancel.wait(backoff(s.recovery_attempt)):
            return  # stopped meanwhile: the stop tears it down
        secret = self.caps.secrets.get(s.id)
        if secret is None:
            self.caps.post(ev.RecoveryFailed(session_id=s.id, final=True,
                                             reason="the cluster secret of this session is not known here"))
            return
        fault = s.faults[-1]
        problem = Recovery(s, fault.processes, self._agents_for(s), self.caps.registrar, self.caps.post,
                           self.caps.timeouts, secret, cancel,
                           state=self.caps.state(), agent_for=self.caps.agent).run()  # state: where a stage may move
        if cancel.is_set():
            return
        if problem:
            self.log.warning("session.recovery_failed", session=s.id, attempt=s.recovery_attempt, reason=problem)
            self.caps.post(ev.RecoveryFailed(session_id=s.id, reason=problem))
        else:
            seconds = elapsed_since(fault.at)
            self.log.info("session.recovered", session=s.id, processes=",".join(fault.processes), seconds=seconds)
            self.caps.post(ev.SessionRecovered(session_id=s.id, seconds=seconds))
            if "coordinator" not in fault.processes:  # a new coordinator held nothing: its clients left with the old
                follow_resume(s, fault, secret, self.caps.post, self.caps.clock, cancel)

    def _prepare(self, effect: RunPreparation) -> None:
        targets = {n: self.caps.agent(n) for n in effect.node_ids}
        everyone = {n.id: self.caps.agent(n.id) for n in self.caps.state().nodes if n.id not in targets}
        names = {n.id: n.name for n in self.caps.state().nodes}
        self._spawn(prepare, effect.model_id, targets, everyone, self.caps.post, names, effect.hub)

    def _inspect(self, s: Session) -> None:
        """Renew, look, let `decide` say what becomes of the session, and only then let the
        watcher judge it again (a fault it posted first would be repaired without what the look
        found: the coordinator replaced alone while every stage was gone)."""
        try:
            _, problem, culprits, gone = self.inspect(s)
            self.log.info("session.seen_after_restart", session=s.id, phase=s.phase, problem=problem or "none",
                          culprits=",".join(culprits), gone=",".join(gone))
            self.caps.command(ResumeSession(s.id, s.phase, problem, culprits, time.time(), gone))
        except Exception as exc:  # noqa: BLE001 (a worker's end: logged, and the watcher judges it from now on)
            self.log.error("session.resume_failed", session=s.id, reason=exc)
        finally:
            self.release(s.id)

    def _readopt(self, s: Session) -> None:
        """Register a session that kept serving (by name: never twice) and wait until the router
        routes to it, as a launch does; a failure goes back to `decide` (which cleans it up)."""
        launcher = Launcher(s, self._agents_for(s), self.caps.registrar, self.caps.post, self.caps.timeouts)

        def report(state: str, detail: str) -> None:  # no timeline step: a re-adoption is no launch
            self.log.info("session.readopting", session=s.id, router=state, detail=detail)

        try:
            launcher.register(report)
        except Exception as exc:  # noqa: BLE001 (any registrar failure means: not adopted)
            self.caps.submit(ResumeSession(s.id, s.phase, f"router registration failed: {exc}", (), time.time()))
            return
        self.log.info("session.readopted", session=s.id)
        self.caps.post(ev.HealthChanged(session_id=s.id, health="Healthy", phase="running",
                                        reason="re-adopted after a dashboard restart"))
