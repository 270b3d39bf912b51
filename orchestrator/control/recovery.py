"""Replacing one faulted process while the rest of the session keeps running (the I/O edge).

A stage that died or wedged (or the coordinator) is replaced alone, on its node, with the
same configuration and cluster secret; the other stages keep their processes and weights.
The coordinator's links reconnect by themselves (they retry), then it resets every stage
and re-runs its readiness probe (prefill + batched decode of two requests) before it says
ready again. Steps of each attempt are appended to the session's timeline
(`timelines.recovery_steps`, pure) and reported as `LaunchStepped` events like a launch's.

Order: the post-mortem of each process is kept, the process is stopped (a wedged one is
still running), started again, waited for until it listens, the coordinator is waited for
until it is healthy, and the router entry is confirmed and waited for until the router routes
to it again (`Launcher.register`): recovered means a request through the router is served.

The router entry STAYS during a recovery (docs/router.md, "During a recovery"): the router
takes the backend out of rotation itself (its coordinator answers 503 to the health probe
and to any request relayed to it), so a client asking for the model gets 503 + Retry-After
— "come back soon" — and not the 404 "model not found" that a removed entry would give.
Only a teardown removes it.

A stage whose node's agent cannot be reached is restarted on another node instead
(`relocation.choose_node`: reachable, holds the model, has a free port and memory for the
stage): the session's record follows (`StageMoved`), and the running coordinator is told the
new address (a request signed with the cluster secret, engine/stage_address.py); it re-points its
link and passes the address down the chain, so the previous stage re-dials too. When no node
holding the model has room, a node that has room copies it first from the nodes that hold it
(`stage_copy.py`: verified peer copy, its progress a step of the attempt). The old
node's agent, should it come back, stops its stale stage when the lease the control plane
no longer renews runs out.

Once the session serves again, the answers the coordinator held while the stage was gone resume
(docs/recovery.md); `follow_resume` reads the coordinator's record of that pause (`/health`'s
`pause`) until every held answer went on or ended, and posts it (`RequestsResumed`): the recovery's
last timeline step and the fault's line in the Faults tab.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import requests

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.agent.schemas import ProcessInfo
from orchestrator.control.coordinator_client import CoordinatorClient
from orchestrator.control.launcher import Launcher, LaunchFailed, Post, Timeouts
from orchestrator.control.preparer import PrepareFailed, reference_manifest
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.planning import PlanningError, model_info
from orchestrator.control.rules.process_ends import ended as process_ended
from orchestrator.control.rules.relocation import Move, choose_node, moved_toml
from orchestrator.control.rules.session_toml import cluster_toml
from orchestrator.control.rules.state import Fault, PostMortem, ResumedRequests, Session, StageStatus, State
from orchestrator.control.rules.timelines import backoff, copy_key, ordered, recovery_steps, stage_moved, step_prefix
from orchestrator.control.stage_copy import CopyCancelled, CopyFailed, copy_model
from orchestrator.engine.coordinator.health_report import PauseReport
from orchestrator.engine.stage_address import request_body
from orchestrator.planner.cluster_toml import engine_address
from orchestrator.proc import Clock, WaitTimeout, wait_until
from orchestrator.registrar import Registrar, RegistrarError

ROUTE_TIMEOUT_S = 10.0  # the coordinator answers at once; only a frozen one takes long

STOP_GRACE_S = 1.0  # the process is broken: no long goodbye (a wedged one never answers SIGTERM)
LOG_LINES = 30
# A pause begins when the coordinator loses the stage, a moment before the watcher sees the fault
# (it long-polls /health); one that began earlier than this belongs to an earlier fault.
PAUSE_SLACK_S = 30.0
# Held answers resume by generating again what their clients had, at decode speed: a long answer
# takes a while (docs/recovery.md, measured). The follow gives up after this long.
FOLLOW_RESUME_S = 600.0
FOLLOW_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 5.0


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
        self.launcher.secret = secret  # its health looks are the control plane's (priority at the coordinator)
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
                before = self.post_mortem(proc)
                why, stopped = self.stop(proc)
                mortems.append(settled(before, stopped))
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
                    if proc not in stranded and "coordinator" not in self.processes:
                        # Restarted in place: the coordinator is told its address all the same, so
                        # a move replayed meanwhile (or any stale address) can never keep it away.
                        self.tell_coordinator(proc)
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
            # Idempotent: changes nothing when the entry stayed, restores one that went missing;
            # then waits until the router routes to it again (it took it out on the 503s).
            self.launcher.register(lambda state, detail: self._step("router.register", state, detail))
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
            else:  # why its agent stopped it (its lease lapsed, ...) beside the status
                ended = process_ended(info)
        except AgentError as exc:
            ended = "agent unreachable" if not exc.status or exc.status >= 500 else \
                ("not listed by its agent" if exc.status == 404 else exc.message)
        try:
            tail = tuple(agent.logs(self.s.id, process, LOG_LINES))
        except AgentError:
            tail = ()
        return PostMortem(process=process, node_name=node_name, ended=ended, log_tail=tail,
                          progress=status.progress if status else None)

    def stop(self, process: str) -> tuple[str, ProcessInfo | None]:
        """Stop what is left of the process (a 404 means it is already gone); returns why its
        node cannot take it back ("" when it can: no agent, or one that does not answer) and
        how the process ended as the stop observed it (None when unknown)."""
        agent = self.agents.get(self.node_of(process))
        if agent is None:
            return "its node is not registered", None
        try:
            return "", agent.stop_process(self.s.id, process, STOP_GRACE_S)
        except AgentError as exc:
            if exc.status == 0:  # unreachable: a process left there ends with its lease
                return exc.message, None
            if exc.status != 404:
                raise
        return "", None

    def move(self, process: str, why: str, toml: str) -> str:
        """Choose another node for a stage whose node is unreachable, record the move
        (StageMoved) and return the cluster TOML with its new address; LaunchFailed if none can."""
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

    def copy_model(self, process: str, choice: Move, target: AgentClient) -> None:
        """Copy the session's model to the node a stage moves to, from the nodes `choice` names
        (a step of the attempt, with its progress); LaunchFailed when it is not there verified."""
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
            r = CoordinatorClient(self.s.url, self.secret).move_stage(body, ROUTE_TIMEOUT_S)
        except requests.RequestException as exc:
            raise LaunchFailed(process, f"the coordinator could not be told the new address: {exc}") from None
        if r.status_code != 200:
            raise LaunchFailed(process, f"the coordinator refused the new address ({r.status_code}): {r.text[:200]}")


def fault_pause(pause: PauseReport | None, seen_s_ago: float, reported: set[str]) -> PauseReport | None:
    """The coordinator's pause that belongs to a fault seen `seen_s_ago` seconds ago (pure): it began
    at most PAUSE_SLACK_S before the fault was seen, held an answer, and no other fault reported it.
    None: nothing was held for this fault (the coordinator had nothing in flight)."""
    if pause is None or pause.held == 0 or pause.id in reported or pause.age_s > seen_s_ago + PAUSE_SLACK_S:
        return None
    return pause


def follow_resume(s: Session, fault: Fault, secret: str, post: Post, clock: Clock, cancel: threading.Event) -> None:
    """After a recovery of `fault` (the session's last), read the coordinator's pause until every held
    answer went on or ended, then post it (`RequestsResumed`); nothing when nothing was held, the
    follow is cancelled, or it outlasts FOLLOW_RESUME_S."""
    client = CoordinatorClient(s.url, secret)
    reported = {f.resumed.pause for f in s.faults if f.resumed is not None}

    def settled_pause() -> tuple[PauseReport | None] | None:  # truthy once there is an answer
        if cancel.is_set():
            return (None,)
        look = client.health(HEALTH_TIMEOUT_S)
        if look.report is None:  # busy: asked again; silent: gone again (a new fault), nothing to follow
            return None if look.answered else (None,)
        pause = fault_pause(look.report.pause, clock.time() - fault.at, reported)
        return (pause,) if pause is None or pause.settled else None

    try:
        (pause,) = wait_until(settled_pause, FOLLOW_RESUME_S, FOLLOW_INTERVAL_S, "the held answers resumed",
                              clock=clock)
    except WaitTimeout:
        return
    if pause is not None and not cancel.is_set():
        post(ev.RequestsResumed(session_id=s.id, fault=len(s.faults), fault_at=fault.at, resumed=ResumedRequests(
            pause=pause.id, held=pause.held, resumed=pause.resumed, lost=pause.lost, seconds=pause.seconds,
            ready_s=pause.ready_s)))


def settled(before: PostMortem, stopped: ProcessInfo | None) -> PostMortem:
    """The post-mortem with the exit the stop observed (pure): a look taken before the stop may
    see a process still running that was in fact dying (a `kill -9` not yet reaped); the stop's
    answer tells whether it ended by itself or had to be stopped, and with which status."""
    if stopped is None or stopped.alive or not before.ended.startswith("still running"):
        return before
    how = f"killed by {stopped.signal}" if stopped.signal else \
        f"exit status {stopped.exit_code}" if stopped.exit_code is not None else "exited (status unknown)"
    if stopped.stop_reason:  # the stop ended it: it was running, as the look said
        return before.model_copy(update={"ended": f"{before.ended.removesuffix(': killed')}: stopped ({how})"})
    return before.model_copy(update={"ended": how})


def _status_of(s: Session, process: str) -> StageStatus | None:
    if process == "coordinator":
        return None
    index = int(process.split("-", 1)[1])
    return s.stage_status[index] if index < len(s.stage_status) else None


def _cluster_toml(s: Session) -> str:
    return cluster_toml(s)


def elapsed_since(wall_time: float) -> float:
    """Seconds since a wall-clock time (faults carry time.time())."""
    return max(0.0, time.time() - wall_time)


__all__ = ["Recovery", "backoff", "fault_pause", "follow_resume", "ordered", "recovery_steps", "stage_moved",
           "step_prefix"]
