"""The coordinator's scheduler: drives requests through the stages and keeps them busy.

One thread owns all scheduling state and is fed by one inbox (submissions and
cancellations from HTTP threads, frames and link events from the stage links). Prefill is
sent in `prefill_step_size` chunks exactly as `mlx_lm.generate_step` does; decode steps of
ready requests are grouped into micro-batches, with up to one group in flight per stage so
that every stage works on a different group at the same time. Watching the stages (pings,
wedges, the readiness probe, a moved stage) is the other half of the thread: `liveness`.
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import threading
from dataclasses import dataclass

from ..logs import EventLogger
from .config import ClusterConfig
from .generation import Failed, Finished, Generation, GenerationParams, NotReady, TokenEvent
from .links import StageLink, now
from .liveness import TICK, Liveness
from .metrics import Metrics
from .sampling import decode_result
from .tensors import tokens_frame
from .watchdog import Watchdog, canary_interval, stall_timeout
from .wire import Flag, Frame, FrameError, Kind, json_frame


@dataclass
class _Active:
    gen: Generation
    rid: int
    position: int = 0
    generated: int = 0
    next_token: int = 0
    cancelled: bool = False
    internal: bool = False  # the readiness probe or the idle canary: never counted as a request
    canary: bool = False
    opened: Frame | None = None  # its OPEN frame, sent ahead of its first chunk


class Pipeline(Liveness):
    """Coordinator-side engine over the configured stages."""

    def __init__(self, config: ClusterConfig, secret: bytes, eos_ids: set[int], context_length: int,
                 log: EventLogger, metrics: Metrics | None = None) -> None:
        self.config = config
        self.eos_ids = set(eos_ids)
        self.context_length = context_length
        self.log = log
        self.metrics = metrics or Metrics([s.id for s in config.stages])
        self.prefill_step = config.cluster.prefill_step_size
        self.max_batch = config.cluster.max_batch
        self.max_requests = config.cluster.max_requests
        self._inbox: queue.Queue = queue.Queue()
        self.links = [
            StageLink(i, s.id, s.host_port, secret, config.cluster.max_frame_bytes, self._inbox, log)
            for i, s in enumerate(config.stages)
        ]
        # scheduler-thread state
        self._ids = itertools.count(int.from_bytes(os.urandom(3), "little") << 32)
        self._active: dict[int, _Active] = {}
        self._ready: list[int] = []
        self._group_of: dict[int, int] = {}
        self._group_left: dict[int, int] = {}
        self._group_ids = itertools.count(1)
        self._last_seen: dict[int, float] = {}
        self._last_ping = 0.0
        self._last_tick = 0.0
        self._last_probe = 0.0
        self._probe_answer: int | None = None
        self._probe_firsts: list[int] = []
        self._stats: dict[int, dict] = {}
        self.watchdog = Watchdog(len(self.links), stall_timeout(config.cluster.stall_timeout_s))
        self._wedged: dict[int, str] = {}  # stage index -> why; cleared when its connection goes
        self._canary_every = canary_interval()
        self._last_busy = now()
        self._state, self._reason = "starting", "connecting to stages"
        self._state_changed = threading.Condition()  # wakes `/health?wait=` long polls (liveness.wait_while)
        self._stop = threading.Event()
        self.health = self._snapshot()

    # --- public, any thread -------------------------------------------------------------
    def start(self) -> None:
        """Start the links and the scheduler thread."""
        for link in self.links:
            link.start()
        threading.Thread(target=self._run, name="scheduler", daemon=True).start()

    def stop(self) -> None:
        """Stop everything; in-flight requests fail."""
        self._inbox.put(("stop",))

    def reroute(self, index: int, address: tuple[str, int]) -> None:
        """Stage `index` now listens at `address` (it was restarted on another node; engine/routes.py)."""
        self._inbox.put(("reroute", index, address))

    def submit(self, prompt: list[int], params: GenerationParams) -> Generation:
        """Queue a request; raises NotReady if the pipeline is not healthy."""
        if not self.health.ready:
            raise NotReady(f"pipeline is {self.health.state}: {self.health.reason}")
        gen = Generation(prompt, params, self._inbox)
        self._inbox.put(("submit", gen, False))
        return gen

    # --- scheduler thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                item = self._inbox.get(timeout=TICK)
            except queue.Empty:
                item = None
            if item is not None:
                if item[0] == "stop":
                    self._shutdown()
                    return
                self._dispatch_event(item)
            self._tick()

    def _dispatch_event(self, item: tuple) -> None:
        what = item[0]
        if what == "frames":
            self._on_frames(item[1], item[2])
        elif what == "submit":
            self._admit(item[1], internal=item[2])
        elif what == "cancel":
            self._cancel(item[1])
        elif what == "link_up":
            self._on_link_up(item[1], item[2])
        elif what == "reroute":
            self._on_reroute(item[1], item[2])
        elif what == "link_down":
            if self.links[item[1]].conn is item[2]:
                self._lose(item[1], item[3])

    def _fail_all(self, message: str) -> None:
        for a in self._active.values():
            a.gen.events.put(Failed(message))
        self._active.clear()
        self._ready.clear()
        self._group_of.clear()
        self._group_left.clear()
        self.metrics.set_in_flight(0)

    def _shutdown(self) -> None:
        self._fail_all("coordinator shutting down")
        for link in self.links:
            link.stop()
            if link.conn is not None:
                link.conn.close()
        self._set_state("stopped", "stopped")

    # --- requests -------------------------------------------------------------------------
    def _admit(self, gen: Generation, internal: bool, canary: bool = False) -> None:
        if not internal and self._state != "ready":
            gen.events.put(Failed(f"pipeline is {self._state}: {self._reason}"))
            return
        if not internal and len(self._active) >= self.max_requests:
            gen.events.put(Failed(f"too many requests in flight ({self.max_requests}); retry later", 429))
            return
        a = self._open(gen, internal, canary)
        rid, prompt = a.rid, gen.prompt
        first = [a.opened]
        # Prefill prompt[:-1] in chunks (cache only), then the last token samples: generate_step's order.
        for start in range(0, len(prompt) - 1, self.prefill_step):
            chunk = prompt[start:min(start + self.prefill_step, len(prompt) - 1)]
            if not self._send(0, first + [tokens_frame(rid, start, chunk, self._solo(1))]):
                return
            first = []
        a.position = len(prompt) - 1
        a.next_token = prompt[-1]
        self._launch([a], first)
        self.metrics.set_in_flight(self._public_count())

    def _open(self, gen: Generation, internal: bool, canary: bool = False) -> _Active:
        """Track a new request; its OPEN frame (sampling parameters) is `opened`."""
        rid = next(self._ids)
        a = _Active(gen, rid, internal=internal, canary=canary)
        gen.rid = rid
        self._active[rid] = a
        p = gen.params
        a.opened = json_frame(Kind.OPEN, {"temperature": p.temperature, "top_p": p.top_p, "seed": p.seed,
                                          "top_logprobs": p.top_logprobs}, request_id=rid)
        return a

    def _solo(self, members: int) -> Flag:
        """SOLO when nothing else is in flight: co-located stages may then use all cores (a stage
        computes only while the others wait for it). Prefill chunks are not tracked as groups, so
        also require that no other request is active."""
        return Flag.SOLO if not self._group_left and len(self._active) == members else Flag.NONE

    def _launch(self, members: list[_Active], prefix: list[Frame] | None = None, solo: bool = True) -> None:
        gid = next(self._group_ids)
        frames = list(prefix or [])
        solo = self._solo(len(members)) if solo else Flag.NONE
        for a in members:
            frames.append(tokens_frame(a.rid, a.position, [a.next_token], Flag.SAMPLE | solo))
            self._group_of[a.rid] = gid
        self._group_left[gid] = len(members)
        self._send(0, frames)

    def _dispatch(self) -> None:
        """Send ready requests as micro-batches, keeping at most one group per stage in flight."""
        depth = len(self.links)
        while self._ready and len(self._group_left) < depth:
            decoding = len(self._ready) + sum(self._group_left.values())
            size = min(self.max_batch, max(1, math.ceil(decoding / depth)))
            batch, self._ready = self._ready[:size], self._ready[size:]
            self._launch([self._active[r] for r in batch])

    def _on_frames(self, index: int, frames: list[Frame]) -> None:
        self._last_seen[index] = now()
        for f in frames:
            if f.kind is Kind.RESULT:
                self._on_result(f)
            elif f.kind is Kind.PONG:
                try:
                    self._stats[index] = f.json()
                    self.metrics.observe_stage(self.links[index].node_id, self._stats[index])
                    self.watchdog.observe(index, self._stats[index].get("progress") or {}, now())
                except (FrameError, AttributeError, TypeError, ValueError):
                    pass
            elif f.kind is Kind.ERROR:
                self._on_error(index, f)
        self._dispatch()

    def _group_done(self, rid: int) -> None:
        gid = self._group_of.pop(rid, None)
        if gid is not None:
            self._group_left[gid] -= 1
            if self._group_left[gid] == 0:
                del self._group_left[gid]

    def _on_result(self, f: Frame) -> None:
        self._group_done(f.request_id)
        a = self._active.get(f.request_id)
        if a is None:
            return
        try:
            token, logprob, top = decode_result(f.payload)
        except ValueError as exc:
            self._finish(a, Failed(f"bad result from the last stage: {exc}", 502))
            return
        a.position = f.position
        if a.cancelled:
            self._finish(a, None)
            return
        a.generated += 1
        if a.generated == 1 and a.internal and not a.canary:
            wrong = self._probe_token(token)
            if wrong:
                self._finish(a, Failed(wrong))
                return
        if a.generated == 1 and not a.internal:
            self.metrics.observe_ttft(now() - a.gen.submitted)
        a.gen.events.put(TokenEvent(token, logprob, tuple(top)))
        if not a.internal:
            self.metrics.add_tokens(1)
        if a.internal and a.generated >= a.gen.params.max_tokens:
            self._finish(a, Finished("length"))
            if not any(x.internal for x in self._active.values()) and self._state == "warming":
                self._probe_passed()
                self._set_state("ready", "all stages served the probe: prefill, sampling and batched decode")
        elif token in self.eos_ids and not a.internal:
            self._finish(a, Finished("stop"))
        elif not a.internal and (a.generated >= a.gen.params.max_tokens or a.position >= self.context_length):
            self._finish(a, Finished("length"))
        else:
            a.next_token = token
            self._ready.append(a.rid)

    def _on_error(self, index: int, f: Frame) -> None:
        try:
            message = str(f.json().get("message", "stage error"))
        except (FrameError, AttributeError):
            message = "stage error"
        a = self._active.get(f.request_id)
        self.log.warning("request.stage_error", stage=self.links[index].node_id, request=f.request_id, reason=message)
        if a is not None:
            self._group_done(a.rid)
            self._finish(a, Failed(f"{self.links[index].node_id}: {message}", 500))

    def _cancel(self, gen: Generation) -> None:
        rid = getattr(gen, "rid", None)
        a = self._active.get(rid) if rid is not None else None
        if a is None:
            return
        if rid in self._ready:
            self._ready.remove(rid)
            self._finish(a, None)
        else:
            a.cancelled = True  # finished when its in-flight step returns

    def _finish(self, a: _Active, event: Finished | Failed | None) -> None:
        self._active.pop(a.rid, None)
        if event is not None:
            a.gen.events.put(event)
        if a.canary:
            self.watchdog.canary_returned()
        if a.internal and isinstance(event, Failed):
            what = "canary" if a.canary else "probe generation"
            self._set_state("unhealthy", f"{what} failed: {event.message}")
        self._send(0, [Frame(Kind.CLOSE, a.rid)])
        self.metrics.set_in_flight(self._public_count())

    def _public_count(self) -> int:
        return sum(1 for a in self._active.values() if not a.internal)

    def _send(self, index: int, frames: list[Frame]) -> bool:
        link = self.links[index]
        if link.conn is None:
            self._lose(index, "not connected")
            return False
        try:
            link.conn.send_group(frames)
            return True
        except OSError as exc:
            self._lose(index, f"send failed: {exc}")
            return False
