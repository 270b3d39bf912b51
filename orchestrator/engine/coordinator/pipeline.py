"""The coordinator's scheduler: drives requests through the stages and keeps them busy.

One thread owns all scheduling state and is fed by one inbox (submissions and cancellations from
HTTP threads, frames and link events from the stage links). Prefill is sent in chunks exactly as
`mlx_lm.generate_step` cuts them, every `prefill_step_size` tokens or, pipelined, every c tokens so
that the stages overlap (`prefill_plan.py`); decode steps of ready requests are grouped into
micro-batches, with up to one group in flight per stage so that every stage works on a different
group at the same time. What the stages answer (RESULT, ERROR, PONG, CACHE frames) becomes each
request's token events and its end here too.

The scheduler holds its parts and calls them; none of them calls back: the book of requests in
flight (`requests.Book`), what the stages' liveness makes due (`liveness.Liveness`, which returns
verdicts this thread acts on) and what the readiness probe must answer (`liveness.Probe`), drafting
and its passes (`speculation.Speculation`), and the prompt cache (`prompt_caching.PromptCache`, which
reaches stage 0 through one `send`).
"""

from __future__ import annotations

import math
import os
import queue
import threading
from dataclasses import replace

from orchestrator import settings
from orchestrator.engine.config import ClusterConfig
from orchestrator.engine.coordinator.drafting import DraftLength, Lookup
from orchestrator.engine.coordinator.generation import (
    Failed,
    Finished,
    Generation,
    GenerationParams,
    Health,
    NotReady,
    Paused,
    TokenEvent,
)
from orchestrator.engine.coordinator.links import StageLink, now
from orchestrator.engine.coordinator.liveness import (
    PROBE_PROMPT,
    PROBE_REQUESTS,
    PROBE_TIMEOUT,
    TICK,
    Liveness,
    Probe,
)
from orchestrator.engine.coordinator.metrics import Metrics
from orchestrator.engine.coordinator.pauses import Pauses
from orchestrator.engine.coordinator.prefill_batch import PrefillBatch, aligned_steps, batched_mode
from orchestrator.engine.coordinator.prefill_plan import batch_rows, pipelined_chunks, prompt_chunks
from orchestrator.engine.coordinator.prefix_index import PrefixIndex, Reuse
from orchestrator.engine.coordinator.prompt_caching import PromptCache
from orchestrator.engine.coordinator.requests import Active, Book, Held
from orchestrator.engine.coordinator.resume import replay_groups
from orchestrator.engine.coordinator.speculation import Speculation
from orchestrator.engine.coordinator.watchdog import Watchdog, canary_interval, stall_timeout
from orchestrator.engine.stage.faults import Faults
from orchestrator.engine.stage.sampling import decode_result
from orchestrator.engine.stage_address import route_frame
from orchestrator.engine.steptrace import StepTrace
from orchestrator.engine.tensors import tokens_frame
from orchestrator.engine.wire import Flag, Frame, FrameError, Kind, json_frame
from orchestrator.logs import EventLogger


