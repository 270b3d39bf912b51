"""Ordered, all-or-nothing launch and complete teardown of a session (the I/O edge).

Launch: every stage in ascending order, each waited for until its transport port listens;
then the coordinator, waited for until it answers healthy (its probe generations went
through every stage: prefill, sampling, batched decode); then ONE router backend. Any failure stops what was started, in reverse
order, and removes the router entry. Each step is reported as a `LaunchStepped` event.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import requests

from ..agent.client import AgentClient, AgentError
from ..engine.config import ClusterConfig
from ..planner.cluster_toml import engine_address, render_cluster_toml
from ..registrar import Registrar, RegistrarError
from . import events as ev
from .state import Session, Step

Post = Callable[[ev.Event], None]

HEALTHY_POLL_S = 1.0  # longest wait on the coordinator's /health long poll between process checks


@dataclass(frozen=True)
class Timeouts:
    """How long each wait may take (seconds)."""

    listen: float = 180.0  # a stage loads its layers before it listens
    healthy: float = 120.0
    stop: float = 10.0
    lease: float = 15.0


class LaunchFailed(RuntimeError):
    """A launch step failed; `key` names the step."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def timeline(session: Session) -> tuple[Step, ...]:
    """The launch steps of a session, all pending (pure)."""
    steps: list[Step] = []
    if session.transport:
        # decided by the plan before anything starts: what the stages bind on, and why a
        # requested backend does not run (e.g. rdma → tcp)
        steps.append(Step(key="transport", label=session.transport, state="done", detail=session.transport_fallback))
    for st in session.stages:
        steps.append(Step(key=f"stage-{st.index}.start", label=f"Stage {st.index} starting on {st.node_name} "
                                                               f"(layers {st.first_layer}–{st.last_layer})"))
        steps.append(Step(key=f"stage-{st.index}.listen", label=f"Stage {st.index} transport listening on port {st.port}"))
    steps.append(Step(key="coordinator.start", label="Coordinator starting"))
    steps.append(Step(key="coordinator.healthy", label="Coordinator healthy (a probe generation through every stage)"))
    steps.append(Step(key="router.register", label="Router registered"))
    return tuple(steps)


def cluster_toml(session: Session, transport: str = "tcp") -> str:
    """The engine's cluster TOML (docs/architecture.md, "Contracts"; `engine/config.py`) for a
    session without a plan's TOML (single-node sessions); validated as a ClusterConfig and
    written by the planner's one TOML writer."""
    nodes: list[dict[str, object]] = [{"id": "coordinator", "role": "hybrid",
                                       "address": engine_address(session.coordinator_host, session.coordinator_port)}]
    nodes += [{"id": f"stage-{st.index}", "role": "pipeline_stage", "address": engine_address(st.host, st.port),
               "stage": st.index, "layers": f"{st.first_layer}-{st.last_layer}"} for st in session.stages]
    config = ClusterConfig.model_validate({"cluster": {
        "name": session.name, "pipeline_parallel_size": len(session.stages), "tensor_parallel_size": 1,
        "transport_backend": transport}, "nodes": nodes})  # a bug here fails before anything starts
    return render_cluster_toml(config)


