"""The watcher: renews leases, observes every live session and every node (the I/O edge).

Every `interval` — or at once when a coordinator's state changes (`pulse.Wakeup` long-polls
each watched session's coordinator and wakes it) — it reads the orchestrator's latest snapshot,
asks each node's agent about its engine processes and each running session's coordinator about
its pipeline (GET /health)
and its token counter (GET /metrics, for the tokens/s chart), and posts what it saw — only
when something changed. Judging what it means (Unhealthy, teardown) is the orchestrator's job.
"""

from __future__ import annotations

import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.agent.schemas import ProcessInfo
from orchestrator.control.coordinator_client import CoordinatorClient, HealthLook
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.chart_samples import (
    IN_FLIGHT_METRIC,
    TOKENS_METRIC,
    Reading,
    metric_value,
    recent_rate,
    remember,
    same_reading,
    sample,
)
from orchestrator.control.rules.lease import LEASE_S, renew_every
from orchestrator.control.rules.process_ends import ended, lapsed
from orchestrator.control.rules.state import Session, Speculation, StageCache, StageProgress, StageStatus, State
from orchestrator.control.watcher_wakeup import Wakeup
from orchestrator.engine.coordinator.health_report import HealthReport, StageReport
from orchestrator.proc.clock import SYSTEM_CLOCK, Clock

Post = Callable[[ev.Event], None]


def cache_of(report: StageReport | None) -> StageCache | None:
    """A stage's prompt-cache figures from the coordinator's report of it (None without)."""
    c = report.prompt_cache if report is not None else None
    return None if c is None else StageCache(entries=c.entries, bytes=c.bytes, hits=c.hits,
                                             tokens_reused=c.tokens_reused)


def speculation_of(report: HealthReport | None) -> Speculation | None:
    """The coordinator's speculative-decoding counts (None when it does not speculate)."""
    s = report.speculation if report is not None else None
    return None if s is None else Speculation(**s.model_dump())


def progress_of(report: StageReport | None) -> StageProgress | None:
    """A stage's progress report from its entry in the coordinator's health report (None if absent)."""
    p = report.progress if report is not None else None
    if p is None:
        return None
    return StageProgress(steps=p.steps, busy_s=p.busy_s, request=p.request, chunk=p.chunk, queued=p.queued,
                         pid=p.pid)


def judge(session: Session, processes: dict[str, ProcessInfo | None],
          look: HealthLook) -> tuple[tuple[StageStatus, ...], str, tuple[str, ...]]:
    """Per-stage status, why the pipeline is broken ("" when fine) and which processes to replace
    for it ("stage-1", "coordinator"; empty when no single culprit is known). Pure.

    Only `look.report` is the coordinator's verdict: a busy coordinator (429: its connections
    are full) is alive and says nothing about its pipeline, which is then judged by the
    agents' process listings alone."""
    coordinator = look.report
    statuses, problems, culprits = [], [], []
    for st in session.stages:
        name = f"stage-{st.index}"
        info = processes.get(name)
        h = coordinator.stage(name) if coordinator is not None else None
        fault = h.fault if h is not None else ""
        if info is None:
            statuses.append(StageStatus(alive=None, detail="agent unreachable"))
            problems.append(f"{name} on {st.node_name}: agent unreachable")
            culprits.append(name)
            continue
        statuses.append(StageStatus(alive=info.alive, port_listening=info.port_listening,
                                    connected=(h.state == "up") if h is not None else None,
                                    step_ms=h.step_ms if h is not None else None,
                                    detail="" if info.alive else ended(info),
                                    progress=progress_of(h), fault=f"wedged: {fault}" if fault else "",
                                    prompt_cache=cache_of(h),
                                    speculation=speculation_of(coordinator) if st is session.stages[-1] else None))
        if not info.alive:
            problems.append(f"{name} on {st.node_name} ended ({ended(info)})")
        elif not info.port_listening:
            problems.append(f"{name} on {st.node_name}: transport port {st.port} not listening")
        elif fault:
            problems.append(f"{name} on {st.node_name} wedged: {fault}")
        elif h is not None and h.state == "down" and coordinator is not None and coordinator.status != "ready":
            problems.append(f"{name} on {st.node_name}: the coordinator lost it")  # e.g. frozen (SIGSTOP)
        else:
            continue
        culprits.append(name)
    coord = processes.get("coordinator")
    if coord is not None and not coord.alive:
        problems.append(f"coordinator ended ({ended(coord)})")
        culprits.append("coordinator")
    elif look.busy:
        pass  # alive and answering, only full: never a fault by itself
    elif coordinator is None:
        problems.append(f"coordinator unreachable: {look.error}")
        culprits.append("coordinator")  # dead, frozen, or gone with its agent: replaced all the same
    elif coordinator.status not in ("ready", "warming", "starting"):
        # Warming is the coordinator re-probing after its links came back by themselves (a stage
        # frozen for a moment, then continued): it heals alone, or its probe fails within
        # 60 s as "unhealthy" naming the stage. Judged a fault, it had no culprit and the
        # whole cluster was torn down (seen in the chaos run).
        reason = coordinator.reason
        problems.append(f"coordinator {coordinator.status}: {reason}")
        # A probe or canary that a stage failed names that stage ("stage-1: ...").
        named = [f"stage-{i}" for i in sorted({int(m) for m in re.findall(r"\bstage-(\d+)\b", reason)})
                 if int(i) < len(session.stages)]
        culprits += [n for n in named if n not in culprits]
    return tuple(statuses), "; ".join(problems), tuple(dict.fromkeys(culprits))


