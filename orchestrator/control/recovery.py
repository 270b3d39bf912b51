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

A stage whose node's agent cannot be reached is restarted on another node instead
(`relocation.choose_node`: reachable, holds the model, has a free port and memory for the
stage): the session's record follows (`StageMoved`), and the running coordinator is told the
new address (a request signed with the cluster secret, engine/routes.py); it re-points its
link and passes the address down the chain, so the previous stage re-dials too. When no node
holding the model has room, a node that has room copies it first from the nodes that hold it
(`stage_copy.py`: verified peer copy, its progress a step of the attempt). The old
node's agent, should it come back, stops its stale stage when the lease the control plane
no longer renews runs out.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

import requests

from ..agent.client import AgentClient, AgentError
from ..engine.routes import ROUTE_PATH, SIGNATURE_HEADER, request_body, sign
from ..planner.cluster_toml import engine_address
from ..registrar import Registrar, RegistrarError
from . import events as ev
from .launcher import LaunchFailed, Launcher, Post, Timeouts
from .state import PostMortem, Session, StageStatus, State, Step

if TYPE_CHECKING:
    from .relocation import Move

ROUTE_TIMEOUT_S = 10.0  # the coordinator answers at once; only a frozen one takes long

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


def _head(fault_number: int, attempt: int) -> str:
    return f"Recovery {fault_number}" + (f", attempt {attempt}" if attempt > 1 else "") + ": "


def recovery_steps(session: Session, processes: tuple[str, ...], fault_number: int, attempt: int) -> tuple[Step, ...]:
    """The pending timeline steps of one recovery attempt (pure)."""
    p = step_prefix(fault_number, attempt)
    head = _head(fault_number, attempt)
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


def stage_moved(session: Session, e: ev.StageMoved) -> Session:
    """The session after its stage `e.stage.index` moved to another node during the current
    recovery attempt: its placement and TOML, and the attempt's steps for it (pure)."""
    k, new = e.stage.index, e.stage
    if not 0 <= k < len(session.stages):
        return session
    old = session.stages[k]
    p = step_prefix(len(session.faults), session.recovery_attempt) + f"stage-{k}."
    head = _head(len(session.faults), session.recovery_attempt)
    # The move step follows the model's copy to the node when there was one, else the stop.
    after = p + "copy" if any(st.key == p + "copy" for st in session.timeline) else p + "stop"
    steps: list[Step] = []
    for st in session.timeline:
        if st.key == p + "start":
            st = st.model_copy(update={"label": head + f"Stage {k} starting on {new.node_name} "
                                                       f"(layers {new.first_layer}–{new.last_layer})"})
        elif st.key == p + "listen":
            st = st.model_copy(update={"label": head + f"Stage {k} transport listening on port {new.port}"})
        steps.append(st)
        if st.key == after:
            steps.append(Step(key=p + "move", label=head + f"stage {k} moved to {new.node_name} "
                                                           f"(from {old.node_name})", state="done", detail=e.reason))
        elif st.key == p + "listen":
            steps.append(Step(key=p + "route", label=head + f"coordinator told stage {k}'s new address "
                                                            f"({new.host}:{new.port}); it passes it down the chain"))
    stages = tuple(new if st.index == k else st for st in session.stages)
    return session.model_copy(update={"stages": stages, "config_toml": e.config_toml, "timeline": tuple(steps)})


def ordered(processes: tuple[str, ...]) -> tuple[str, ...]:
    """Stages in ascending order, the coordinator last (it connects to them)."""
    stages = sorted((p for p in processes if p != "coordinator"), key=lambda p: int(p.split("-", 1)[1]))
    return tuple(stages) + (("coordinator",) if "coordinator" in processes else ())


