"""Ordered, all-or-nothing launch and complete teardown of a session (the I/O edge).

Launch: every stage in ascending order, each waited for until its transport port listens;
then the coordinator, waited for until it answers healthy (its probe generations went
through every stage: prefill, sampling, batched decode); then ONE router backend, waited for
until the router routes to it (`register`: a session is Healthy only once a request through
the router reaches it). Any failure stops what was started, in reverse order, and removes the
router entry. Each step is reported as a `LaunchStepped` event.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.control.coordinator_client import CoordinatorClient
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.lease import LEASE_S, renew_every
from orchestrator.control.rules.process_ends import ended
from orchestrator.control.rules.session_toml import cluster_toml
from orchestrator.control.rules.state import Session
from orchestrator.control.rules.timelines import timeline
from orchestrator.proc.clock import SYSTEM_CLOCK, Clock
from orchestrator.proc.wait import WaitTimeout, wait_until
from orchestrator.registrar import Registrar, RegistrarError, RouteState

Post = Callable[[ev.Event], None]
Report = Callable[[str, str], None]  # (step state, detail) of the step a caller reports

HEALTHY_POLL_S = 1.0  # longest wait on the coordinator's /health long poll between process checks
ROUTABLE_POLL_S = 0.2  # between looks at the router (it probes a new backend every second at most)


@dataclass(frozen=True)
class Timeouts:
    """How long each wait may take (seconds)."""

    listen: float = 180.0  # a stage loads its layers before it listens
    healthy: float = 120.0
    stop: float = 10.0
    lease: float = LEASE_S  # control/rules/lease.py: why this long
    # the router reloads its file and needs `healthy_threshold` probes (each at most 1 s apart
    # for a new backend) before it routes: seconds, so a minute means it never will
    routable: float = 60.0


class LaunchFailed(RuntimeError):
    """A launch step failed; `key` names the step."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key




