"""The Orchestrator: one thread owns the control-plane state; everything else talks to it.

Commands (`commands.py`, from the dashboard, tests or Python) and events (from workers)
arrive through one inbox. On the thread, a command is decided by the pure `decide.decide`
against the state of that moment — every rule lives there, none on the caller's thread —
into events and effects. Each event is applied with the pure `transitions.apply`, saved when
its class is `persisted`, published to every subscriber, and may call for more effects
(`decide.react`). Effects go to the one `effects.EffectRunner`, whose workers do the I/O and
answer with more events.

The public methods keep the shape the dashboard, the Models tab and the tests call: each
builds a command, waits for its decision, and returns what the decision created.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import socket
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlsplit

from orchestrator import logs
from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.agent.discovery import NodeBrowser
from orchestrator.control import store
from orchestrator.control.bus import EventBus
from orchestrator.control.capabilities import Capabilities
from orchestrator.control.effects import EffectRunner
from orchestrator.control.launcher import Timeouts
from orchestrator.control.models import ModelManager
from orchestrator.control.rules import audit
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.commands import (
    AddNode,
    Command,
    CommandRefused,
    LaunchCluster,
    LaunchSession,
    LaunchSingle,
    PrepareModel,
    PreviewPlan,
    RemoveNode,
    StopSession,
    UpdateSettings,
    new_session_id,
)
from orchestrator.control.rules.decide import Decision, decide, react
from orchestrator.control.rules.lease import LEASE_S
from orchestrator.control.rules.state import DiscoveredNode, Node, Session, Settings, State
from orchestrator.control.rules.transitions import apply
from orchestrator.control.secrets import SecretStore
from orchestrator.control.watcher import Watcher
from orchestrator.proc.clock import SYSTEM_CLOCK
from orchestrator.proc.wait import WaitTimeout, wait_until
from orchestrator.registrar import Registrar

if TYPE_CHECKING:
    from orchestrator.control.rules.download_state import HubRef
    from orchestrator.planner import Plan, Refusal


class Orchestrator:
    """The control plane, drivable headless: `start()`, commands, `state`, `subscribe()`."""

    def __init__(self, state_dir: Path, registrar: Registrar, *, timeouts: Timeouts = Timeouts(),
                 watch_interval: float = 0.5, lease_s: float = LEASE_S, agent_timeout: float = 10.0,
                 discovery_interfaces: list[str] | None = None, discovery: bool = False) -> None:
        self.state_dir = Path(state_dir)
        self.registrar = registrar
        self.timeouts = dataclasses.replace(timeouts, lease=lease_s)
        self.bus = EventBus()
        self.log = logs.get("orchestrator")
        self._state = State()
        self._inbox: queue.Queue = queue.Queue()  # events, and (command, future or None) pairs
        self._clients: dict[tuple[str, str], AgentClient] = {}
        self._clients_lock = threading.Lock()
        self.secrets = SecretStore(self.state_dir)
        self._thread: threading.Thread | None = None
        self.agent_timeout = agent_timeout
        self._discovery = discovery
        self._discovery_interfaces = discovery_interfaces
        self._browser = None
        self.watcher = Watcher(lambda: self._state, self.agent, self.post, watch_interval, lease_s,
                               secret_of=self.secrets.get)
        # What the workers may use of this orchestrator (never the orchestrator itself: control/capabilities.py)
        # (looked up at each call, so what a test replaces on the orchestrator reaches the workers)
        self.caps = Capabilities(state=lambda: self._state, post=lambda e: self.post(e),
                                  submit=lambda c: self.submit(c), command=lambda c: self.command(c),
                                  agent=lambda node_id: self.agent(node_id), registrar=self.registrar,
                                  secrets=self.secrets, timeouts=self.timeouts, clock=SYSTEM_CLOCK, log=self.log)
        self.models = ModelManager(self.caps, self.state_dir, self.launch_single)  # Models tab: downloads, deletion
        self.effects = EffectRunner(self.caps, self.models, self.watcher.inspect, self.watcher.release)

    # --- lifecycle ------------------------------------------------------------------------
    def start(self, *, look: bool = True) -> "Orchestrator":
        """Load persisted state, start the thread and the watcher, and look at live sessions.
        `look=False` starts the thread alone: commands are decided, but nothing reaches out to
        agents, the hub or the network (tests rendering a hand-made state)."""
        self._state = store.load(self.state_dir)
        self._thread = threading.Thread(target=self._run, name="orchestrator", daemon=True)
        self._thread.start()
        if not look:
            return self
        # Held until decide has said what becomes of each (the watcher renews their leases meanwhile)
        self.watcher.hold({s.id for s in self._state.sessions})
        for s in self._state.sessions:
            self.log.info("session.found_after_restart", session=s.id, name=s.name, phase=s.phase,
                          nodes=",".join(s.node_ids))
            self.effects.inspect_after_restart(s)  # re-adopt, relaunch, repair or clean up (decide: ResumeSession)
        self.watcher.start()
        self.models.resume()  # downloads that were running when the dashboard stopped
        if self._discovery:
            self._browser = NodeBrowser(self._discovery_interfaces, on_change=self._discovered).start()
        return self

    def _discovered(self, change: str, node: Any) -> None:
        """Zeroconf callback (its own thread): discovery is a hint, posted as an event."""
        if change == "removed":
            self.post(ev.NodeVanished(fingerprint=node.fingerprint))
        else:
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

    def submit(self, command: Command) -> None:
        """Hand a command to the orchestrator thread without waiting (workers); a refusal is logged."""
        self._inbox.put((command, None))

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
                self._decide(*item)

    def _decide(self, command: Command, future: Future | None) -> None:
        """Decide a command, apply its events, start its effects; the decision (or the refusal,
        or a bug's exception) goes back to the caller, never killing the thread."""
        before = self._state
        try:
            decision = decide(self._state, command)
            for event in decision.events:
                self._apply(event)
            self.effects.run(decision.effects)
        except Exception as exc:  # noqa: BLE001 (handed back to the caller)
            refused = isinstance(exc, CommandRefused)
            self._write(audit.command_line(before, command, refusal=str(exc) if refused else "",
                                           error="" if refused else f"{type(exc).__name__}: {exc}"))
            if future is not None:
                future.set_exception(exc)
            return
        self._write(audit.command_line(before, command, refusal=decision.refusal))
        if future is not None:
            future.set_result(decision)

    def _apply(self, event: ev.Event) -> None:
        old = self._state
        new = apply(old, event)
        if new is old:
            return
        self._state = new
        if event.persisted:
            try:
                store.save(self.state_dir, new)
            except OSError as exc:
                self.log.error("state.save_failed", reason=exc)
        for line in audit.event_lines(old, new, event):
            self._write(line)
        self.bus.publish(event)
        self.effects.run(react(old, new, event))

    def _write(self, line: audit.Line) -> None:
        """One structured line of the audit trail (control/rules/audit.py words it)."""
        level, name, fields = line
        {logging.ERROR: self.log.error, logging.WARNING: self.log.warning}.get(level, self.log.info)(name, **fields)

    def command(self, command: Command, timeout: float = 30.0) -> Decision:
        """Have the thread decide `command` and wait for the decision; raises CommandRefused when it is refused."""
        future: Future = Future()
        self._inbox.put((command, future))
        decision: Decision = future.result(timeout)
        if decision.refusal:
            raise CommandRefused(decision.refusal)
        return decision

    # --- settings and nodes -----------------------------------------------------------
    def update_settings(self, settings: Settings) -> Settings:
        """Validate and store settings."""
        self.command(UpdateSettings(settings))
        return settings

    def register_node(self, address: str, token: str) -> Node:
        """Pair with an agent (its pairing token) and add it; re-registering replaces the entry."""
        url = agent_url(address)
        client = AgentClient(url, timeout=10.0)
        try:  # pairing is I/O: done here, the command carries the paired node
            paired = client.pair(token.strip(), label="pipeserve control plane")
            report = AgentClient(url, paired.credential, timeout=10.0).report()
        except AgentError as exc:
            raise CommandRefused(f"could not register {address}: {exc.message}") from None
        finally:
            client.close()
        node = Node(id=paired.fingerprint, name=paired.name, url=url, credential=paired.credential,
                    last_seen=time.time(), report=report)
        self.command(AddNode(node))
        self.log.info("node.registered", node=node.name, url=url)
        return node

    def remove_node(self, node_id: str) -> None:
        """Forget a node; refused while a live session runs on it."""
        self.command(RemoveNode(node_id))

    # --- preparation --------------------------------------------------------------------
    def prepare(self, model_id: str, node_ids: list[str], hub: "HubRef | None" = None) -> None:
        """Start getting the model onto every node (progress arrives as events); when no node has
        it yet and `hub` is given, one node downloads it from the hub and the others copy it."""
        self.command(PrepareModel(model_id, tuple(node_ids), hub))

    # --- plans and sessions --------------------------------------------------------------
    def preview_plan(self, model_id: str, node_ids: list[str], context_length: int = 4096, concurrency: int = 4,
                     manual_split: list[tuple[int, int]] | None = None, *, measure: bool = True,
                     draft_model: str | None = None) -> "Plan | Refusal":
        """Plan (read-only; nothing starts) and show the result to every viewer; with `measure`,
        links and layer timings the plan lacks are measured in the background and the plan is
        previewed again with its prediction (control/perf.py). `draft_model`: a model id that
        drafts for speculative decoding on the coordinator's node (its memory counted there)."""
        decision = self.command(PreviewPlan(model_id, tuple(node_ids), context_length, concurrency,
                                             _split(manual_split), measure, draft_model=draft_model))
        return _previewed(decision).result

    def launch_cluster(self, model_id: str, node_ids: list[str], context_length: int = 4096, concurrency: int = 4,
                       manual_split: list[tuple[int, int]] | None = None, draft_model: str | None = None) -> Session:
        """Plan and launch a cluster; refused (CommandRefused) when the planner refuses or nodes are not ready."""
        return _created(self.command(LaunchCluster(model_id, tuple(node_ids), new_session_id(), time.time(),
                                                    context_length, concurrency, _split(manual_split),
                                                    draft_model)))

    def launch_single(self, model_id: str, node_id: str, context_length: int = 4096, concurrency: int = 4) -> Session:
        """Serve the whole model from one node (the baseline session, same machinery); refused when
        it does not fit the node's free memory at this context length and concurrency."""
        return _created(self.command(LaunchSingle(model_id, node_id, new_session_id(), time.time(), context_length,
                                                  concurrency)))

    def launch(self, session: Session, model_id: str) -> Session:
        """Create a session from placements (see `planning`) and launch it in the background."""
        return _created(self.command(LaunchSession(session, model_id, time.time())))

    def stop_session(self, session_id: str) -> None:
        """Stop a session: the same teardown as an unhealthy cluster, reason "stopped"."""
        self.command(StopSession(session_id))

    def wait(self, predicate: Callable[[State], bool], timeout: float = 60.0) -> State:
        """Block until predicate(state) holds (for tests and scripts); raises TimeoutError."""
        try:
            wait_until(lambda: predicate(self._state), timeout, 0.02, message="the state's condition")
        except WaitTimeout:
            raise TimeoutError(f"condition not reached within {timeout} s") from None
        return self._state


def _split(manual_split: list[tuple[int, int]] | None) -> tuple[tuple[int, int], ...] | None:
    return None if manual_split is None else tuple((int(a), int(b)) for a, b in manual_split)


def _previewed(decision: Decision) -> Any:
    return next(e.plan for e in decision.events if isinstance(e, ev.PlanPreviewed))


def _created(decision: Decision) -> Session:
    return next(e.session for e in decision.events if isinstance(e, ev.SessionCreated))


def agent_url(address: str) -> str:
    """Normalise "host:port" or "http://host:port" to http://IP:port (engine addresses are IP literals)."""
    text = address.strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    if parts.scheme != "http" or not parts.hostname or not parts.port or parts.path not in ("", "/"):
        raise CommandRefused(f"address {address!r}: expected host:port of a node agent, e.g. 192.168.1.20:39500")
    try:
        ip = socket.gethostbyname(parts.hostname)
    except OSError:
        raise CommandRefused(f"address {address!r}: cannot resolve {parts.hostname!r}") from None
    return f"http://{ip}:{parts.port}"


__all__ = ["CommandRefused", "Orchestrator", "agent_url", "new_session_id"]
