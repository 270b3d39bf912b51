"""Whether the coordinator's stages are alive and making progress: pings, wedges, canaries, the probe.

`Liveness` is owned by the scheduler thread (`pipeline.Pipeline`) and performs no I/O: every tick it
says what is due (`Verdicts`: a round of pings, stages silent too long, stages wedged or moving
again, an idle canary), and the scheduler acts on it. Progress is judged by the `Watchdog`
(no progress while work waits; slow is not stuck). `Probe` holds what the readiness probe must
answer: the first token of the first probe that passed, which every later probe must repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.engine.coordinator.generation import Health, StageHealth
from orchestrator.engine.coordinator.links import StageLink, now
from orchestrator.engine.coordinator.watchdog import Watchdog

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


@dataclass
class Verdicts:
    """What one tick found due, for the scheduler to act on."""

    ping: bool = False  # send every connected stage a PING
    lost: list[tuple[int, str]] = field(default_factory=list)  # silent past PING_TIMEOUT
    wedged: list[tuple[int, str]] = field(default_factory=list)  # work waits, no progress
    recovered: list[int] = field(default_factory=list)  # judged wedged, moving again
    canary: bool = False  # the pipeline is idle: send a canary through it


class Liveness:
    """Per-stage liveness bookkeeping over the links: when each was last heard, its last PONG, its wedge."""

    def __init__(self, links: list[StageLink], watchdog: Watchdog, canary_every: float) -> None:
        self.links = links
        self.watchdog = watchdog
        self.canary_every = canary_every
        self.last_seen: dict[int, float] = {}
        self.stats: dict[int, dict] = {}  # stage index -> its last PONG document
        self.wedged: dict[int, str] = {}  # stage index -> why; cleared when it moves again or its connection goes
        self.last_probe = 0.0
        self._last_tick = 0.0
        self._last_ping = 0.0
        self._last_busy = now()

    def heard(self, index: int, t: float) -> None:
        """Stage `index` sent something."""
        self.last_seen[index] = t

    def pong(self, index: int, stats: dict, t: float) -> None:
        """Stage `index`'s PONG: its figures and progress."""
        self.stats[index] = stats
        self.watchdog.observe(index, stats.get("progress") or {}, t)

    def connected(self, index: int, t: float) -> None:
        """A (new) connection to stage `index`: a process starting from scratch."""
        self.last_seen[index] = t
        self.watchdog.forget(index)

    def gone(self, index: int) -> None:
        """Stage `index`'s connection is gone."""
        self.stats.pop(index, None)
        self.wedged.pop(index, None)
        self.watchdog.forget(index)

    def all_stats(self) -> list[dict]:
        """Every stage's last PONG, or [] until every stage has sent one."""
        return list(self.stats.values()) if len(self.stats) == len(self.links) else []

    def tick(self, t: float, *, busy: bool, idle_and_ready: bool) -> Verdicts | None:
        """What is due at `t` (None: the last tick was under TICK ago). `busy`: a request (not a canary)
        is in flight; `idle_and_ready`: nothing is in flight and the pipeline is ready."""
        if t - self._last_tick < TICK:
            return None
        paused = t - self._last_tick - PING_INTERVAL if self._last_tick else 0.0
        if paused > 0:  # this thread was busy (a draft model's step): the stages' silence meanwhile is ours
            for index in self.last_seen:
                self.last_seen[index] += paused
        self._last_tick = t
        v = Verdicts()
        if t - self._last_ping >= PING_INTERVAL:
            self._last_ping, v.ping = t, True
        for link in self.links:
            seen = self.last_seen.get(link.index)
            if link.conn is not None and seen is not None and t - seen > PING_TIMEOUT:
                v.lost.append((link.index, f"no answer for {PING_TIMEOUT:.1f} s"))
        for link in self.links:
            if link.conn is None:
                continue
            if link.index in self.wedged:
                if self.watchdog.recovered(link.index):
                    v.recovered.append(link.index)
            else:
                why = self.watchdog.wedged(link.index, t)
                if why:
                    v.wedged.append((link.index, why))
        overdue = self.watchdog.canary_overdue(t)
        if overdue is not None:
            v.wedged.append(overdue)
        if busy:
            self._last_busy = t
        elif idle_and_ready and self.watchdog.canary_sent_at is None and t - self._last_busy > self.canary_every:
            self._last_busy, v.canary = t, True
            self.watchdog.canary_sent(t)
        return v

    def may_reprobe(self, t: float) -> bool:
        """An unhealthy pipeline whose links are all up, no stage wedged, is probed again now and then."""
        return (not self.wedged and all(ln.conn is not None for ln in self.links)
                and t - self.last_probe > REPROBE_INTERVAL)

    def snapshot(self, state: str, reason: str, in_flight: int) -> Health:
        """The health snapshot HTTP threads read."""
        t = now()
        return Health(state, reason, tuple(
            StageHealth(ln.node_id, f"{ln.address[0]}:{ln.address[1]}", ln.conn is not None,
                        round(t - self.last_seen[ln.index], 3) if ln.index in self.last_seen and ln.conn else None,
                        dict(self.stats.get(ln.index, {})), self.wedged.get(ln.index, ""))
            for ln in self.links), in_flight)


class Probe:
    """What the readiness probe must answer: after the first probe passed, its first token (greedy)."""

    def __init__(self) -> None:
        self.answer: int | None = None  # the first token of the first passed probe
        self._firsts: list[int] = []  # the current probe's first tokens, one per request

    def started(self) -> int:
        """A probe starts: how many tokens each of its requests generates."""
        self._firsts = []
        return PROBE_TOKENS if self.answer is None else REPROBE_TOKENS

    def check(self, token: int) -> str:
        """A probe request's first sampled token: "" when it is the pipeline's answer (every request of
        a probe, and every probe after the first that passed), else why not."""
        self._firsts.append(token)
        expected = self.answer if self.answer is not None else self._firsts[0]
        if token == expected:
            return ""
        return (f"the probe sampled token {token} where this pipeline answers {expected} "
                "(greedy): a stage computes differently")

    def passed(self) -> None:
        """Remember the first passed probe's answer: later probes are checked against it."""
        if self.answer is None and self._firsts:
            self.answer = self._firsts[0]


__all__ = ["PING_TIMEOUT", "PROBE_PROMPT", "PROBE_REQUESTS", "PROBE_TIMEOUT", "TICK", "Liveness", "Probe",
           "Verdicts"]