class Launcher:
    """Runs one session's launch or teardown; one instance per worker thread."""

    def __init__(self, session: Session, agents: dict[str, AgentClient], registrar: Registrar, post: Post,
                 timeouts: Timeouts = Timeouts(), cancel: threading.Event | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.s = session
        self.agents = agents
        self.registrar = registrar
        self.post = post
        self.t = timeouts
        self.cancel = cancel or threading.Event()
        self.clock = clock
        self.started: list[tuple[str, str]] = []  # (node_id, process node id) in start order
        self.secret: str | None = None  # the cluster secret, once known: health looks carry its control token

    def _step(self, key: str, state: str, detail: str = "") -> None:
        self.post(ev.LaunchStepped(session_id=self.s.id, key=key, state=state, detail=detail))

    def launch(self, model_id: str, secret: str, transport: str = "tcp") -> bool:
        """Run every step; on failure roll back. Returns whether the session is up."""
        key = "stage-0.start"
        self.secret = secret
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
            self.register(lambda state, detail: self._step("router.register", state, detail))
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
        last_renew = self.clock.monotonic()
        port = None

        def listening() -> bool:
            nonlocal last_renew, port
            info = self.agents[node_id].process(self.s.id, process_id)
            port = info.port
            if not info.alive:
                tail = "\n".join(self.agents[node_id].logs(self.s.id, process_id, 8))
                raise LaunchFailed(process_id, f"{process_id} exited ({ended(info)}): {tail}")
            if info.port_listening:
                return True
            if self.cancel.is_set():
                raise LaunchFailed(process_id, "launch cancelled")
            if self.clock.monotonic() - last_renew > renew_every(self.t.lease):
                self._renew()
                last_renew = self.clock.monotonic()
            return False

        try:
            wait_until(listening, timeout, 0.1, message=f"{process_id} listening", clock=self.clock)
        except WaitTimeout:
            raise LaunchFailed(process_id, f"{process_id} not listening on port {port} after {timeout:.0f} s") from None

    def wait_healthy(self) -> None:
        """Until the coordinator says ready (its probe passed through every stage); LaunchFailed otherwise."""
        last_renew = self.clock.monotonic()
        reason, status = "no answer", None
        client = CoordinatorClient(self.s.url, self.secret)

        def ready() -> bool:
            nonlocal last_renew, reason, status
            # A stage dying now would leave the coordinator waiting: check them all, not just it.
            for node_id, process_id in self.started:
                info = self.agents[node_id].process(self.s.id, process_id)
                if not info.alive:
                    tail = "\n".join(self.agents[node_id].logs(self.s.id, process_id, 8))
                    raise LaunchFailed(process_id, f"{process_id} exited ({ended(info)}): {tail}")
            asked = self.clock.monotonic()
            # A long poll: answered the moment the coordinator's state changes (ready, most
            # often), not at this loop's next look; at most HEALTHY_POLL_S, so a process that
            # died meanwhile is still noticed by the check above.
            look = client.health(HEALTHY_POLL_S + 2, HEALTHY_POLL_S, status)
            report = look.report
            if report is None:  # busy or silent: no verdict, ask again
                reason, status, changed = look.error, None, False
            else:
                if report.ready:
                    return True
                changed, status = report.status != status, report.status
                reason = f"{report.status}: {report.reason}"
                if report.status == "unhealthy" and "probe generation failed" in report.reason:
                    # Ready means serving: a stage that cannot run a request fails the launch now.
                    raise LaunchFailed("coordinator", f"the pipeline cannot serve: {report.reason}")
            if self.cancel.is_set():
                raise LaunchFailed("coordinator", "launch cancelled")
            if self.clock.monotonic() - last_renew > renew_every(self.t.lease):
                self._renew()
                last_renew = self.clock.monotonic()
            if not changed and self.clock.monotonic() - asked < 0.1:
                self.clock.sleep(0.1)  # not up yet, or it did not wait (an older coordinator): no busy loop
            return False

        try:  # the long poll paces the looks: no interval of its own
            wait_until(ready, self.t.healthy, 0.0, message="the coordinator healthy", clock=self.clock)
        except WaitTimeout:
            raise LaunchFailed("coordinator",
                               f"coordinator not healthy after {self.t.healthy:.0f} s ({reason})") from None

    def register(self, report: Report) -> None:
        """Write the session's router entry, then wait until the router routes to it.

        `report(state, detail)` tells the caller's timeline step what happens: "running" with
        the router's state each time it changes, "done" once it routes. LaunchFailed (naming
        the router, the backend and the state it last reported) when it does not in time.
        Without a router URL (a file written for a router nobody named) nothing can be asked:
        the step ends once the entry is written, and says so.
        """
        name, url, model = self.s.name, self.s.url + "/v1", self.s.model_name
        self.registrar.register(name, url, [model])
        self.post(ev.SessionRegistered(session_id=self.s.id, registered=True))
        router = self.registrar.router_url
        if router is None:
            report("done", f"{name}: entry written; routing not confirmed (no router URL to ask)")
            return
        last_renew = self.clock.monotonic()
        last = RouteState(False, "not asked yet")

        def routable() -> bool:
            nonlocal last, last_renew
            if self.cancel.is_set():
                raise LaunchFailed("router", "launch cancelled")
            now = self.registrar.route_state(name, url, model)
            if now.state != last.state and not now.routable:  # one step update per change, not per look
                report("running", f"{name}: entry written; {router} says {now.describe()}")
            last = now
            if self.clock.monotonic() - last_renew > renew_every(self.t.lease):
                self._renew()
                last_renew = self.clock.monotonic()
            return now.routable

        try:
            wait_until(routable, self.t.routable, ROUTABLE_POLL_S, message="the router to route", clock=self.clock)
        except WaitTimeout:
            raise LaunchFailed("router", f"the router at {router} does not route to backend {name!r} ({url}) after "
                                         f"{self.t.routable:.0f} s; it last reported: {last.describe()}") from None
        report("done", f"{name}: routed by {router}")

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