def at_rest(statuses: tuple[StageStatus, ...], serving: bool) -> tuple[StageStatus, ...]:
    """The stages as a person should see them (pure): with no client's request in flight at the
    coordinator (its metrics count neither the readiness probe nor the idle canary), what a stage
    computes is the coordinator's own check, not work — shown idle, not "decoding for 2.7 s ·
    1 queued". The caller passes `serving` true for a session with a problem: a wedged stage's
    step is what its post-mortem must keep, whoever asked for it."""
    if serving:
        return statuses
    rest = {"busy_s": 0.0, "request": None, "chunk": None, "queued": 0}
    return tuple(st.model_copy(update={"progress": st.progress.model_copy(update=rest)})
                 if st.progress is not None else st for st in statuses)


BUSY_LIMIT_S = 30.0  # a silent coordinator that burns CPU is a fault after this long all the same
CPU_MOVED_S = 0.02  # CPU seconds between two looks that count as work (two ticks of the kernel's clock)


@dataclass
class Suspect:
    """A session's problem seen only as silence: since when, when its coordinator last showed CPU
    progress, and its CPU seconds then (None: unknown, so silence alone decides)."""

    first: float
    moved: float
    cpu: float | None

    def seen(self, now: float, cpu: float | None) -> None:
        """Another silent look: CPU used since the last one is progress (busy, not stuck)."""
        if cpu is not None and self.cpu is not None and cpu - self.cpu >= CPU_MOVED_S:
            self.moved = now
        self.cpu = cpu

    def confirmed(self, now: float, confirm_s: float) -> bool:
        """A fault once it has shown no progress for confirm_s, or has been silent BUSY_LIMIT_S."""
        return now - self.moved >= confirm_s or now - self.first >= BUSY_LIMIT_S