class Launcher:
    """Runs one session's launch or teardown; one instance per worker thread."""

    def __init__(self, session: Session, agents: dict[str, AgentClient], registrar: Registrar, post: Post,
                 timeouts: Timeouts = Timeouts(), cancel: threading.Event | None = None) -> None:
        self.s = session
        self.agents = agents
        self.registrar = registrar
        self.post = post
        self.t = timeouts
        self.cancel = cancel or threading.Event()
        self.started: list[tuple[str, str]] = []  # (node_id, process node id) in start order

    def _step(self, key: str, state: str, detail: str = "") -> None:
        self.post(ev.LaunchStepped(session_id=self.s.id, key=key, state=state, detail=detail))

    def launch(self, model_id: str, secret: str, transport: str = "tcp") -> bool:
        """Run every step; on failure roll back. Returns whether the session is up."""
        key = "stage-0.start"
        try:
            toml = self.s.config_toml or cluster_toml(self.s, transport)
            for st in self.s.stages:
                key = f"stage-{st.index}.start"
                self._step(key, "running")
                self.start_process(st.node_id, "stage", f"stage-{st.index}", model_id, toml, secret)
                self._step(key, "done", f"pid on {st.node_name}")
                key = f"stage-{st.index}.listen"
                self._step(key, "running")
                self.wait_listening(st.node_id, f"stage-{st.index}", self.t.listen)
                self._step(key, "done")
            key = "coordinator.start"
            self._step(key, "running")
            self.start_process(self.s.coordinator_node, "coordinator", "coordinator", model_id, toml, secret)
            self._step(key, "done", self.s.url)
            key = "coordinator.healthy"
            self._step(key, "running")
            self.wait_healthy()
            self._step(key, "done")
            key = "router.register"
            self._step(key, "running")
            self.registrar.register(self.s.name, self.s.url + "/v1", [self.s.model_name])
            self.post(ev.SessionRegistered(session_id=self.s.id, registered=True))
            self._step(key, "done", self.s.name)
            return True
        except (LaunchFailed, AgentError, RegistrarError, OSError, ValueError) as exc:
            self._step(key, "failed", str(exc))
            self.rollback(failed_key=key)
            return False

    def start_process(self, node_id: str, kind: str, process_id: str, model_id: str, toml: str, secret: str) -> None:
        """Ask the node's agent to start one engine process (remembered for rollback)."""
        if self.cancel.is_set():
            raise LaunchFailed(process_id, "launch cancelled")
        request = {"kind": kind, "cluster_id": self.s.id, "node_id": process_id, "model_id": model_id,
                   "config": toml, "secret": secret, "lease_s": self.t.lease, "model_name": self.s.model_name}
        if kind == "coordinator":
            request.update(http_host=self.s.coordinator_host, http_port=self.s.coordinator_port)
        self.agents[node_id].start_process(request)
        self.started.append((node_id, process_id))

    def _renew(self) -> None:
        for node_id in {n for n, _ in self.started}:
            try:
                self.agents[node_id].renew_lease(self.s.id, self.t.lease)
            except AgentError:
                pass  # the wait below notices a dead agent through its own calls

    def wait_listening(self, node_id: str, process_id: str, timeout: float) -> None:
        """Until the process's transport port listens; LaunchFailed (with its last output) if it exits."""
        deadline = time.monotonic() + timeout
        last_renew = time.monotonic()
        while True:
            info = self.agents[node_id].process(self.s.id, process_id)
            if not info.alive:
                tail = "\n".join(self.agents[node_id].logs(self.s.id, process_id, 8))
                raise LaunchFailed(process_id, f"{process_id} exited ({info.exit_code or info.signal}): {tail}")
            if info.port_listening:
                return
            if time.monotonic() > deadline:
                raise LaunchFailed(process_id, f"{process_id} not listening on port {info.port} after {timeout:.0f} s")
            if self.cancel.is_set():
                raise LaunchFailed(process_id, "launch cancelled")
            if time.monotonic() - last_renew > self.t.lease / 3:
                self._renew()
                last_renew = time.monotonic()
            time.sleep(0.1)

    def wait_healthy(self) -> None:
        """Until the coordinator says ready (its probe passed through every stage); LaunchFailed otherwise."""
        deadline = time.monotonic() + self.t.healthy
        last_renew = time.monotonic()
        reason, status = "no answer", None
        while time.monotonic() < deadline:
            # A stage dying now would leave the coordinator waiting: check them all, not just it.
            for node_id, process_id in self.started:
                info = self.agents[node_id].process(self.s.id, process_id)
                if not info.alive:
                    tail = "\n".join(self.agents[node_id].logs(self.s.id, process_id, 8))
                    raise LaunchFailed(process_id, f"{process_id} exited ({info.exit_code or info.signal}): {tail}")
            asked = time.monotonic()
            try:
                # A long poll: answered the moment the coordinator's state changes (ready, most
                # often), not at this loop's next look; at most HEALTHY_POLL_S, so a process that
                # died meanwhile is still noticed by the check above.
                params = {"wait": HEALTHY_POLL_S, "unless": status} if status else {}
                r = requests.get(self.s.url + "/health", params=params, timeout=HEALTHY_POLL_S + 2)
                body = r.json()
                if r.status_code == 200 and body.get("ready"):
                    return
                changed, status = body.get("status") != status, body.get("status")
                reason = f"{body.get('status')}: {body.get('reason')}"
                if body.get("status") == "unhealthy" and "probe generation failed" in str(body.get("reason")):
                    # Ready means serving: a stage that cannot run a request fails the launch now.
                    raise LaunchFailed("coordinator", f"the pipeline cannot serve: {body.get('reason')}")
            except (requests.RequestException, ValueError) as exc:
                reason, status, changed = str(exc), None, False
            if self.cancel.is_set():
                raise LaunchFailed("coordinator", "launch cancelled")
            if time.monotonic() - last_renew > self.t.lease / 3:
                self._renew()
                last_renew = time.monotonic()
            if not changed and time.monotonic() - asked < 0.1:
                time.sleep(0.1)  # not up yet, or it did not wait (an older coordinator): no busy loop
        raise LaunchFailed("coordinator", f"coordinator not healthy after {self.t.healthy:.0f} s ({reason})")

    def rollback(self, failed_key: str | None = None) -> list[str]:
        """Stop everything started, newest first, and remove the router entry; returns problems left."""
        problems = self.teardown()
        reached = False
        for st in timeline(self.s):
            if st.key == "transport":
                continue  # a decision, not something started
            if st.key == failed_key:
                reached = True
                continue
            if not reached:
                self._step(st.key, "rolled_back")
            else:
                self._step(st.key, "skipped")
        return problems

    def teardown(self) -> list[str]:
        """Deregister first (no traffic to a dying pipeline), then stop processes newest first."""
        problems: list[str] = []
        try:
            self.registrar.deregister(self.s.name)
            self.post(ev.SessionRegistered(session_id=self.s.id, registered=False))
        except RegistrarError as exc:
            problems.append(f"router: {exc}")
        targets = self.started or [(self.s.coordinator_node, "coordinator")] + [
            (st.node_id, f"stage-{st.index}") for st in reversed(self.s.stages)]
        for node_id, process_id in reversed(self.started) if self.started else targets:
            try:
                self.agents[node_id].stop_process(self.s.id, process_id, self.t.stop)
            except AgentError as exc:
                if exc.status != 404:  # 404: never started or already gone
                    problems.append(f"{process_id} on {node_id}: {exc.message}")
        return problems
