"""Replacing one faulted process while the rest of the session keeps running (the I/O edge).

A stage that died or wedged (or the coordinator) is replaced alone, on its node, with the
same configuration and cluster secret; the other stages keep their processes and weights.
The coordinator's links reconnect by themselves (they retry), then it resets every stage
and re-runs its readiness probe (prefill + batched decode of two requests) before it says
ready again. Steps of each attempt are appended to the session's timeline
(`recovery_steps`, pure) and reported as `LaunchStepped` events like a launch's.

Order: the post-mortem of each process is kept, the process is stopped (a wedged one is
still running), started again, waited for until it listens, the coordinator is waited for
until it is healthy, and the router entry is confirmed.

The router entry STAYS during a recovery (docs/router.md, "During a recovery"): the router
takes the backend out of rotation itself (its coordinator answers 503 to the health probe
and to any request relayed to it), so a client asking for the model gets 503 + Retry-After
— "come back soon" — and not the 404 "model not found" that a removed entry would give.
Only a teardown removes it.
"""

from __future__ import annotations

import threading
import time

from ..agent.client import AgentClient, AgentError
from ..registrar import Registrar, RegistrarError
from . import events as ev
from .launcher import LaunchFailed, Launcher, Post, Timeouts
from .state import PostMortem, Session, StageStatus, Step

STOP_GRACE_S = 1.0  # the process is broken: no long goodbye (a wedged one never answers SIGTERM)
LOG_LINES = 30
BACKOFF_S = (0.0, 1.0, 2.0, 4.0, 8.0)  # before attempt 1, 2, 3, ...; covers an agent restarting


def backoff(attempt: int) -> float:
    """Seconds to wait before recovery attempt `attempt` (1-based)."""
    return BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)]


def _label(process: str) -> str:
    return "Coordinator" if process == "coordinator" else f"Stage {process.split('-', 1)[1]}"


def step_prefix(fault_number: int, attempt: int) -> str:
    """Timeline keys of one recovery attempt start with this (unique per fault and attempt)."""
    return f"recovery-{fault_number}.{attempt}."


def recovery_steps(session: Session, processes: tuple[str, ...], fault_number: int, attempt: int) -> tuple[Step, ...]:
    """The pending timeline steps of one recovery attempt (pure)."""
    p = step_prefix(fault_number, attempt)
    head = f"Recovery {fault_number}" + (f", attempt {attempt}" if attempt > 1 else "") + ": "
    nodes = {f"stage-{st.index}": (st.node_name, st.port) for st in session.stages}
    coordinator_node = next((st.node_name for st in session.stages if st.node_id == session.coordinator_node),
                            "its node")
    steps = []
    for proc in processes:
        node, port = nodes.get(proc, (coordinator_node, session.coordinator_port))
        steps.append(Step(key=p + f"{proc}.stop", label=head + f"{_label(proc)} stopped on {node} (post-mortem kept)"))
        steps.append(Step(key=p + f"{proc}.start", label=head + f"{_label(proc)} restarting on {node}"))
        if proc != "coordinator":
            steps.append(Step(key=p + f"{proc}.listen", label=head + f"{_label(proc)} transport listening on port {port}"))
    steps.append(Step(key=p + "coordinator.healthy",
                      label=head + "coordinator healthy again (re-connected, probe through every stage)"))
    steps.append(Step(key=p + "router.register", label=head + "router entry confirmed (it stayed registered; the "
                                                               "router answered 503 + Retry-After meanwhile)"))
    return tuple(steps)


def ordered(processes: tuple[str, ...]) -> tuple[str, ...]:
    """Stages in ascending order, the coordinator last (it connects to them)."""
    stages = sorted((p for p in processes if p != "coordinator"), key=lambda p: int(p.split("-", 1)[1]))
    return tuple(stages) + (("coordinator",) if "coordinator" in processes else ())