class Watcher:
    """Background thread: leases, session observations, node reports."""

    def __init__(self, snapshot: Callable[[], State], agents: Callable[[str], AgentClient | None], post: Post,
                 interval: float = 0.5, lease_s: float = LEASE_S, report_every: float = 3.0,
                 clock: Clock = SYSTEM_CLOCK, confirm_s: float = 1.5,
                 secret_of: Callable[[str], str | None] = lambda _: None) -> None:
        self._snapshot = snapshot
        self._secret_of = secret_of  # session id -> cluster secret: the control plane's priority at coordinators
        self._clock = clock  # injected: tests move time for this watcher only, not for every thread
        self._agents = agents
        self._post = post
        self.interval = interval
        self.lease_s = lease_s
        self.report_every = report_every
        self._stop = threading.Event()
        # Set by the wakeup when a coordinator's state changed (a stage lost, a coordinator gone):
        # the next cycle runs now, not up to `interval` later — on a recovery's critical path.
        self._woken = threading.Event()
        self._pulse = Wakeup(self._woken.set, secret_of=secret_of)
        self._pulsing = False  # only the running loop long-polls; a test's cycle() calls do not
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="watch")
        # Leases have their own thread and workers, and at most one renewal in flight per node and
        # session: a frozen agent (its calls wait out their timeout) must neither hold the cycle that
        # renews the others' leases nor fill the queue in front of them (a healthy node's lease lapsed).
        self._lease_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="lease")
        self._lease_lock = threading.Lock()
        self._renewing: set[tuple[str, str]] = set()  # (node, session) renewals in flight
        self._last_lease = 0.0
        self._last_report = 0.0
        self._tokens: dict[str, tuple[Reading, ...]] = {}  # session id -> recent token counter readings
        self._serving: set[str] = set()  # nodes that live sessions ran on at the last cycle
        # A problem seen only as silence (a /health or an agent listing that did not answer in
        # time) is a fault once it lasts confirm_s: one slow answer on a loaded machine must not
        # replace a healthy coordinator. A process known dead is a fault at once.
        # A coordinator that is silent but burns CPU (a long native call holding Python's lock) is
        # busy, not stuck: its silence is a fault only once it has lasted confirm_s without CPU
        # progress, or BUSY_LIMIT_S in all (`Suspect`), as a stage is judged by its step counters.
        self.confirm_s = confirm_s
        self._suspects: dict[str, Suspect] = {}  # session id -> its unconfirmed problem
        # Sessions found in the state at a restart, until `decide` has said what becomes of them
        # (ResumeSession): their leases are renewed, but they are not judged meanwhile — a
        # fault posted from here first would be repaired without knowing what the restart found.
        self._held: set[str] = set()

    def hold(self, session_ids: set[str]) -> None:
        """Renew these sessions' leases but do not judge them until `release`."""
        self._held |= set(session_ids)

    def release(self, session_id: str) -> None:
        """Judge this session again from the next cycle on."""
        self._held.discard(session_id)

    def start(self) -> None:
        """Start the loop in a daemon thread."""
        self._pulsing = True
        threading.Thread(target=self._loop, name="watcher", daemon=True).start()
        threading.Thread(target=self._lease_loop, name="watcher-leases", daemon=True).start()

    def stop(self) -> None:
        """End the loop."""
        self._stop.set()
        self._woken.set()
        self._pulsing = False
        self._pulse.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._lease_pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        """Run the next cycle now rather than at the end of the interval."""
        self._woken.set()

    def pulsed(self) -> set[str]:
        """The sessions whose coordinators are long-polled now (they wake the watcher)."""
        return self._pulse.following()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._woken.wait(self.interval)
            self._woken.clear()
            if self._stop.is_set():
                return
            try:
                self.cycle()
            except Exception:  # never let one bad cycle end the watching
                if self._stop.is_set():
                    return  # stopped mid-cycle: the pool no longer takes work
                logging.getLogger("pipeserve.watcher").exception("watch cycle failed")

    def _lease_loop(self) -> None:
        while not self._stop.wait(min(self.interval, renew_every(self.lease_s) / 2)):
            try:
                self.renew_leases()
            except RuntimeError:  # the pool was shut down: stopping
                return

    def renew_leases(self) -> None:
        """Renew every session's leases on every node when a renewal is due (every lease/3 s at most
        RENEW_EVERY_S), each in the background; a node whose last renewal is still waiting is skipped."""
        with self._lease_lock:
            now = self._clock.monotonic()
            if now - self._last_lease < renew_every(self.lease_s):
                return
            self._last_lease = now
            due = [(n, s.id) for s in self._snapshot().sessions for n in s.node_ids]
            due = [key for key in due if key not in self._renewing]
            self._renewing.update(due)
        for node_id, session_id in due:
            self._lease_pool.submit(self._renew, node_id, session_id)

    def cycle(self) -> None:
        """One round: leases (also renewed by their own thread), sessions, node reports (every
        report_every s)."""
        self.renew_leases()
        state = self._snapshot()
        now = self._clock.monotonic()
        # Recovering sessions are watched too (their stage cards stay live) but never faulted twice.
        running = [s for s in state.sessions if s.phase in ("running", "recovering") and s.id not in self._held]
        if self._pulsing:
            self._pulse.follow({s.id: s.url for s in running})
        node_ids = {nid for s in running for nid in s.node_ids}
        listed = dict(zip(node_ids, self._pool.map(self._processes, node_ids)))
        self._tokens = {k: v for k, v in self._tokens.items() if any(s.id == k for s in running)}
        self._suspects = {k: v for k, v in self._suspects.items() if any(s.id == k for s in running)}
        for s in running:
            self._observe(s, listed)
        # A node whose session just ended (stopped, torn down, failed to launch) reports now: its
        # free memory is back, and the form and plan must not show the serving value for seconds.
        serving = {nid for s in state.sessions for nid in s.node_ids}
        freed, self._serving = self._serving - serving, serving
        if now - self._last_report >= self.report_every:
            self._last_report = now
            freed = {n.id for n in state.nodes}
        for n in state.nodes:
            if n.id in freed:
                self._pool.submit(self._report, n.id)

    def _renew(self, node_id: str, session_id: str) -> None:
        try:
            agent = self._agents(node_id)
            if agent is not None:
                agent.renew_lease(session_id, self.lease_s)
        except AgentError:
            pass  # observed (and acted on) through the process listing
        finally:
            with self._lease_lock:
                self._renewing.discard((node_id, session_id))

    def _processes(self, node_id: str) -> list[ProcessInfo] | None:
        agent = self._agents(node_id)
        try:
            return agent.processes() if agent is not None else None
        except AgentError:
            return None

    def inspect(self, s: Session, health_timeout: float = 3.0) -> tuple[tuple[StageStatus, ...], str, tuple[str, ...],
                                                                        tuple[str, ...]]:
        """One look at a session now, outside the loop (the orchestrator's restart recovery):
        its leases renewed first — so that nothing counted alive here ends a moment later for a
        lease that lapsed during the restart —, then its processes and its coordinator judged.
        Returns the stages' status, the problem, the culprits and the processes that are gone."""
        node_ids = set(s.node_ids)
        renewed = {nid: self._renew_now(nid, s.id) for nid in node_ids}
        listed = {nid: self._processes(nid) for nid in node_ids}
        processes, look = _look(s, listed, self.client(s), health_timeout)
        node_of = {f"stage-{st.index}": st.node_id for st in s.stages} | {"coordinator": s.coordinator_node}
        processes = lapsed(processes, renewed, node_of)
        statuses, problem, culprits = judge(s, processes, look)
        gone = tuple(name for name, info in processes.items() if info is not None and not info.alive)
        return statuses, problem, culprits, gone

    def _renew_now(self, node_id: str, session_id: str) -> set[str] | None:
        """Extend the session's leases on one node now: the processes renewed (empty when none
        runs there any more), None when its agent did not answer."""
        agent = self._agents(node_id)
        if agent is None:
            return None
        try:
            return set(agent.renew_lease(session_id, self.lease_s).renewed)
        except AgentError as exc:
            return set() if exc.status == 404 else None

    def client(self, s: Session) -> CoordinatorClient:
        """The session's coordinator, asked with its cluster's control token."""
        return CoordinatorClient(s.url, self._secret_of(s.id))

    def _observe(self, s: Session, listed: dict[str, list[ProcessInfo] | None]) -> None:
        client = self.client(s)
        processes, look = _look(s, listed, client, 1.0)
        statuses, problem, culprits = judge(s, processes, look)
        reading, busy = self._read_tokens(client) if look.answered else (None, False)
        statuses = at_rest(statuses, busy or bool(problem))  # a broken pipeline's stages as they are (post-mortems)
        readings = remember(self._tokens.get(s.id, ()), reading)
        self._tokens[s.id] = readings
        seen = sample(self._clock.time(), recent_rate(readings, busy), statuses)
        fresh = not same_reading(s.samples[-1] if s.samples else None, seen)
        if fresh or statuses != s.stage_status:
            self._post(ev.SessionObserved(session_id=s.id, stage_status=statuses, sample=seen if fresh else None))
        if problem and s.phase == "running" and self._confirmed(s.id, processes, look):
            self._post(ev.SessionFaulted(session_id=s.id, reason=problem, processes=culprits, at=self._clock.time()))
        elif not problem:
            self._suspects.pop(s.id, None)

    def _confirmed(self, session_id: str, processes: dict[str, ProcessInfo | None], look: HealthLook) -> bool:
        """Whether a session's problem is a fault now: at once when a process is known dead or the
        coordinator itself said what is wrong; when it is only silence, once it has lasted confirm_s."""
        known_dead = any(p is not None and not p.alive for p in processes.values())
        silent = look.report is None or any(p is None for p in processes.values())
        if known_dead or not silent:
            self._suspects.pop(session_id, None)
            return True
        now = self._clock.monotonic()
        coordinator = processes.get("coordinator")
        cpu = coordinator.cpu_s if coordinator is not None and look.report is None else None
        suspect = self._suspects.get(session_id)
        if suspect is None:
            suspect = self._suspects[session_id] = Suspect(now, now, cpu)
        else:
            suspect.seen(now, cpu)
        return suspect.confirmed(now, self.confirm_s)

    def _read_tokens(self, client: CoordinatorClient) -> tuple[Reading | None, bool]:
        """The coordinator's generated-token counter and when it was read (None if unreadable), and
        whether a request is in flight."""
        text = client.metrics(timeout=1.0)
        if text is None:
            return None, False
        value = metric_value(text, TOKENS_METRIC)
        busy = bool(metric_value(text, IN_FLIGHT_METRIC))
        return (None if value is None else (self._clock.monotonic(), value)), busy

    def _report(self, node_id: str) -> None:
        agent = self._agents(node_id)
        if agent is None:
            return
        try:
            self._post(ev.NodeReported(node_id=node_id, report=agent.report(), at=self._clock.time()))
        except AgentError as exc:
            self._post(ev.NodeUnreachable(node_id=node_id, error=exc.message, at=self._clock.time()))


