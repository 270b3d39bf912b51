"""The coordinator's scheduler: drives requests through the stages and keeps them busy.

One thread owns all scheduling state and is fed by one inbox (submissions and
cancellations from HTTP threads, frames and link events from the stage links). Prefill is
sent in `prefill_step_size` chunks exactly as `mlx_lm.generate_step` does; decode steps of
ready requests are grouped into micro-batches, with up to one group in flight per stage so
that every stage works on a different group at the same time. What the stages answer (RESULT,
ERROR, PONG frames) and a request's end are in `answering`; watching the stages (pings, wedges,
the readiness probe, a moved stage) is the other half of the thread: `liveness`.
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import threading
from dataclasses import dataclass
from typing import Callable

from orchestrator.engine.config import ClusterConfig
from orchestrator.engine.coordinator.answering import Answering
from orchestrator.engine.coordinator.disk_adoption import DiskAdoption
from orchestrator.engine.coordinator.draft_model import DraftModel
from orchestrator.engine.coordinator.drafting import DraftLength, Lookup
from orchestrator.engine.coordinator.generation import (
    Failed,
    Finished,
    Generation,
    GenerationParams,
    NotReady,
    TokenEvent,
)
from orchestrator.engine.coordinator.links import StageLink, now
from orchestrator.engine.coordinator.liveness import TICK, Liveness
from orchestrator.engine.coordinator.metrics import Metrics
from orchestrator.engine.coordinator.prefix_index import PrefixIndex, Reuse, prefill_chunks
from orchestrator.engine.coordinator.prompt_caching import PromptCaching
from orchestrator.engine.coordinator.speculation import Speculating, drafts_now
from orchestrator.engine.coordinator.watchdog import Watchdog, canary_interval, stall_timeout
from orchestrator.engine.steptrace import StepTrace
from orchestrator.engine.tensors import tokens_frame
from orchestrator.engine.wire import Flag, Frame, Kind, json_frame
from orchestrator.logs import EventLogger


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
    tokens: list[int] | None = None  # generated so far (what a prompt-cache entry of it covers)
    reuse: Reuse | None = None  # the prompt-cache entry it started from
    lookup: Lookup | None = None  # its prompt and output, indexed for drafting (None: it never speculates)
    length: DraftLength | None = None  # how many tokens it drafts next


class Pipeline(Liveness, PromptCaching, Speculating, Answering):
    """Coordinator-side engine over the configured stages."""

    def __init__(self, config: ClusterConfig, secret: bytes, eos_ids: set[int], context_length: int,
                 log: EventLogger, metrics: Metrics | None = None) -> None:
        self.config = config
        self.eos_ids = set(eos_ids)
        self._thread: threading.Thread | None = None
        self.context_length = context_length
        self.log = log
        self.metrics = metrics or Metrics([s.id for s in config.stages])
        self.prefill_step = config.cluster.prefill_step_size
        self.max_batch = config.cluster.max_batch
        self.max_requests = config.cluster.max_requests
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # C put/get: a cheaper hand-off per token
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
        self._passes: dict[int, list[int]] = {}  # request -> [drafted, RESULTs received] of its pass in flight
        self._emitted: list[tuple[Generation, TokenEvent | Finished | Failed]] = []  # for `_deliver`
        self.trace = StepTrace.of("coordinator")  # None unless PIPESERVE_STEP_TRACE names a file
        self.speculative_tokens = config.cluster.speculative_tokens
        # (sequence so far, k) -> draft; None: prompt lookup. Tests set an oracle here before submitting,
        # to drive verification through chosen accepts and rejections.
        self.draft_source: Callable[[list[int], int], list[int]] | None = None
        # The cluster's draft model (main.py loads it): drafts instead of prompt lookup; this thread runs it.
        self.drafter: DraftModel | None = None
        # Draft only for a request alone in the pipeline (speculation.drafts_now). Tests turn it off to
        # drive steps that mix speculating and plain requests.
        self.speculate_alone = True
        self._last_seen: dict[int, float] = {}
        self._last_ping = 0.0
        self._last_tick = 0.0
        self._last_probe = 0.0
        self._probe_answer: int | None = None
        self._probe_firsts: list[int] = []
        self._stats: dict[int, dict] = {}
        self.watchdog = Watchdog(len(self.links), stall_timeout(config.cluster.stall_timeout_s))
        self._wedged: dict[int, str] = {}  # stage index -> why; cleared when it moves again or its connection goes
        self._canary_every = canary_interval()
        self._last_busy = now()
        self._state, self._reason = "starting", "connecting to stages"
        self._state_changed = threading.Condition()  # wakes `/health?wait=` long polls (liveness.wait_while)
        self._stop = threading.Event()
        # Entry ids start at a random base, like request ids: a stage never confuses two sessions' entries.
        self.cache = PrefixIndex(len(self.links), config.cluster.prompt_cache_budget,
                                 first_id=int.from_bytes(os.urandom(3), "little") << 32)
        # The disk tier: saves carry their tokens (the stages write files), and once ready the
        # index learns the files every stage holds (a restarted stage comes back warm).
        self._disk = self.cache.enabled and config.cluster.prompt_cache_disk_bytes > 0
        self._adoption = DiskAdoption(len(self.links), self.cache.budget)
        self.health = self._snapshot()

    # --- public, any thread -------------------------------------------------------------
    def start(self) -> None:
        """Start the links and the scheduler thread."""
        for link in self.links:
            link.start()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop everything; in-flight requests fail. `wait_s` > 0: wait that long for the scheduler
        thread to finish shutting down (a test's teardown, before its log capture closes)."""
        self._inbox.put(("stop",))
        if wait_s > 0 and self._thread is not None:
            self._thread.join(wait_s)

    def reroute(self, index: int, address: tuple[str, int]) -> None:
        """Stage `index` now listens at `address` (it was restarted on another node; engine/stage_address.py)."""
        self._inbox.put(("reroute", index, address))

    def submit(self, prompt: list[int], params: GenerationParams, marks: tuple[int, ...] = (),
               scope: str = "") -> Generation:
        """Queue a request; raises NotReady if the pipeline is not healthy. `marks`: prompt positions
        where a prompt-cache checkpoint pays (the end of the system prompt), for caches that cannot trim;
        `scope`: its prompt-cache scope (orchestrator/cache_scope.py)."""
        if not self.health.ready:
            raise NotReady(f"pipeline is {self.health.state}: {self.health.reason}")
        gen = Generation(prompt, params, self._inbox, marks, scope)
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
                    self._deliver()
                    return
                self._dispatch_event(item)
                self._deliver()
            self._tick()
            self._deliver()

    def _emit(self, gen: Generation, event: TokenEvent | Finished | Failed) -> None:
        """Queue an event for a request's reader; `_deliver` hands them over once the event at hand
        is handled (and its next step sent: waking a streaming thread is not on the next token's path)."""
        self._emitted.append((gen, event))

    def _deliver(self) -> None:
        """Hand the emitted events to their requests' readers, in order."""
        emitted, self._emitted = self._emitted, []
        for gen, event in emitted:
            gen.events.put(event)

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
            self._emit(a.gen, Failed(message))
        self._active.clear()
        self._ready.clear()
        self._group_of.clear()
        self._group_left.clear()
        self._passes.clear()
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
            self._emit(gen, Failed(f"pipeline is {self._state}: {self._reason}"))
            return
        # the readiness probe and the idle canary are never counted as requests: with max_requests = 1
        # a canary in flight must not turn the one allowed request away
        if not internal and self._public_count() >= self.max_requests:
            self._emit(gen, Failed(f"too many requests in flight ({self.max_requests}); retry later", 429))
            return
        prompt = gen.prompt
        reuse = None if internal else self.cache.plan(prompt, gen.scope)
        a = self._open(gen, internal, canary, reuse)
        rid, first = a.rid, [a.opened]
        # Prefill prompt[:-1] in chunks (cache only), then the last token samples: generate_step's order.
        # A prompt-cache hit starts after the reused prefix, as mlx-lm's server does with its cache.
        for start, end, checkpoint in self._chunks(gen, reuse.keep if reuse else 0):
            frames = first + [tokens_frame(rid, start, prompt[start:end], self._solo(1))]
            if checkpoint:
                entry = self.cache.add(prompt[:end], "system", gen.scope)
                frames.append(json_frame(Kind.CACHE, {"snapshot": rid, "as": entry, "tokens": end,
                                                      **self._disk_part(prompt[:end], "system", gen.scope)}))
            if not self._send(0, frames):
                return
            first = []
        a.position = len(prompt) - 1
        a.next_token = prompt[-1]
        self._launch([a], first)
        self.metrics.set_in_flight(self._public_count())

    def _open(self, gen: Generation, internal: bool, canary: bool = False, reuse: Reuse | None = None) -> _Active:
        """Track a new request; its OPEN frame (sampling parameters, the prompt-cache entry it
        starts from) is `opened`."""
        rid = next(self._ids)
        a = _Active(gen, rid, internal=internal, canary=canary, tokens=[], reuse=reuse)
        gen.rid = rid
        self._active[rid] = a
        p = gen.params
        params = p.sampling_json(gen.prompt)
        gen.cached_tokens = reuse.keep if reuse is not None else 0
        if reuse is not None:
            params["cache"] = {"from": reuse.entry, "keep": reuse.keep}
            self.cache.used(reuse)
        a.opened = json_frame(Kind.OPEN, params, request_id=rid)
        if not internal and self.speculative_tokens and p.grammar is None:
            a.lookup, a.length = Lookup(tokens=list(gen.prompt)), DraftLength(self.speculative_tokens)
        return a

    def _chunks(self, gen: Generation, start: int) -> list[tuple[int, int, bool]]:
        """The prefill chunks of prompt[start:-1], cut also at each mark whose state only a
        checkpoint could keep (the checkpoint is taken there)."""
        marks = {m for m in gen.marks if self.cache.needs_checkpoint(m)}
        return prefill_chunks(len(gen.prompt), start, self.prefill_step, marks)

    def _solo(self, members: int) -> Flag:
        """SOLO when nothing else is in flight: co-located stages may then use all cores (a stage
        computes only while the others wait for it). Prefill chunks are not tracked as groups, so
        also require that no other request is active."""
        return Flag.SOLO if not self._group_left and len(self._active) == members else Flag.NONE

    def _launch(self, members: list[_Active], prefix: list[Frame] | None = None, solo: bool = True) -> None:
        gid = next(self._group_ids)
        frames = list(prefix or [])
        solo = self._solo(len(members)) if solo else Flag.NONE
        chunks = []
        may_draft = drafts_now(len(members), len(self._active), self.speculate_alone)
        for a in members:
            draft = self._draft(a) if may_draft else []
            if draft:  # DRAFT frames first: a control frame between two FORWARDs would split the stages' step
                frames.append(json_frame(Kind.DRAFT, {"tokens": draft}, request_id=a.rid))
                self._passes[a.rid] = [len(draft), 0]
            chunks.append(tokens_frame(a.rid, a.position, [a.next_token, *draft], Flag.SAMPLE | solo))
            self._group_of[a.rid] = gid
        frames += chunks
        self._group_left[gid] = len(members)
        self._send(0, frames)
        if self.trace is not None:
            self.trace.mark("sent")

    def _dispatch(self) -> None:
        """Send ready requests as micro-batches, keeping at most one group per stage in flight."""
        depth = len(self.links)
        while self._ready and len(self._group_left) < depth:
            decoding = len(self._ready) + sum(self._group_left.values())
            size = min(self.max_batch, max(1, math.ceil(decoding / depth)))
            batch, self._ready = self._ready[:size], self._ready[size:]
            self._launch([self._active[r] for r in batch])

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