class Recovery:
    """One recovery attempt of one session; run it in a worker thread."""

    def __init__(self, session: Session, processes: tuple[str, ...], agents: dict[str, AgentClient],
                 registrar: Registrar, post: Post, timeouts: Timeouts, secret: str,
                 cancel: threading.Event | None = None) -> None:
        self.s = session
        self.processes = ordered(processes)
        self.agents = agents
        self.registrar = registrar
        self.post = post
        self.secret = secret
        self.launcher = Launcher(session, agents, registrar, post, timeouts, cancel)
        self.prefix = step_prefix(len(session.faults), session.recovery_attempt)

    def _step(self, key: str, state: str, detail: str = "") -> None:
        self.post(ev.LaunchStepped(session_id=self.s.id, key=self.prefix + key, state=state, detail=detail))

    def node_of(self, process: str) -> str:
        """The node a process runs on."""
        if process == "coordinator":
            return self.s.coordinator_node
        return self.s.stages[int(process.split("-", 1)[1])].node_id

    def run(self) -> str:
        """Replace the processes; "" when the session serves again, else why not."""
        key = f"{self.processes[0]}.stop"
        try:
            toml = self.s.config_toml or _cluster_toml(self.s)
            mortems = []
            for proc in self.processes:
                key = f"{proc}.stop"
                self._step(key, "running")
                mortems.append(self.post_mortem(proc))
                self.stop(proc)
                self._step(key, "done", mortems[-1].ended)
            self.post(ev.PostMortemRecorded(session_id=self.s.id, post_mortems=tuple(mortems)))
            for proc in self.processes:
                key = f"{proc}.start"
                self._step(key, "running")
                kind = "coordinator" if proc == "coordinator" else "stage"
                self.launcher.start_process(self.node_of(proc), kind, proc, self.s.model_id, toml, self.secret)
                self._step(key, "done")
                if kind == "stage":
                    key = f"{proc}.listen"
                    self._step(key, "running")
                    self.launcher.wait_listening(self.node_of(proc), proc, self.launcher.t.listen)
                    self._step(key, "done")
            key = "coordinator.healthy"
            self._step(key, "running")
            self.launcher.wait_healthy()
            self._step(key, "done")
            key = "router.register"
            self._step(key, "running")
            # Idempotent: changes nothing when the entry stayed, restores one that went missing.
            self.registrar.register(self.s.name, self.s.url + "/v1", [self.s.model_name])
            self.post(ev.SessionRegistered(session_id=self.s.id, registered=True))
            self._step(key, "done", self.s.name)
            return ""
        except (LaunchFailed, AgentError, RegistrarError, OSError, ValueError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            self._step(key, "failed", message)
            return f"{key}: {message}"

    def post_mortem(self, process: str) -> PostMortem:
        """How the process ended, its last output and its last progress report (best effort)."""
        node_id = self.node_of(process)
        node_name = next((st.node_name for st in self.s.stages if st.node_id == node_id), node_id[:12])
        status = _status_of(self.s, process)
        agent = self.agents.get(node_id)
        if agent is None:
            return PostMortem(process=process, node_name=node_name, ended="node not registered",
                              progress=status.progress if status else None)
        try:
            info = agent.process(self.s.id, process)
            if info.alive:
                ended = f"still running ({status.fault or status.detail or 'faulted'}): killed" if status else \
                    "still running: killed"
            elif info.signal:
                ended = f"killed by {info.signal}"
            elif info.exit_code is not None:
                ended = f"exit status {info.exit_code}"
            else:
                ended = info.stop_reason or "exited (status unknown)"
        except AgentError as exc:
            ended = "agent unreachable" if not exc.status or exc.status >= 500 else \
                ("not listed by its agent" if exc.status == 404 else exc.message)
        try:
            tail = tuple(agent.logs(self.s.id, process, LOG_LINES))
        except AgentError:
            tail = ()
        return PostMortem(process=process, node_name=node_name, ended=ended, log_tail=tail,
                          progress=status.progress if status else None)

    def stop(self, process: str) -> None:
        """Stop what is left of the process (a 404 means it is already gone)."""
        try:
            self.agents[self.node_of(process)].stop_process(self.s.id, process, STOP_GRACE_S)
        except AgentError as exc:
            if exc.status != 404:
                raise


def _status_of(s: Session, process: str) -> StageStatus | None:
    if process == "coordinator":
        return None
    index = int(process.split("-", 1)[1])
    return s.stage_status[index] if index < len(s.stage_status) else None


def _cluster_toml(s: Session) -> str:
    from .launcher import cluster_toml

    return cluster_toml(s)


def elapsed_since(wall_time: float) -> float:
    """Seconds since a wall-clock time (faults carry time.time())."""
    return max(0.0, time.time() - wall_time)


__all__ = ["Recovery", "backoff", "ordered", "recovery_steps", "step_prefix"]
