"""The Orchestrator: one thread owns the control-plane state; everything else talks to it.

Commands (from the dashboard, tests or Python) and events (from workers) arrive through
one inbox. Events are applied with the pure `transitions.apply`, persisted when they touch
what must survive a restart, published to every subscriber, and may start workers
(launch, teardown, recovery, prepare), which do the I/O and answer with more events.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import logs
from ..agent.client import AgentClient, AgentError
from ..registrar import Registrar
from . import events as ev
from . import store
from .commands import CommandRefused, agent_url, new_session_id
from .launcher import Launcher, Timeouts, timeline
from .state import Node, Session, Settings, State
from .transitions import apply

if TYPE_CHECKING:
    from .download_state import HubRef
    from ..planner import Plan, Refusal

PERSISTED = {"settings_changed", "node_registered", "node_removed", "session_created", "launch_stepped",
             "session_registered", "session_faulted", "health_changed", "session_removed", "post_mortem_recorded",
             "recovery_failed", "session_recovered", "stage_moved"}


class Orchestrator:
    """The control plane, drivable headless: `start()`, commands, `state`, `subscribe()`."""

    def __init__(self, state_dir: Path, registrar: Registrar, *, timeouts: Timeouts = Timeouts(),
                 watch_interval: float = 0.5, lease_s: float = 15.0, agent_timeout: float = 10.0,
                 discovery_interfaces: list[str] | None = None, discovery: bool = False) -> None:
        self.state_dir = Path(state_dir)
        self.registrar = registrar
        self.timeouts = Timeouts(timeouts.listen, timeouts.healthy, timeouts.stop, lease_s)
        self.bus = ev.EventBus()
        self.log = logs.get("orchestrator")
        self._state = State()
        self._inbox: queue.Queue = queue.Queue()
        self._clients: dict[tuple[str, str], AgentClient] = {}
        self._clients_lock = threading.Lock()
        self._cancels: dict[str, threading.Event] = {}  # session id -> cancel flag of its launch or recovery
        from .secrets import SecretStore

        self.secrets = SecretStore(self.state_dir)
        self._thread: threading.Thread | None = None
        self.agent_timeout = agent_timeout
        self._discovery = discovery
        self._discovery_interfaces = discovery_interfaces
        self._browser = None
        from .watcher import Watcher

        self.watcher = Watcher(lambda: self._state, self.agent, self.post, watch_interval, lease_s)
        from .models import ModelManager

        self.models = ModelManager(self)  # Models tab: hub downloads, single-node serving, deletion

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> "Orchestrator":
        """Load persisted state, start the thread and the watcher, and recover live sessions."""
        self._state = store.load(self.state_dir)
        self._thread = threading.Thread(target=self._run, name="orchestrator", daemon=True)
        self._thread.start()
        for s in self._state.sessions:
            self._spawn(self._recover, s)
        self.watcher.start()
        self.models.resume()  # downloads that were running when the dashboard stopped
        if self._discovery:
            from ..agent.discovery import NodeBrowser

            self._browser = NodeBrowser(self._discovery_interfaces, on_change=self._discovered).start()
        return self

    def _discovered(self, change: str, node: Any) -> None:
        """Zeroconf callback (its own thread): discovery is a hint, posted as an event."""
        if change == "removed":
            self.post(ev.NodeVanished(fingerprint=node.fingerprint))
        else:
            from .state import DiscoveredNode

            self.post(ev.NodeDiscovered(node=DiscoveredNode(fingerprint=node.fingerprint, name=node.name, url=node.url,
                                                            accelerator=node.accelerator, models=tuple(node.models))))

    def stop(self) -> None:
        """Stop the thread and the watcher (running sessions keep running; leases keep them honest)."""
        self.watcher.stop()
        self.models.stop()  # downloads go on in the agents; the next start follows them again
        if self._browser is not None:
            self._browser.close()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(5)

    @property
    def state(self) -> State:
        """The latest immutable snapshot."""
        return self._state

    def subscribe(self) -> queue.Queue:
        """A queue receiving every event applied from now on."""
        return self.bus.subscribe()

    def post(self, event: ev.Event) -> None:
        """Hand an event to the orchestrator thread (any thread)."""
        self._inbox.put(event)

    def agent(self, node_id: str) -> AgentClient | None:
        """An agent client for a registered node (cached per url and credential)."""
        node = self._state.node(node_id)
        if node is None:
            return None
        key = (node.url, node.credential)
        with self._clients_lock:
            if key not in self._clients:
                self._clients[key] = AgentClient(node.url, node.credential, timeout=self.agent_timeout)
            return self._clients[key]

    # --- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            if isinstance(item, ev.Event):
                self._apply(item)
            else:
                fn, future = item
                try:
                    future.set_result(fn())
                except Exception as exc:  # handed back to the caller, never kills the thread
                    future.set_exception(exc)

    def _call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run fn on the orchestrator thread and return its result (or raise its exception)."""
        future: Future = Future()
        self._inbox.put((fn, future))
        return future.result(timeout)

    def _apply(self, event: ev.Event) -> None:
        old = self._state
        new = apply(old, event)
        if new is old:
            return
        self._state = new
        if event.kind in PERSISTED:
            try:
                store.save(self.state_dir, new)
            except OSError as exc:
                self.log.error("state.save_failed", reason=exc)
        self.bus.publish(event)
        self._react(old, new, event)

    def _react(self, old: State, new: State, event: ev.Event) -> None:
        """Side effects that follow from a state change: a fault starts a recovery attempt (after
        its backoff) or, when none may follow, the teardown."""
        if isinstance(event, (ev.SessionFaulted, ev.RecoveryFailed)):
            s, before = new.session(event.session_id), old.session(event.session_id)
            if s is None or before is None or before.phase not in ("running", "recovering"):
                return
            if s.phase == "stopping":
                self.log.warning("session.unhealthy", session=s.id, reason=s.reason)
                self._spawn(self._teardown, s, "Unhealthy", s.reason)
            elif s.phase == "recovering":
                self.log.warning("session.recovering", session=s.id, reason=s.reason, attempt=s.recovery_attempt)
                self._cancels.setdefault(s.id, threading.Event())
                self._spawn(self._recover_processes, s)

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=fn, args=args, name=fn.__name__.strip("_"), daemon=True).start()

    # --- settings and nodes -----------------------------------------------------------
    def update_settings(self, settings: Settings) -> Settings:
        """Validate and store settings."""
        if settings.port_start > settings.port_end:
            raise CommandRefused(f"transport port range {settings.port_start}–{settings.port_end}: start must not exceed end")
        self._call(lambda: self._apply(ev.SettingsChanged(settings=settings)))
        return settings

    def register_node(self, address: str, token: str) -> Node:
        """Pair with an agent (its pairing token) and add it; re-registering replaces the entry."""
        url = agent_url(address)
        client = AgentClient(url, timeout=10.0)
        try:
            paired = client.pair(token.strip(), label="pipeserve control plane")
            report = AgentClient(url, paired.credential, timeout=10.0).report()
        except AgentError as exc:
            raise CommandRefused(f"could not register {address}: {exc.message}") from None
        finally:
            client.close()
        node = Node(id=paired.fingerprint, name=paired.name, url=url, credential=paired.credential,
                    last_seen=time.time(), report=report)
        self._call(lambda: self._apply(ev.NodeRegistered(node=node)))
        self.log.info("node.registered", node=node.name, url=url)
        return node

    def remove_node(self, node_id: str) -> None:
        """Forget a node; refused while a live session runs on it."""
        def remove() -> None:
            node = self._state.node(node_id)
            if node is None:
                raise CommandRefused(f"no registered node {node_id!r}")
            users = [s.name for s in self._state.sessions if node_id in s.node_ids]
            if users:
                raise CommandRefused(f"node {node.name} serves {', '.join(users)}: stop it first")
            self._apply(ev.NodeRemoved(node_id=node_id))
        self._call(remove)

    # --- preparation --------------------------------------------------------------------
    def prepare(self, model_id: str, node_ids: list[str], hub: "HubRef | None" = None) -> None:
        """Start getting the model onto every node (progress arrives as events); when no node has
        it yet and `hub` is given, one node downloads it from the hub and the others copy it."""
        def check() -> dict[str, AgentClient]:
            prep = self._state.preparation
            if prep is not None and not prep.finished:
                raise CommandRefused(f"already preparing {prep.model_id}")
            missing = [n for n in node_ids if self._state.node(n) is None]
            if missing or not node_ids:
                raise CommandRefused(f"unknown nodes: {', '.join(missing)}" if missing else "select at least one node")
            return {n: self.agent(n) for n in node_ids}
        targets = self._call(check)
        everyone = {n.id: self.agent(n.id) for n in self._state.nodes if n.id not in targets}
        names = {n.id: n.name for n in self._state.nodes}
        from .preparer import prepare

        self._spawn(prepare, model_id, targets, everyone, self.post, names, hub)

    # --- plans and sessions --------------------------------------------------------------
    def preview_plan(self, model_id: str, node_ids: list[str], context_length: int = 4096, concurrency: int = 4,
                     manual_split: list[tuple[int, int]] | None = None, *, measure: bool = True) -> "Plan | Refusal":
        """Plan (read-only; nothing starts) and show the result to every viewer; with `measure`,
        links and layer timings the plan lacks are measured in the background and the plan is
        previewed again with its prediction (control/perf.py)."""
        from .planning import PlanningError, plan_for, plan_settings

        state = self._state
        try:
            result = plan_for(state, model_id, node_ids,
                              plan_settings(state.settings, context_length, concurrency, manual_split))
        except PlanningError as exc:
            raise CommandRefused(str(exc)) from None
        self.post(ev.PlanPreviewed(model_id=model_id, node_ids=tuple(node_ids),
                                   plan={"context_length": context_length, **result.model_dump(mode="json")}))
        if measure:
            from .perf import refresh_after_preview

            self._spawn(refresh_after_preview, self, model_id, list(node_ids), (context_length, concurrency, manual_split))
        return result

    def launch_cluster(self, model_id: str, node_ids: list[str], context_length: int = 4096, concurrency: int = 4,
                       manual_split: list[tuple[int, int]] | None = None) -> Session:
        """Plan and launch a cluster; refused (CommandRefused) when the planner refuses or nodes are not ready."""
        from ..planner import Refusal, plan_to_cluster_toml
        from .planning import session_from_plan, session_name

        prep = self._state.preparation
        if prep is None or prep.model_id != model_id or not prep.ready or \
                not set(node_ids) <= {n.node_id for n in prep.nodes}:
            raise CommandRefused("prepare the model on every selected node first (all must be Present and verified)")
        plan = self.preview_plan(model_id, node_ids, context_length, concurrency, manual_split, measure=False)
        if isinstance(plan, Refusal):
            raise CommandRefused("; ".join(r.message for r in plan.reasons))
        hosts = {n.id: n.host for n in self._state.nodes}
        toml = plan_to_cluster_toml(plan, session_name(model_id, len(plan.stages)), hosts=hosts)
        return self.launch(session_from_plan(plan, self._state, new_session_id(), model_id, toml), model_id)

    def launch_single(self, model_id: str, node_id: str) -> Session:
        """Serve the whole model from one node (the baseline session, same machinery)."""
        from .planning import PlanningError, single_session

        try:
            session = single_session(self._state, new_session_id(), model_id, node_id)
        except PlanningError as exc:
            raise CommandRefused(str(exc)) from None
        return self.launch(session, model_id)

    def launch(self, session: Session, model_id: str) -> Session:
        """Create a session from placements (see `planning`) and launch it in the background."""
        def create() -> Session:
            for nid in session.node_ids:
                node = self._state.node(nid)
                if node is None:
                    raise CommandRefused(f"node {nid!r} is not registered")
            busy = {s.name for s in self._state.sessions if s.name == session.name}
            if busy:
                raise CommandRefused(f"a session named {session.name!r} is already live: stop it first")
            # The plan decided the transport and why it may differ from the setting
            # (session_from_plan); a single-node session has no boundary between nodes.
            created = session.model_copy(update={"timeline": timeline(session), "created_at": time.time()})
            self._apply(ev.SessionCreated(session=created))
            self._cancels[created.id] = threading.Event()
            return created
        created = self._call(create)
        secret = secrets.token_hex(24)
        self.secrets.put(created.id, secret)  # a replaced stage rejoins with it
        self._spawn(self._launch, created, model_id, self._cancels[created.id], secret)
        return created

    def stop_session(self, session_id: str) -> None:
        """Stop a session: the same teardown as an unhealthy cluster, reason "stopped"."""
        def stop() -> Session | None:
            s = self._state.session(session_id)
            if s is None or s.phase not in ("launching", "running", "recovering"):
                raise CommandRefused(f"no live session {session_id!r}")
            if s.phase == "launching":
                self._cancels[session_id].set()  # the launcher rolls back and reports
                return None
            if s.phase == "recovering":
                self._cancels.setdefault(session_id, threading.Event()).set()  # no further start
            self._apply(ev.HealthChanged(session_id=s.id, health=s.health, phase="stopping", reason="stop requested"))
            return s
        s = self._call(stop)
        if s is not None:
            self._spawn(self._teardown, s, "Stopped", "stopped by request")

    def wait(self, predicate: Callable[[State], bool], timeout: float = 60.0) -> State:
        """Block until predicate(state) holds (for tests and scripts); raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while not predicate(self._state):
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not reached within {timeout} s")
            time.sleep(0.02)
        return self._state

    # --- workers (I/O) ------------------------------------------------------------------
    def _agents_for(self, s: Session) -> dict[str, AgentClient]:
        agents = {nid: self.agent(nid) for nid in s.node_ids}
        return {k: v for k, v in agents.items() if v is not None}

    def _launch(self, s: Session, model_id: str, cancel: threading.Event, secret: str) -> None:
        launcher = Launcher(s, self._agents_for(s), self.registrar, self.post, self.timeouts, cancel)
        ok = launcher.launch(model_id, secret, "tcp")
        if ok and not cancel.is_set():
            self.post(ev.HealthChanged(session_id=s.id, health="Healthy", phase="running", reason="serving"))
            return
        if ok:  # stopped while the last step finished: take it down again
            launcher.teardown()
        failed = next((st for st in self._state.session(s.id).timeline if st.state == "failed"), None)
        reason = "launch cancelled" if cancel.is_set() else (
            f"launch failed at “{failed.label}”: {failed.detail}" if failed else "launch failed")
        self.post(ev.HealthChanged(session_id=s.id, health="Stopped", phase="failed", reason=reason))
        self.post(ev.SessionRemoved(session_id=s.id, reason=reason))

    def _teardown(self, s: Session, health: str, reason: str) -> None:
        problems = Launcher(s, self._agents_for(s), self.registrar, self.post, self.timeouts).teardown()
        if problems:
            self.log.error("teardown.incomplete", session=s.id, problems="; ".join(problems))
            reason = f"{reason} (cleanup problems: {'; '.join(problems)})"
        self.post(ev.HealthChanged(session_id=s.id, health=health, phase="stopped", reason=reason))
        self.post(ev.SessionRemoved(session_id=s.id, reason=reason))
        self.secrets.keep_only({x.id for x in self._state.sessions if x.id != s.id})

    def _recover_processes(self, s: Session) -> None:
        """One recovery attempt (after its backoff); reports SessionRecovered or RecoveryFailed."""
        from .recovery import Recovery, backoff, elapsed_since

        cancel = self._cancels[s.id]
        if cancel.wait(backoff(s.recovery_attempt)):
            return  # stopped meanwhile: stop_session tears it down
        secret = self.secrets.get(s.id)
        if secret is None:
            self.post(ev.RecoveryFailed(session_id=s.id, final=True,
                                        reason="the cluster secret of this session is not known here"))
            return
        fault = s.faults[-1]
        problem = Recovery(s, fault.processes, self._agents_for(s), self.registrar, self.post, self.timeouts, secret,
                           cancel, state=self._state, agent_for=self.agent).run()  # state: where a stage may move
        if cancel.is_set():
            return
        if problem:
            self.log.warning("session.recovery_failed", session=s.id, attempt=s.recovery_attempt, reason=problem)
            self.post(ev.RecoveryFailed(session_id=s.id, reason=problem))
        else:
            seconds = elapsed_since(fault.at)
            self.log.info("session.recovered", session=s.id, processes=",".join(fault.processes), seconds=seconds)
            self.post(ev.SessionRecovered(session_id=s.id, seconds=seconds))

    def _recover(self, s: Session) -> None:
        """After a restart: re-adopt a session that is still healthy, repair one with a known
        culprit (as if the fault had been seen live), clean up the rest."""
        _, problem, culprits = self.watcher.inspect(s)
        if s.phase == "recovering":  # the dashboard went away mid-recovery: carry on with it
            self._cancels.setdefault(s.id, threading.Event())
            self._recover_processes(s)
            return
        if s.phase == "running" and problem and culprits and self._state.settings.auto_restart:
            # A fault while the dashboard was away (or a process still settling): replace the
            # culprit, the others keep their processes — tearing down a whole cluster for it
            # would turn one lost process into an outage.
            self.log.warning("session.faulted_while_away", session=s.id, reason=problem)
            self.post(ev.SessionFaulted(session_id=s.id, reason=f"seen after a dashboard restart: {problem}",
                                        processes=culprits, at=time.time()))
            return
        if s.phase == "running" and not problem:
            try:
                self.registrar.register(s.name, s.url + "/v1", [s.model_name])  # by name: never twice
                self.post(ev.SessionRegistered(session_id=s.id, registered=True))
            except Exception as exc:  # noqa: BLE001 (any registrar failure means: not adopted)
                problem = f"router registration failed: {exc}"
            else:
                self.log.info("session.readopted", session=s.id)
                self.post(ev.HealthChanged(session_id=s.id, health="Healthy", phase="running",
                                           reason="re-adopted after a dashboard restart"))
                return
        reason = f"cleaned up after a dashboard restart: {problem or 'it was ' + s.phase}"
        self.post(ev.HealthChanged(session_id=s.id, health="Unhealthy", phase="stopping", reason=reason))
        self._teardown(s, "Unhealthy", reason)


__all__ = ["CommandRefused", "Orchestrator", "agent_url", "new_session_id"]