class Recovery:
    """One recovery attempt of one session; run it in a worker thread."""

    def __init__(self, session: Session, processes: tuple[str, ...], agents: dict[str, AgentClient],
                 registrar: Registrar, post: Post, timeouts: Timeouts, secret: str,
                 cancel: threading.Event | None = None, *, state: State | None = None,
                 agent_for: Callable[[str], AgentClient | None] | None = None) -> None:
        """`state` and `agent_for` (the registry and its agent clients) let a stage whose node
        is unreachable move to another node; without them it is restarted in place or not at all."""
        self.s = session
        self.state = state
        self.agent_for = agent_for
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
            mortems, stranded = [], {}
            for proc in self.processes:
                key = f"{proc}.stop"
                self._step(key, "running")
                mortems.append(self.post_mortem(proc))
                why = self.stop(proc)
                if why:
                    stranded[proc] = why
                self._step(key, "done", mortems[-1].ended + (f"; {why}" if why else ""))
            self.post(ev.PostMortemRecorded(session_id=self.s.id, post_mortems=tuple(mortems)))
            for proc in self.processes:
                key = f"{proc}.start"
                self._step(key, "running")
                kind = "coordinator" if proc == "coordinator" else "stage"
                if proc in stranded:
                    toml = self.move(proc, stranded[proc], toml)
                self.launcher.start_process(self.node_of(proc), kind, proc, self.s.model_id, toml, self.secret)
                self._step(key, "done")
                if kind == "stage":
                    key = f"{proc}.listen"
                    self._step(key, "running")
                    self.launcher.wait_listening(self.node_of(proc), proc, self.launcher.t.listen)
                    self._step(key, "done")
                    if proc in stranded:
                        key = f"{proc}.route"
                        if "coordinator" in self.processes:  # restarted below: it reads the new TOML
                            self._step(key, "done", "the restarted coordinator reads it from its cluster TOML")
                        else:
                            self._step(key, "running")
                            self.tell_coordinator(proc)
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

    def stop(self, process: str) -> str:
        """Stop what is left of the process (a 404 means it is already gone); returns why its
        node cannot take it back ("" when it can): no agent, or one that does not answer."""
        agent = self.agents.get(self.node_of(process))
        if agent is None:
            return "its node is not registered"
        try:
            agent.stop_process(self.s.id, process, STOP_GRACE_S)
        except AgentError as exc:
            if exc.status == 0:  # unreachable: a process left there ends with its lease
                return exc.message
            if exc.status != 404:
                raise
        return ""

    def move(self, process: str, why: str, toml: str) -> str:
        """Choose another node for a stage whose node is unreachable, record the move
        (StageMoved) and return the cluster TOML with its new address; LaunchFailed if none can."""
        from .planning import PlanningError, model_info
        from .relocation import choose_node, moved_toml

        if process == "coordinator":  # its address is the router entry and the clients' URL
            raise LaunchFailed(process, f"the coordinator's node cannot take it back ({why}); a coordinator "
                                        "is not moved to another node")
        if self.state is None or self.agent_for is None:
            raise LaunchFailed(process, f"{process}'s node cannot take it back ({why})")
        index = int(process.split("-", 1)[1])
        failed = self.s.stages[index].node_id
        survivors = [n for n in self.state.nodes if n.id in self.s.node_ids and n.id != failed]
        try:
            model = model_info(self.state, self.s.model_id, survivors)
        except PlanningError as exc:
            raise LaunchFailed(process, str(exc)) from None
        choice = choose_node(self.s, index, self.state.nodes, model, self.state.settings, failed)
        if isinstance(choice, str):
            raise LaunchFailed(process, f"{process}'s node is unreachable ({why}) and {choice}")
        agent = self.agent_for(choice.node_id)
        if agent is None:
            raise LaunchFailed(process, f"node {choice.node_name} is no longer registered")
        if choice.copies:  # before the move is recorded: a failed copy leaves the stage where it was
            self.copy_model(process, choice, agent)
        self.agents[choice.node_id] = agent
        self.launcher.agents[choice.node_id] = agent
        new_toml = moved_toml(toml, choice)
        placement = choice.placement(self.s.stages[index])
        self.post(ev.StageMoved(session_id=self.s.id, stage=placement, config_toml=new_toml,
                                reason=f"{self.s.stages[index].node_name}: {why}"))
        stages = tuple(placement if st.index == index else st for st in self.s.stages)
        self.s = self.s.model_copy(update={"stages": stages, "config_toml": new_toml})
        return new_toml

    def copy_model(self, process: str, choice: "Move", target: AgentClient) -> None:
        """Copy the session's model to the node a stage moves to, from the nodes `choice` names
        (a step of the attempt, with its progress); LaunchFailed when it is not there verified."""
        from .preparer import PrepareFailed, reference_manifest
        from .stage_copy import CopyCancelled, CopyFailed, copy_key, copy_model

        assert self.agent_for is not None and self.state is not None
        names = {n.id: n.name for n in self.state.nodes}
        holders = {n: a for n in choice.sources if (a := self.agent_for(n)) is not None}
        try:
            holder, manifest = reference_manifest(self.s.model_id, holders)
        except PrepareFailed as exc:
            raise LaunchFailed(process, f"{process}'s model cannot be copied to {choice.node_name}: {exc}") from None
        sources = [holder] + [n for n in holders if n != holder]  # the reference's holder serves first
        self.post(ev.StageCopyStarted(session_id=self.s.id, index=choice.index, model_id=self.s.model_id,
                                      node_name=choice.node_name, sources=tuple(names.get(n, n) for n in sources),
                                      total_bytes=manifest.total_bytes))
        key = copy_key(choice.index)
        try:
            done = copy_model(target, [holders[n] for n in sources], self.s.model_id, manifest,
                              lambda state, detail: self._step(key, state, detail), self.launcher.cancel)
        except CopyCancelled:
            self._step(key, "failed", "recovery cancelled: the copy was stopped and its partial files dropped")
            raise LaunchFailed(process, "recovery cancelled during the model copy") from None
        except CopyFailed as exc:
            self._step(key, "failed", str(exc))
            raise LaunchFailed(process, f"copying {self.s.model_id} to {choice.node_name} failed: {exc}") from None
        self._step(key, "done", done)

    def tell_coordinator(self, process: str) -> None:
        """Give the running coordinator a moved stage's address (signed with the cluster secret)."""
        st = self.s.stages[int(process.split("-", 1)[1])]
        body = request_body(st.index, engine_address(st.host, st.port), time.time())
        try:
            r = requests.post(self.s.url + ROUTE_PATH, data=body, timeout=ROUTE_TIMEOUT_S,
                              headers={SIGNATURE_HEADER: sign(self.secret.encode(), body),
                                       "Content-Type": "application/json"})
        except requests.RequestException as exc:
            raise LaunchFailed(process, f"the coordinator could not be told the new address: {exc}") from None
        if r.status_code != 200:
            raise LaunchFailed(process, f"the coordinator refused the new address ({r.status_code}): {r.text[:200]}")


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


__all__ = ["Recovery", "backoff", "ordered", "recovery_steps", "stage_moved", "step_prefix"]