def _look(s: Session, listed: dict[str, list[ProcessInfo] | None], client: CoordinatorClient,
          timeout: float) -> tuple[dict[str, ProcessInfo | None], HealthLook]:
    """The session's processes picked from the agents' listings (None: agent unreachable) and
    one look at the coordinator's health."""
    def find(node_id: str, name: str, index: int | None) -> ProcessInfo | None:
        infos = listed.get(node_id)
        return None if infos is None else next(
            (p for p in infos if p.cluster_id == s.id and p.node_id == name), _gone(s, index))

    processes = {f"stage-{st.index}": find(st.node_id, f"stage-{st.index}", st.index) for st in s.stages}
    processes["coordinator"] = find(s.coordinator_node, "coordinator", None)
    return processes, client.health(timeout)


def _gone(s: Session, index: int | None) -> ProcessInfo:
    """A stand-in for a process the agent no longer lists (it was stopped or never existed)."""
    port = s.coordinator_port if index is None else s.stages[index].port
    return ProcessInfo(cluster_id=s.id, node_id="coordinator" if index is None else f"stage-{index}", kind="?",
                       model_id="?", pid=None, alive=False, port=port, port_listening=False, started_at=0,
                       uptime_s=0, lease_remaining_s=None, stop_reason="not listed by its agent")