class Pipeline:
    """Coordinator-side engine over the configured stages."""

    def __init__(self, config: ClusterConfig, secret: bytes, eos_ids: set[int], context_length: int,
                 log: EventLogger, metrics: Metrics | None = None, faults: Faults | None = None) -> None:
        self.config = config
        self.eos_ids = set(eos_ids)
        self._thread: threading.Thread | None = None
        self.context_length = context_length
        self.log = log
        self.metrics = metrics or Metrics([s.id for s in config.stages])
        self.prefill_step = config.cluster.prefill_step_size
        self.max_batch = config.cluster.max_batch
        self.max_requests = config.cluster.max_requests
        self.speculative_tokens = config.cluster.speculative_tokens
        # how long an answer in flight waits, paused, for a lost stage's replacement (0: it fails at once)
        self.resume_deadline = settings.RESUME_DEADLINE_S.read()
        # concurrent requests' prefills one after another (exact) or together (batched: prefill_batch.py)
        self.prefills = PrefillBatch(batched_mode())
        self.pipelined = pipelined_chunks()  # prompts cut every prefill_step_size or for overlap (prefill_plan.py)
        self.faults = faults or Faults()  # test-only: a resume that is not exact (resume-repeat/-drop/-reseed)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # C put/get: a cheaper hand-off per token
        self.links = [
            StageLink(i, s.id, s.host_port, secret, config.cluster.max_frame_bytes, self._inbox, log)
            for i, s in enumerate(config.stages)
        ]
        # scheduler-thread state: the parts, and what is left of the thread's own
        self.requests = Book()
        self.pauses = Pauses()  # what became of the answers held across a lost stage (`/health`'s pause)
        self.liveness = Liveness(self.links, Watchdog(len(self.links), stall_timeout(config.cluster.stall_timeout_s)),
                                 canary_interval())
        self.probe = Probe()
        self.speculation = Speculation(self.metrics, context_length, self.liveness.all_stats)
        # Entry ids start at a random base, like request ids: a stage never confuses two sessions' entries.
        self.cache = PrefixIndex(len(self.links), config.cluster.prompt_cache_budget,
                                 first_id=int.from_bytes(os.urandom(3), "little") << 32)
        # The disk tier: saves carry their tokens (the stages write files), and once ready the
        # index learns the files every stage holds (a restarted stage comes back warm).
        self.prompt_cache = PromptCache(self.cache, self.cache.enabled and config.cluster.prompt_cache_disk_bytes > 0,
                                        [ln.node_id for ln in self.links], lambda frames: self._send(0, frames),
                                        lambda: self.links[0].conn is not None, log, self.metrics)
        self._emitted: list[tuple[Generation, TokenEvent | Finished | Failed]] = []  # for `_deliver`
        self.trace = StepTrace.of("coordinator")  # None unless PIPESERVE_STEP_TRACE names a file
        self._state, self._reason = "starting", "connecting to stages"
        self._state_changed = threading.Condition()  # wakes `/health?wait=` long polls (`wait_while`)
        self.health: Health = self.liveness.snapshot(self._state, self._reason, 0)

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

    def wait_while(self, state: str, timeout: float) -> Health:
        """The health once the pipeline's state is no longer `state`, or after `timeout` s
        (any thread). A watcher long-polls this: a lost stage is known to the control plane
        when the coordinator learns it (its socket closed), not at the watcher's next look."""
        with self._state_changed:
            self._state_changed.wait_for(lambda: self.health.state != state, timeout)
        return self.health

    # --- the thread and its inbox ---------------------------------------------------------
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
                self._handle(item)
                if self._inbox.empty():  # a burst of submissions is one batch (prefill_batch.py)
                    self._send_prefills()
                self._deliver()
            self._tick()
            self._deliver()

    def _handle(self, item: tuple) -> None:
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

    def _emit(self, gen: Generation, event: TokenEvent | Finished | Failed) -> None:
        """Queue an event for a request's reader; `_deliver` hands them over once the event at hand
        is handled (and its next step sent: waking a streaming thread is not on the next token's path)."""
        self._emitted.append((gen, event))

    def _deliver(self) -> None:
        """Hand the emitted events to their requests' readers, in order."""
        emitted, self._emitted = self._emitted, []
        for gen, event in emitted:
            gen.events.put(event)

    def _set_state(self, state: str, reason: str) -> None:
        if (state, reason) != (self._state, self._reason):
            self.log.info("pipeline.state", state=state, reason=reason)
        self._state, self._reason = state, reason
        self.health = self.liveness.snapshot(state, reason, len(self.requests.active))
        with self._state_changed:
            self._state_changed.notify_all()

    def _fail_all(self, message: str) -> None:
        for a in self.requests.clear():
            self._emit(a.gen, Failed(message))
            self.pauses.lost(a.gen, now())
        self.speculation.clear()
        self.metrics.set_in_flight(self.requests.public_count())

    # --- holding and resuming across a lost stage ---------------------------------------------
    def _hold_all(self, message: str) -> None:
        """A stage is lost or wedged: every answer in flight waits, paused, for the pipeline to be ready
        again (`_resume_held`), at most `resume_deadline` s; the probe, the canary and requests whose
        client left fail as before."""
        t = now()
        for a in self.requests.clear():
            if a.internal or a.cancelled or not self.resume_deadline:
                self._emit(a.gen, Failed(message))
                self.pauses.lost(a.gen, t)
                continue
            has = [x for x in (a.tokens or []) + a.replay if x is not None]  # what its client has
            self.requests.held.append(Held(a.gen, has, t, message))
            self.pauses.held(a.gen, t)
            self._emit(a.gen, Paused(message))
            self.log.info("request.held", request=a.rid, tokens=len(has), reason=message)
        self.speculation.clear()
        self.metrics.set_in_flight(self.requests.public_count())

    def _resume_held(self) -> None:
        """The pipeline is ready again: each held request starts over and first generates again what
        its client has — compared token by token, never sent twice — then goes on."""
        held, self.requests.held = self.requests.held, []
        self.pauses.resuming(now())
        replaying = []
        for h in held:
            self.log.info("request.resuming", tokens=len(h.tokens), held_s=round(now() - h.since, 3))
            replay: list[int | None] = list(h.tokens)
            if "resume-drop" in self.faults.kinds:
                replay.append(None)  # test-only: one token generated and never sent
            a = self._admit(h.gen, internal=False, replay=replay)
            if a is not None and a.replay:
                replaying.append(a)
        # Every known token's decode step at once, pipelined through the stages (resume.py).
        for group in replay_groups(replaying):
            if not self._send(0, group):
                return

    def _fail_held(self, message: str | None = None) -> None:
        """Held requests fail: all of them with `message`, or (None) those held past the resume deadline."""
        t = now()
        for h in [h for h in self.requests.held if message is not None or t - h.since > self.resume_deadline]:
            self.requests.held.remove(h)
            self._emit(h.gen, Failed(message or f"{h.reason}; not resumed within {self.resume_deadline:.0f} s"))
            self.metrics.resumed(False)
            self.pauses.lost(h.gen, t)
        self.metrics.set_in_flight(self.requests.public_count())

    def _replayed(self, a: Active, token: int, last: bool) -> None:
        """A resumed request's token that its client already has: it must be the one sent before."""
        expected = a.replay.pop(0)
        if expected is not None and token != expected:
            self.metrics.resumed(False)
            self.pauses.lost(a.gen, now())
            self._finish(a, Failed(f"resuming after a lost stage, the pipeline generated token {token} where the "
                                   f"answer has {expected}: it cannot go on exactly", 500))
            return
        a.generated += 1
        a.tokens.append(token)
        a.next_token = token
        if not a.replay:  # its steps went out together (resume.py): the next one waits for this last one
            self.metrics.resumed(True)
            self.pauses.resumed(a.gen, now())
            self.log.info("request.resumed", request=a.rid, tokens=a.generated)
            if "resume-repeat" in self.faults.kinds:
                self._emit(a.gen, TokenEvent(token, 0.0))  # test-only: a token sent twice
            if last:
                self.requests.ready.append(a.rid)

    def _shutdown(self) -> None:
        self._fail_all("coordinator shutting down")
        self._fail_held("coordinator shutting down")
        for link in self.links:
            link.stop()
            if link.conn is not None:
                link.conn.close()
        self._set_state("stopped", "stopped")

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

    # --- requests in ------------------------------------------------------------------------
    def _admit(self, gen: Generation, internal: bool, canary: bool = False,
               replay: list[int | None] | None = None) -> Active | None:
        """Start a request: its OPEN and prefill chunks go to stage 0, then its first decode step.
        `replay`: a resumed request, with the tokens its client has; its decode steps that generate
        them again are the caller's to send (`_resume_held`). Returns the request, if admitted."""
        if not internal and self._state != "ready":
            self._emit(gen, Failed(f"pipeline is {self._state}: {self._reason}"))
            self.pauses.lost(gen, now())
            return None
        # the readiness probe and the idle canary are never counted as requests: with max_requests = 1
        # a canary in flight must not turn the one allowed request away; a resumed one was counted
        if not internal and replay is None and self.requests.public_count() >= self.max_requests:
            self._emit(gen, Failed(f"too many requests in flight ({self.max_requests}); retry later", 429))
            return None
        prompt = gen.prompt
        # A resumed request starts cold: the index was emptied with the lost stage.
        reuse = None if internal or replay is not None else self.cache.plan(prompt, gen.scope)
        a = self._open(gen, internal, canary, reuse, resumed=replay is not None)
        if replay is not None:
            a.replay = list(replay)
            if not a.replay:  # lost in its prefill: nothing to generate again
                self.metrics.resumed(True)
                self.pauses.resumed(gen, now())
        if self.prefills.batched and not internal and replay is None:
            self.prefills.wait(a)  # sent with the others that arrive meanwhile (`_send_prefills`)
            self.metrics.set_in_flight(self.requests.public_count())
            return a
        rid, first = a.rid, [a.opened]
        # Prefill prompt[:-1] in chunks (cache only), then the last token samples: generate_step's order.
        # A prompt-cache hit starts after the reused prefix, as mlx-lm's server does with its cache.
        for start, end, checkpoint in self._chunks(gen, reuse.keep if reuse else 0):
            frames = first + [tokens_frame(rid, start, prompt[start:end], self._solo(1))]
            if checkpoint:
                entry = self.cache.add(prompt[:end], "system", gen.scope)
                frames.append(json_frame(Kind.CACHE, {"snapshot": rid, "as": entry, "tokens": end,
                                                      **self.prompt_cache.disk_part(prompt[:end], "system",
                                                                                    gen.scope)}))
            if not self._send(0, frames):
                return None
            first = []
        a.position = len(prompt) - 1
        a.next_token = prompt[-1]
        if a.replay:
            if first and not self._send(0, first):
                return None
        else:
            self._launch([a], first)
        self.metrics.set_in_flight(self.requests.public_count())
        return a

    def _open(self, gen: Generation, internal: bool, canary: bool = False, reuse: Reuse | None = None,
              resumed: bool = False) -> Active:
        """Track a new request; its OPEN frame (sampling parameters, the prompt-cache entry it
        starts from) is `opened`. A sampling request gets its seed here, not on the last stage: a
        resumed request must draw again exactly what it drew."""
        a = self.requests.open(gen, internal, canary, reuse)
        a.resumed = resumed
        reseed = resumed and "resume-reseed" in self.faults.kinds  # test-only: the sampler started over
        if gen.params.temperature > 0 and (gen.params.seed is None or reseed):
            gen.params = replace(gen.params, seed=int.from_bytes(os.urandom(4), "little"))
        params = gen.params.sampling_json(gen.prompt)
        gen.cached_tokens = reuse.keep if reuse is not None else 0
        if reuse is not None:
            params["cache"] = {"from": reuse.entry, "keep": reuse.keep}
            self.cache.used(reuse)
        if not internal and not resumed:  # it was looked up: /metrics counts it now, not at the next stage ack
            self.prompt_cache.observe()
        a.opened = json_frame(Kind.OPEN, params, request_id=a.rid)
        if not internal and not resumed and self.speculative_tokens and gen.params.grammar is None:
            a.lookup, a.length = Lookup(tokens=list(gen.prompt)), DraftLength(self.speculative_tokens)
        return a

    def _chunks(self, gen: Generation, start: int) -> list[tuple[int, int, bool]]:
        """The prefill chunks of prompt[start:-1], cut also at each mark whose state only a
        checkpoint could keep (the checkpoint is taken there). Pipelined, every c tokens (prefill_plan.py)."""
        marks = {m for m in gen.marks if self.cache.needs_checkpoint(m)}
        return prompt_chunks(len(gen.prompt), start, len(self.links), self.prefill_step, self.pipelined, marks)

    def _send_prefills(self) -> None:
        """Batched prefill: the waiting requests' prefill chunks as equal-length steps of one group each
        (flagged BATCH: every stage runs a step as one forward), then their first decode steps together
        (prefill_batch.py). Nothing while the batch before still owes a first token."""
        members = self.prefills.take(self.requests.active)
        if not members:
            return
        solo = self._solo(len(members))
        starts = {a.rid: (a.reuse.keep if a.reuse else 0) for a in members}
        rows = batch_rows([(a.rid, self._chunks(a.gen, starts[a.rid])) for a in members], len(self.links),
                          self.pipelined)
        steps = aligned_steps(rows)
        first = [a.opened for a in members]
        for step in steps:
            frames = first + [tokens_frame(c.rid, c.start, self.requests.active[c.rid].gen.prompt[c.start:c.end],
                                           solo | Flag.BATCH) for c in step]
            for c in (c for c in step if c.checkpoint):
                gen = self.requests.active[c.rid].gen
                frames.append(json_frame(Kind.CACHE, {"snapshot": c.rid, "as": self.cache.add(gen.prompt[:c.end],
                                                                                               "system", gen.scope),
                                                      "tokens": c.end, **self.prompt_cache.disk_part(
                                                          gen.prompt[:c.end], "system", gen.scope)}))
            if not self._send(0, frames):
                return
            first = []
        for a in members:
            a.position, a.next_token = len(a.gen.prompt) - 1, a.gen.prompt[-1]
        for i in range(0, len(members), self.max_batch):  # their first decode steps: micro-batches as ever
            self._launch(members[i:i + self.max_batch], first if i == 0 else None)

    def _solo(self, members: int) -> Flag:
        """SOLO when nothing else is in flight: co-located stages may then use all cores (a stage
        computes only while the others wait for it). Prefill chunks are not tracked as groups, so
        also require that no other request is active."""
        return Flag.SOLO if not self.requests.groups and len(self.requests.active) == members else Flag.NONE

    def _launch(self, members: list[Active], prefix: list[Frame] | None = None, solo: bool = True) -> None:
        frames = list(prefix or [])
        solo = self._solo(len(members)) if solo else Flag.NONE
        chunks = []
        for a in members:
            draft = self.speculation.draft(a, len(members), len(self.requests.active))
            if draft:  # DRAFT frames first: a control frame between two FORWARDs would split the stages' step
                frames.append(json_frame(Kind.DRAFT, {"tokens": draft}, request_id=a.rid))
            chunks.append(tokens_frame(a.rid, a.position, [a.next_token, *draft], Flag.SAMPLE | solo))
        frames += chunks
        self.requests.launched(members)
        self._send(0, frames)
        if self.trace is not None:
            self.trace.mark("sent")

    def _dispatch(self) -> None:
        """Send ready requests as micro-batches, keeping at most one group per stage in flight."""
        book, depth = self.requests, len(self.links)
        while book.ready and len(book.groups) < depth:
            decoding = len(book.ready) + sum(book.groups.values())
            size = min(self.max_batch, max(1, math.ceil(decoding / depth)))
            batch, book.ready = book.ready[:size], book.ready[size:]
            self._launch([book.active[r] for r in batch])

    def _cancel(self, gen: Generation) -> None:
        a = self.requests.get(getattr(gen, "rid", None))
        if a is None or a.gen is not gen:
            if self.requests.release(gen):  # held, and its client left: its slot is free at once
                self.metrics.set_in_flight(self.requests.public_count())
                self.pauses.lost(gen, now())
            return
        if a.rid in self.requests.ready:
            self.requests.ready.remove(a.rid)
            self._finish(a, None)
        else:
            a.cancelled = True  # finished when its in-flight step returns

    # --- answers out --------------------------------------------------------------------------
    def _on_frames(self, index: int, frames: list[Frame]) -> None:
        t = now()
        self.liveness.heard(index, t)
        if self.trace is not None and frames[0].kind is Kind.RESULT:
            self.trace.mark("results")
        for f in frames:
            if f.kind is Kind.RESULT:
                self._on_result(f)
            elif f.kind is Kind.PONG:
                try:
                    stats = f.json()
                    self.metrics.observe_stage(self.links[index].node_id, stats)
                    self.liveness.pong(index, stats, t)
                except (FrameError, AttributeError, TypeError, ValueError):
                    pass
            elif f.kind is Kind.ERROR:
                self._on_error(index, f)
            elif f.kind is Kind.CACHE:
                self.prompt_cache.on_ack(index, f)
        self._dispatch()

    def _on_result(self, f: Frame) -> None:
        last = not f.flags & Flag.RUN  # a verification pass sends its tokens as a RUN of RESULTs
        self.speculation.result(f.request_id)
        a = self.requests.get(f.request_id)
        if last:
            self.requests.step_returned(f.request_id)
            self.speculation.pass_returned(f.request_id, a)
        if a is None:
            return
        try:
            token, logprob, top = decode_result(f.payload)
        except ValueError as exc:
            self._finish(a, Failed(f"bad result from the last stage: {exc}", 502))
            return
        a.position = f.position
        if a.cancelled:  # mid-replay, later steps are still out: its cache is no entry to keep
            self._finish(a, None, save=not a.replay)
            return
        if a.replay:
            self._replayed(a, token, last)
            return
        a.generated += 1
        if a.tokens is not None:
            a.tokens.append(token)
        if a.lookup is not None:
            a.lookup.extend([token])
        if a.generated == 1 and a.internal and not a.canary:
            wrong = self.probe.check(token)
            if wrong:
                self._finish(a, Failed(wrong))
                return
        if a.generated == 1 and not a.internal and not a.resumed:
            self.metrics.observe_ttft(now() - a.gen.submitted)
        self._emit(a.gen, TokenEvent(token, logprob, tuple(top)))
        if not a.internal:
            self.metrics.add_tokens(1)
        if a.internal and a.generated >= a.gen.params.max_tokens:
            self._finish(a, Finished("length"))
            if not any(x.internal for x in self.requests.active.values()) and self._state == "warming":
                self.probe.passed()
                self._set_state("ready", "all stages served the probe: prefill, sampling and batched decode")
                self.prompt_cache.list_disk()
                self._resume_held()
        elif token in self.eos_ids and not a.internal:
            self._finish(a, Finished("stop"))
        elif not a.internal and (a.generated >= a.gen.params.max_tokens or a.position >= self.context_length):
            self._finish(a, Finished("length"))
        else:
            a.next_token = token
            if last:
                self.requests.ready.append(a.rid)

    def _on_error(self, index: int, f: Frame) -> None:
        try:
            message = str(f.json().get("message", "stage error"))
        except (FrameError, AttributeError):
            message = "stage error"
        a = self.requests.get(f.request_id)
        self.log.warning("request.stage_error", stage=self.links[index].node_id, request=f.request_id, reason=message)
        if a is None:
            return
        self.requests.step_returned(a.rid)
        if a.reuse is not None and "prompt cache" in message:
            # A stage could not start it from the entry the index named: forget that entry and
            # start the request again without it (it has produced nothing yet).
            self.prompt_cache.drop([a.reuse.entry])
            if a.generated == 0 and not a.cancelled:
                self._finish(a, None, save=False)
                self._admit(a.gen, internal=a.internal, canary=a.canary)
                return
        self._finish(a, Failed(f"{self.links[index].node_id}: {message}", 500))

    def _finish(self, a: Active, event: Finished | Failed | None, save: bool = True) -> None:
        self.requests.close(a.rid)
        self.speculation.forget(a.rid)
        if a.replay:  # it ends before it caught up with its client (gone, or a token that differed)
            self.pauses.lost(a.gen, now())
        if event is not None:
            self._emit(a.gen, event)
        if a.canary:
            self.liveness.watchdog.canary_returned()
        if a.internal and isinstance(event, Failed):
            what = "canary" if a.canary else "probe generation"
            self._set_state("unhealthy", f"{what} failed: {event.message}")
        close = Frame(Kind.CLOSE, a.rid, a.position)  # where it ended: a stage past it rolls back (speculation)
        if save and not a.internal and not isinstance(event, Failed) and self.cache.enabled and a.position > 1:
            # The stages keep its cache (prompt and generated tokens, all but the last sampled) as an entry.
            covered = (list(a.gen.prompt) + (a.tokens or []))[:a.position]
            close = json_frame(Kind.CLOSE, {"save": self.cache.add(covered, "assistant", a.gen.scope),
                                            **self.prompt_cache.disk_part(covered, "assistant", a.gen.scope)},
                               request_id=a.rid, position=a.position)
        self._send(0, [close])
        self.metrics.set_in_flight(self.requests.public_count())

    # --- the stages' liveness -------------------------------------------------------------------
    def _tick(self) -> None:
        t = now()
        book = self.requests
        v = self.liveness.tick(t, busy=not book.only_canaries(),
                               idle_and_ready=self._state == "ready" and not book.active)
        if v is None:
            return
        if v.ping:
            for link in self.links:
                if link.conn is not None:
                    self._send(link.index, [Frame(Kind.PING)])
        for index, why in v.lost:
            if self.links[index].conn is not None:
                self._lose(index, why)
        for index, why in v.wedged:
            if self.links[index].conn is not None and index not in self.liveness.wedged:
                self._wedge(index, why)
        for index in v.recovered:
            self._unwedge(index)
        if v.canary:
            self._admit(Generation(list(PROBE_PROMPT[:2]), GenerationParams(max_tokens=1), self._inbox),
                        internal=True, canary=True)
        if book.held and self.resume_deadline:
            self._fail_held()
        probe = book.probe()
        if probe is not None and t - probe.gen.submitted > PROBE_TIMEOUT:
            self._finish(probe, Failed(f"no answer to the probe within {PROBE_TIMEOUT:.0f} s"))
        elif probe is None and self._state == "unhealthy" and self.liveness.may_reprobe(t):
            self._probe()
        self.health = self.liveness.snapshot(self._state, self._reason, len(book.active))

    def _wedge(self, index: int, why: str) -> None:
        """Declare a stage wedged: its link stays (pings still answer) but nothing is sent through it
        until it moves again (`_unwedge`) or its connection goes (the control plane replaces the process)."""
        self.liveness.wedged[index] = why
        self.liveness.watchdog.canary_returned()
        message = f"pipeline stage {self.links[index].label} wedged: {why}"
        self.log.warning("stage.wedged", stage=self.links[index].node_id, reason=why,
                         progress=self.liveness.stats.get(index), held_requests=len(self.requests.active))
        self._hold_all(message)
        self._set_state("unhealthy", message)

    def _unwedge(self, index: int) -> None:
        """A stage judged wedged computes again (it was slow, or stuck for a while): drop the stale
        requests it still holds (a RESET down the chain) and probe; the pipeline serves again on its own."""
        why = self.liveness.wedged.pop(index)
        self.log.info("stage.recovered", stage=self.links[index].node_id, was=why)
        if not self.liveness.wedged and all(ln.conn is not None for ln in self.links):
            self._send(0, [Frame(Kind.RESET)])
            self._probe()

    def _on_link_up(self, index: int, conn) -> None:
        link = self.links[index]
        if link.conn is not None:
            link.conn.close()
        link.conn = conn
        self.liveness.connected(index, now())
        self.log.info("link.up", stage=link.node_id)
        self.prompt_cache.forget(f"stage {link.label} (re)connected")
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
        self.liveness.last_probe = now()
        self._set_state("warming", "probing the pipeline: prefill, then batched decode of two requests")
        tokens = self.probe.started()
        members = [self._open(Generation(list(PROBE_PROMPT), GenerationParams(max_tokens=tokens), self._inbox),
                              internal=True) for _ in range(PROBE_REQUESTS)]
        chunks = [tokens_frame(a.rid, 0, PROBE_PROMPT[:-1]) for a in members]
        for a in members:
            a.position, a.next_token = len(PROBE_PROMPT) - 1, PROBE_PROMPT[-1]
        if self._send(0, [m.opened for m in members] + chunks):
            self._launch(members, solo=False)  # not SOLO: a fresh stage warms up on its usual threads

    def _lose(self, index: int, reason: str) -> None:
        link = self.links[index]
        if link.conn is not None:
            link.conn.close()
            link.conn = None
        self.liveness.gone(index)
        message = f"pipeline stage {link.label} lost: {reason}"
        self.prompt_cache.forget(message)
        self.log.warning("link.down", stage=link.node_id, reason=reason, held_requests=len(self.requests.active))
        self._hold_all(message)
        self._set_state("unhealthy" if self._state in ("ready", "warming", "unhealthy") else "starting", message)
