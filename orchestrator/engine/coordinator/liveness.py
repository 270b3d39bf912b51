"""Whether the coordinator's pipeline can serve: its links, pings, wedged stages and probes.

The scheduler thread (`pipeline.Pipeline`) owns this state with everything else; this module
is the half of it that watches the stages rather than the requests. Every tick it pings each
connected stage and loses one that stays silent, asks the watchdog about stuck steps, sends an
idle canary now and then, and re-probes an unhealthy pipeline whose links are all up. A link
coming up resets the stages and runs the readiness probe; a stage that moved to another node
(engine/stage_address.py) is re-dialled at its new address. `health` is the snapshot HTTP threads read.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

from orchestrator.engine.coordinator.generation import Failed, Generation, GenerationParams, Health, StageHealth
from orchestrator.engine.coordinator.links import StageLink, now
from orchestrator.engine.coordinator.watchdog import Watchdog
from orchestrator.engine.stage_address import route_frame
from orchestrator.engine.tensors import tokens_frame
from orchestrator.engine.wire import Frame, Kind
from orchestrator.logs import EventLogger

if TYPE_CHECKING:
    from orchestrator.engine.coordinator.pipeline import _Active

TICK = 0.1
PING_INTERVAL = 0.5
PING_TIMEOUT = 3.0  # a stage silent this long is lost (its reader answers pings even mid-prefill)
PROBE_TIMEOUT = 60.0  # the probe is a few tokens: only a broken pipeline takes this long
# The readiness probe runs the paths requests take: a prefill chunk, a sampled token, then
# decode steps of two requests at once (a micro-batch on every stage). Both requests travel
# together — one group of prefill chunks, then one batched step that samples — so a probe
# is 4 steps per stage, not 8: a fresh stage's first steps are its slowest (recovery time).
PROBE_PROMPT = [0, 1, 2, 3]
PROBE_TOKENS = 2
PROBE_REQUESTS = 2
# Once a probe has passed, later probes (a replaced or reconnected stage) stop after the first
# sampled token — 3 steps per stage, not 4, on a recovery's critical path — and are exact: that
# token (greedy) must be the one this pipeline answered then, so a stage that computes
# differently (wrong or damaged weights, another layer range) fails the probe.
REPROBE_TOKENS = 1
REPROBE_INTERVAL = 5.0


class Liveness:
    """The stage-watching half of `Pipeline` (a mixin: it runs on the scheduler thread, and the
    request half supplies `_open`, `_launch`, `_admit`, `_finish`, `_fail_all` and `_send`)."""

    links: list[StageLink]
    log: EventLogger
    watchdog: Watchdog
    health: Health
    _inbox: queue.SimpleQueue
    _active: dict[int, "_Active"]
    _last_seen: dict[int, float]
    _stats: dict[int, dict]
    _wedged: dict[int, str]  # stage index -> why; cleared when it moves again or its connection goes
    _state: str
    _reason: str
    _last_tick: float
    _last_ping: float
    _last_probe: float
    _last_busy: float
    _canary_every: float
    _state_changed: threading.Condition
    _probe_answer: int | None  # the first token of the first passed probe (greedy)
    _probe_firsts: list[int]  # the current probe's first tokens, one per request

    if TYPE_CHECKING:  # supplied by the request half (pipeline.Pipeline) and the prompt-cache half;
        # type-only: a stub here would shadow, in Pipeline's MRO, the mixin after this one that defines it
        def _open(self, gen: Generation, internal: bool, canary: bool = False) -> "_Active": ...
        def _launch(self, members: list["_Active"], prefix: list[Frame] | None = None, solo: bool = True) -> None: ...
        def _admit(self, gen: Generation, internal: bool, canary: bool = False) -> None: ...
        def _finish(self, a: "_Active", event: Any) -> None: ...
        def _fail_all(self, message: str) -> None: ...
        def _send(self, index: int, frames: list[Frame]) -> bool: ...
        def _forget_cache(self, reason: str) -> None: ...

    def _tick(self) -> None:
        t = now()
        if t - self._last_tick < TICK:
            return
        paused = t - self._last_tick - PING_INTERVAL if self._last_tick else 0.0
        if paused > 0:  # this thread was busy (a draft model's step): the stages' silence meanwhile is ours
            for index in self._last_seen:
                self._last_seen[index] += paused
        self._last_tick = t
        if t - self._last_ping >= PING_INTERVAL:
            self._last_ping = t
            for link in self.links:
                if link.conn is not None:
                    self._send(link.index, [Frame(Kind.PING)])
        for link in self.links:
            seen = self._last_seen.get(link.index)
            if link.conn is not None and seen is not None and t - seen > PING_TIMEOUT:
                self._lose(link.index, f"no answer for {PING_TIMEOUT:.1f} s")
        self._watch(t)
        probe = next((a for a in self._active.values() if a.internal and not a.canary), None)
        if probe is not None and t - probe.gen.submitted > PROBE_TIMEOUT:
            self._finish(probe, Failed(f"no answer to the probe within {PROBE_TIMEOUT:.0f} s"))
        elif (probe is None and self._state == "unhealthy" and all(ln.conn is not None for ln in self.links)
              and not self._wedged and t - self._last_probe > REPROBE_INTERVAL):
            self._probe()
        self.health = self._snapshot()

    def _watch(self, t: float) -> None:
        """Wedge detection (see `watchdog`): a stuck stage, an overdue canary; an idle pipeline
        sends a canary now and then, so a stage that wedged while idle is found before a request is."""
        for link in self.links:
            if link.conn is None:
                continue
            if link.index in self._wedged:
                if self.watchdog.recovered(link.index):
                    self._unwedge(link.index)
                continue
            why = self.watchdog.wedged(link.index, t)
            if why:
                self._wedge(link.index, why)
        overdue = self.watchdog.canary_overdue(t)
        if overdue is not None:
            self._wedge(*overdue)
        if any(not a.canary for a in self._active.values()):
            self._last_busy = t
        elif (self._state == "ready" and not self._active and self.watchdog.canary_sent_at is None
              and t - self._last_busy > self._canary_every):
            self._last_busy = t
            self.watchdog.canary_sent(t)
            self._admit(Generation(list(PROBE_PROMPT[:2]), GenerationParams(max_tokens=1), self._inbox),
                        internal=True, canary=True)

    def _wedge(self, index: int, why: str) -> None:
        """Declare a stage wedged: its link stays (pings still answer) but nothing is sent through it
        until it moves again (`_unwedge`) or its connection goes (the control plane replaces the process)."""
        self._wedged[index] = why
        self.watchdog.canary_returned()
        message = f"pipeline stage {self.links[index].label} wedged: {why}"
        self.log.warning("stage.wedged", stage=self.links[index].node_id, reason=why, progress=self._stats.get(index),
                         failed_requests=len(self._active))
        self._fail_all(message)
        self._set_state("unhealthy", message)

    def _unwedge(self, index: int) -> None:
        """A stage judged wedged computes again (it was slow, or stuck for a while): drop the stale
        requests it still holds (a RESET down the chain) and probe; the pipeline serves again on its own."""
        why = self._wedged.pop(index)
        self.log.info("stage.recovered", stage=self.links[index].node_id, was=why)
        if not self._wedged and all(ln.conn is not None for ln in self.links):
            self._send(0, [Frame(Kind.RESET)])
            self._probe()

    def _on_link_up(self, index: int, conn) -> None:
        link = self.links[index]
        if link.conn is not None:
            link.conn.close()
        link.conn = conn
        self._last_seen[index] = now()
        self.watchdog.forget(index)
        self.log.info("link.up", stage=link.node_id)
        self._forget_cache(f"stage {link.label} (re)connected")
        if all(ln.conn is not None for ln in self.links):
            # Stale per-request state from before must go. RESET travels down the chain from
            # stage 0, so every stage sees it before the probe's OPEN on the same path.
            # The addresses go first: a stage that moved is then reached by its upstream
            # neighbour before the RESET and the probe travel the chain.
            self._send(0, [route_frame([ln.address for ln in self.links]), Frame(Kind.RESET)])
            self._probe()

    def _on_reroute(self, index: int, address: tuple[str, int]) -> None:
        link = self.links[index]
        if address == link.address:
            return
        self.log.info("link.moved", stage=link.node_id, address=f"{address[0]}:{address[1]}",
                      was=f"{link.address[0]}:{link.address[1]}")
        link.address = address  # the link's next connect goes there
        if link.conn is not None:  # still the old process (e.g. its node cut off): leave it
            self._lose(index, f"moved to {address[0]}:{address[1]}")

    def _probe(self) -> None:
        """Healthy means generations went through every stage the way requests do, not just open ports."""
        self._last_probe = now()
        self._set_state("warming", "probing the pipeline: prefill, then batched decode of two requests")
        tokens = PROBE_TOKENS if self._probe_answer is None else REPROBE_TOKENS
        self._probe_firsts = []
        members = [self._open(Generation(list(PROBE_PROMPT), GenerationParams(max_tokens=tokens), self._inbox),
                              internal=True) for _ in range(PROBE_REQUESTS)]
        chunks = [tokens_frame(a.rid, 0, PROBE_PROMPT[:-1]) for a in members]
        for a in members:
            a.position, a.next_token = len(PROBE_PROMPT) - 1, PROBE_PROMPT[-1]
        if self._send(0, [m.opened for m in members] + chunks):
            self._launch(members, solo=False)  # not SOLO: a fresh stage warms up on its usual threads

    def _probe_token(self, token: int) -> str:
        """Check a probe request's first sampled token: "" when it is the pipeline's answer
        (every request of a probe, and every probe after the first that passed), else why not."""
        self._probe_firsts.append(token)
        expected = self._probe_answer if self._probe_answer is not None else self._probe_firsts[0]
        if token == expected:
            return ""
        return (f"the probe sampled token {token} where this pipeline answers {expected} "
                "(greedy): a stage computes differently")

    def _probe_passed(self) -> None:
        """Remember the first passed probe's answer: later probes are checked against it."""
        if self._probe_answer is None and self._probe_firsts:
            self._probe_answer = self._probe_firsts[0]

    def _lose(self, index: int, reason: str) -> None:
        link = self.links[index]
        if link.conn is not None:
            link.conn.close()
            link.conn = None
        self._stats.pop(index, None)
        self._wedged.pop(index, None)
        self.watchdog.forget(index)
        message = f"pipeline stage {link.label} lost: {reason}"
        self._forget_cache(message)
        self.log.warning("link.down", stage=link.node_id, reason=reason, failed_requests=len(self._active))
        self._fail_all(message)
        self._set_state("unhealthy" if self._state in ("ready", "warming", "unhealthy") else "starting", message)

    def _set_state(self, state: str, reason: str) -> None:
        if (state, reason) != (self._state, self._reason):
            self.log.info("pipeline.state", state=state, reason=reason)
        self._state, self._reason = state, reason
        self.health = self._snapshot()
        with self._state_changed:
            self._state_changed.notify_all()

    def wait_while(self, state: str, timeout: float) -> Health:
        """The health once the pipeline's state is no longer `state`, or after `timeout` s
        (any thread). A watcher long-polls this: a lost stage is known to the control plane
        when the coordinator learns it (its socket closed), not at the watcher's next look."""
        with self._state_changed:
            self._state_changed.wait_for(lambda: self.health.state != state, timeout)
        return self.health

    def _snapshot(self) -> Health:
        t = now()
        return Health(self._state, self._reason, tuple(
            StageHealth(ln.node_id, f"{ln.address[0]}:{ln.address[1]}", ln.conn is not None,
                        round(t - self._last_seen[ln.index], 3) if ln.index in self._last_seen and ln.conn else None,
                        dict(self._stats.get(ln.index, {})), self._wedged.get(ln.index, ""))
            for ln in self.links), len(self._active))
