"""A pipeline stage: owns a layer range, receives frames over TCP, computes, passes on.

Threads: the gate's accept thread and one reader per connection (engine/stage/gate.py, which
also answer PINGs, so a stage busy with a long prefill still proves it is alive), and the MLX
thread — the caller of `Stage.run()` — which alone owns the model, the KV caches and the
outbound connections (engine/stage/links.py). Readers feed it through one inbox queue.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any

import mlx.core as mx

from orchestrator.engine import transport
from orchestrator.engine.config import ClusterConfig, NodeSpec
from orchestrator.engine.stage.carry import Carry
from orchestrator.engine.stage.constraint import Constraints, model_eos_ids
from orchestrator.engine.stage.control import Control
from orchestrator.engine.stage.faults import Faults
from orchestrator.engine.stage.gate import Gate
from orchestrator.engine.stage.interrupt import INTERRUPTIBLE_TOKENS, LAYER_PAUSE_S, Abandoned
from orchestrator.engine.stage.links import Links
from orchestrator.engine.stage.prompt_cache import StageCache, disk_tier
from orchestrator.engine.stage.request import RequestState
from orchestrator.engine.stage.rewind import rollback_for
from orchestrator.engine.stage.shard import StageModel
from orchestrator.engine.stage.speculate import verified
from orchestrator.engine.stage.stats import RECENT_STEPS, Progress, StageStats, progress_json, rss_bytes
from orchestrator.engine.steptrace import StepTrace
from orchestrator.engine.tensors import framed_ahead, from_frame, from_frame_with, to_frame
from orchestrator.engine.wire import Flag, Frame, Kind, json_frame
from orchestrator.logs import EventLogger


class Stage:
    """The stage process's state and loops (its control frames: `control.Control`, which it holds)."""

    def __init__(self, config: ClusterConfig, node: NodeSpec, model: StageModel, secret: bytes,
                 listener: socket.socket, log: EventLogger, blas: str = "reference",
                 threads: tuple[int, int] = (0, 0)) -> None:
        self.config = config
        self.node = node
        self.model = model
        self.log = log
        self.index = node.stage or 0
        stages = config.stages
        next_node = stages[self.index + 1] if self.index + 1 < len(stages) else None
        upstream_role = "coordinator" if self.index == 0 else f"stage-{self.index - 1}"
        max_frame = config.cluster.max_frame_bytes
        # SimpleQueue: its put/get are C, a cheaper hand-off on every step than Queue's Python locks
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.gate = Gate(listener, secret, max_frame, upstream_role, (n.host_port[0] for n in config.nodes),
                         self.inbox, self._pong, log, stage=self.index)
        # MLX-thread state
        self.requests: dict[int, RequestState] = {}
        self.links = Links(self.index, next_node, secret, max_frame, log)
        refusal = model.speculation_refusal
        # how a request goes back after a verification chunk (rewind.py); None: this stage never verifies
        self.rollback = rollback_for(model)
        speculation = {"speculation": self.rollback is not None, "rollback": self.rollback and self.rollback.how}
        if self.rollback is not None and self.rollback.stepwise:
            speculation["verification"] = "stepwise"  # one position at a time (support.STEPWISE)
        if refusal:
            speculation["speculation_refused"] = refusal
        self.stats = StageStats(self.index, model.layer_range, rss_bytes=rss_bytes(),
                                weight_bytes=model.weight_bytes, extra={"blas": blas, "node": node.id,
                                                                    **speculation})
        self._stop = threading.Event()
        # (base, solo) BLAS threads: solo for steps marked SOLO, base otherwise; (0, 0) = never switch.
        self.base_threads, self.solo_threads = threads
        self.faults = Faults.for_node(node.id)
        self.prompt_cache = StageCache(self.faults, disk_tier(config, model, log))  # entries the index names
        self._batch_refusal_logged = False
        self._chunks_refusal_logged = False
        self._batched_chunks = 0  # prefill chunks run in a batched forward (the PONG's batched_chunks)
        self.current_threads = self.base_threads
        self.progress: Progress | None = None  # written by the MLX thread, read by readers' PONGs
        self._recent_ms: deque[float] = deque(maxlen=RECENT_STEPS)  # the last steps' times (the slowest is published)
        self.constraints = Constraints(model.model_dir, model.info.vocab_size)  # grammars, last stage only
        if self.next_node is None:  # the last stage samples: llguidance's tokenizer now, not on a request
            self._prepare_grammars(log)
        self.control = Control(model, self.index, self.links, self.faults, self.constraints, self.prompt_cache,
                               self.requests, self.rollback, log, drop_all=self._drop_all, publish=self._publish,
                               error=self._error, end_request=self._end_request,
                               send_coordinator=self._send_coordinator)
        if "layer-pause" in self.faults.kinds and hasattr(model, "checks"):
            model.checks.pause_s = LAYER_PAUSE_S
        self.trace = StepTrace.of(f"stage-{self.index}")  # None unless PIPESERVE_STEP_TRACE names a file

    @property
    def next_node(self) -> NodeSpec | None:
        """The next stage's node (None on the last stage); ROUTE frames move it."""
        return self.links.next_node

    def _prepare_grammars(self, log: EventLogger) -> None:
        eos = model_eos_ids(self.model.model_dir)
        try:
            self.constraints.tokenizer(eos)
        except ValueError as exc:  # no tokenizer.json: constrained requests fail with this reason then
            log.info("grammars.unavailable", reason=exc)
            return
        log.info("grammars.prepared", eos_ids=eos)

    def serve(self) -> None:
        """Accept connections in a background thread (engine/stage/gate.py)."""
        self.gate.start()

    def _pong(self) -> Frame:
        """The answer to a PING: the stage's figures and what it is computing now (read by the gate's readers)."""
        stats = self.stats
        # resident memory read here, by the reader thread: not on every step's path (~50 µs)
        checks = getattr(self.model, "checks", None)
        return json_frame(Kind.PONG, {**stats.as_json(), "rss_bytes": rss_bytes(), "progress": progress_json(
            stats, self.progress, self.inbox.qsize(), time.monotonic(), checks.layers_done if checks else 0)})

    # --- the MLX thread ----------------------------------------------------------------
    def run(self) -> None:
        """Process the inbox until stopped; call from the thread that owns MLX."""
        while not self._stop.is_set():
            try:
                item = self.inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            what = item[0]
            if what == "coordinator":
                self._adopt_coordinator(item[1])
            elif what == "closed":
                if self.links.coordinator_closed(item[1]):
                    self._drop_all("coordinator disconnected")
            elif what == "group":
                # Read before a RESET that has arrived since: its requests are being dropped, so
                # its FORWARD frames are not computed. After a stage was lost, the abandoned
                # prefills queued here once held the recovery's probe back for over 60 s.
                self._handle_group(item[2], queued=item[3])

    def stop(self) -> None:
        """Ask the loops to end and close the listener."""
        self._stop.set()
        self.gate.stop()

    def _adopt_coordinator(self, conn: transport.Connection) -> None:
        self.links.adopt_coordinator(conn)
        self._drop_all("new coordinator session")

    def _drop_all(self, reason: str) -> None:
        if self.requests or self.prompt_cache.entries:
            self.log.info("requests.dropped", count=len(self.requests), cache_entries=len(self.prompt_cache.entries),
                          reason=reason)
        self.requests.clear()
        self.prompt_cache.clear()  # the coordinator's index of them is gone (or belongs to another session)
        self._publish()

    def _handle_group(self, group: list[Frame], queued: int | None = None) -> None:
        """Handle one group of frames from upstream; `queued`: the RESETs the gate had read when it
        queued them (None: never stale). A group a later RESET overtook is stale: its steps are skipped,
        or abandoned between layers when the RESET comes while they compute (interrupt.py)."""
        self._mark("received")
        out: list[Frame] = []
        run: list[Frame] = []
        if queued is not None and queued < self.gate.resets:
            skipped = [f for f in group if f.kind is Kind.FORWARD]
            if skipped:
                self.log.info("requests.skipped_before_reset", frames=len(skipped))
            group = [f for f in group if f.kind is not Kind.FORWARD]
        for frame in group:
            if frame.kind is Kind.FORWARD:
                run.append(frame)
                continue
            if run:
                out = self._forward(run, queued, out)
                run = []
            out += self.control.handle(frame)
        if run:
            out = self._forward(run, queued, out)
        if out:
            self._send_down(out)

    def _forward(self, frames: list[Frame], queued: int | None = None,
                 ahead: list[Frame] | None = None) -> list[Frame]:
        """Run the layers for FORWARD frames and send their output on at once: hidden frames
        downstream after the group's frames `ahead` of them (or RESULTs to the coordinator, if last);
        the step's bookkeeping only then. Returns the frames still to send (`ahead` when nothing
        was). `queued`: as for _handle_group (a long step is abandoned once a later RESET is read)."""
        ahead = ahead or []
        work: list[tuple[Frame, RequestState, mx.array]] = []
        for f in frames:
            state = self.requests.get(f.request_id)
            if state is None:
                self._error(f.request_id, f"stage {self.index}: unknown request")
            elif f.position != state.position and not self._rolled_back(f, state):
                pass
            else:
                try:
                    x = self._input(f)
                except ValueError as exc:
                    self._error(f.request_id, f"stage {self.index}: {exc}")
                    continue
                # a rollback's replay runs in front of the input (rewind.py)
                x, state.position = state.rewind.prepare(state.cache, state.position, x, state.draft is not None,
                                                         self.model.forward)
                work.append((f, state, x))
        if not work:
            return ahead
        self._mark("input")
        self._set_threads(all(f.flags & Flag.SOLO for f, _, _ in work))
        t0 = time.perf_counter()
        first, _, x0 = work[0]
        self.progress = Progress(time.monotonic(), first.request_id, first.position, int(x0.shape[1]), len(work))
        try:
            with self._interruptible(work, queued):
                outputs = self._compute(work)
        except Abandoned as exc:  # a RESET came: it drops these requests next
            self.log.info("step.abandoned", requests=len(work), reason=exc)
            return ahead
        except Exception as exc:  # a failed step fails its requests, not the stage
            self.log.error("step.failed", exc_info=True, requests=len(work))
            for f, _, _ in work:
                self._error(f.request_id, f"stage {self.index}: {exc}")
                self.requests.pop(f.request_id, None)
            return ahead
        finally:
            self.progress = None
        seconds = time.perf_counter() - t0
        if outputs:
            self._send_down(ahead + outputs)
            self._mark("sent")
            ahead = []
        self._record_step(seconds, len(work))
        return ahead

    def _interruptible(self, work: list[tuple[Frame, RequestState, Any]], queued: int | None) -> AbstractContextManager:
        """Layer by layer, abandoned if a RESET is read meanwhile, for a long step (interrupt.py)."""
        checks = getattr(self.model, "checks", None)
        if checks is None or queued is None or max(int(x.shape[1]) for _, _, x in work) < INTERRUPTIBLE_TOKENS:
            return nullcontext()
        return checks.interruptible(lambda: self.gate.resets > queued)

    def _input(self, f: Frame) -> mx.array | Carry:
        """A FORWARD frame's input to the model; ValueError when it does not fit this stage."""
        model = self.model
        if model.first:
            return from_frame(f, first=True, hidden=model.info.hidden_size, vocab=model.info.vocab_size,
                              dtype=model.dtype)
        h, extras = from_frame_with(f, hidden=model.hidden_shape, dtype=model.dtype, extras=model.expects(f.position))
        return Carry(h, extras) if extras else h

    def _rolled_back(self, f: Frame, state: RequestState) -> bool:
        """A frame behind the stage's position: the rollback after a verification chunk, or an error."""
        try:
            self.control.rollback_to(state, f.position)
            return True
        except ValueError as exc:
            self._error(f.request_id, f"stage {self.index}: {exc}")
            self.requests.pop(f.request_id, None)
            return False

    def _set_threads(self, solo: bool) -> None:
        """Use all the host's cores for SOLO steps (no other stage has work), the base count otherwise."""
        if not (self.solo_threads and self.base_threads):
            return
        want = self.solo_threads if solo else self.base_threads
        if want != self.current_threads:
            from orchestrator.engine import blas

            blas.set_threads(want)  # MLX is idle between steps: no BLAS call is running now
            self.current_threads = want

    def _compute(self, work: list[tuple[Frame, RequestState, mx.array]]) -> list[Frame]:
        model = self.model
        self.faults.before_step()
        # Decode rows run as one batch; prefill and verification chunks (several positions) one by one.
        rows = [i for i, (_, s, x) in enumerate(work) if x.shape[1] == 1 and s.position > 0]
        hs: list[Any] = [None] * len(work)
        if len(rows) > 1 and model.batchable:
            for i, h in zip(rows, model.forward_batch([work[i][2] for i in rows], [work[i][1].cache for i in rows])):
                hs[i] = h
            if model.batch_refusal and not self._batch_refusal_logged:
                self._batch_refusal_logged = True
                self.log.warning("batch.unavailable", reason=model.batch_refusal,
                                 detail="decode steps now run one request at a time (still exact)")
        self._batch_chunks(work, hs)
        hs = [s.rewind.forward(model.forward, x, s.cache) if h is None else h for (_, s, x), h in zip(work, hs)]
        for (f, s, x), _h in zip(work, hs):
            s.rewind.ran(f.position, s.draft is not None)  # a verification chunk may be rolled back
            s.position += x.shape[1]
        states = [c.state for _, s, _ in work for c in s.cache]
        if not model.last:
            for _, s, _ in work:
                s.draft = None
            # framed before the evaluation, each payload its array (tensors.framed_ahead); NAMED ones after
            framed = [None if isinstance(h, Carry) else framed_ahead(f.request_id, f.position, h, f.flags & _PASSED)
                     for (f, _, _), h in zip(work, hs)]
            mx.eval(hs, [a.payload for a in framed if a is not None], states)
            self._mark("evaluated")
            return [a or _named(f, h) for (f, _, _), h, a in zip(work, hs, framed)]
        results = []
        # Each request's own processors, grammar mask and PRNG key (engine/stage/sampling.py), row by row.
        # A grammar that fails (llguidance's limits) ends its own request, not its batch-mates.
        sampled = []
        for (f, s, _), h in zip(work, hs):
            if f.flags & Flag.SAMPLE and s.draft is not None:
                results += self._verify(f, s, h)
            elif f.flags & Flag.SAMPLE:
                try:
                    sampled.append((f, s, s.sampler.logprobs(h)))
                except ValueError as exc:
                    self._end_request(f.request_id, exc)
        picks = [s.sampler.pick(lp) for _, s, lp in sampled]  # each token with its log-prob: one evaluation
        mx.eval(picks, [lp for _, _, lp in sampled], states)  # a prefill chunk's head is never computed
        self._mark("evaluated")
        for (f, s, lp), (token, logprob) in zip(sampled, picks):
            chosen = int(token.item())
            try:
                s.sampler.accept(chosen)
            except ValueError as exc:
                self._end_request(f.request_id, exc)
                continue
            results.append(Frame(Kind.RESULT, f.request_id, s.position,
                                 payload=s.sampler.encode(chosen, logprob.item(), lp)))
        if results:
            self._send_coordinator(results)
            self._mark("sent")
        return []

    def _batch_chunks(self, work: list[tuple[Frame, RequestState, Any]], hs: list[Any]) -> None:
        """Prefill chunks flagged BATCH (PIPESERVE_PREFILL_BATCH=batched) run as one forward per length,
        filling `hs`; the rest stay None (one by one). Only plain chunks: no sampling, no draft, no
        replay in front (rewind.py)."""
        by_length: dict[int, list[int]] = {}
        for i, (f, s, x) in enumerate(work):
            if (hs[i] is None and f.flags & Flag.BATCH and not f.flags & Flag.SAMPLE and s.draft is None
                    and s.rewind.drop == 0 and not s.rewind.stepwise):
                by_length.setdefault(int(x.shape[1]), []).append(i)
        model = self.model
        for rows in by_length.values():
            if len(rows) < 2 or not model.chunks_batchable:
                continue
            for i, h in zip(rows, model.forward_chunks([work[i][2] for i in rows], [work[i][1].cache for i in rows])):
                hs[i] = h
            if model.chunks_batchable:
                self._batched_chunks += len(rows)
            elif not self._chunks_refusal_logged:
                self._chunks_refusal_logged = True
                self.log.warning("batch.unavailable", reason=model.chunks_refusal,
                                 detail="prefill chunks now run one request at a time")

    def _verify(self, f: Frame, s: RequestState, logits: mx.array) -> list[Frame]:
        """The RESULTs of a verification chunk: the accepted drafts plus one, all but the last flagged RUN."""
        draft, s.draft = s.draft or [], None
        try:
            return verified(f.request_id, f.position, s.sampler, logits, draft)
        except ValueError as exc:
            self._end_request(f.request_id, exc)
            return []

    def _mark(self, event: str) -> None:
        """Note a step's event when PIPESERVE_STEP_TRACE is set (engine/steptrace.py)."""
        if self.trace is not None:
            self.trace.mark(event)

    def _end_request(self, request_id: int, exc: Exception | str) -> None:
        self._error(request_id, f"stage {self.index}: {exc}")
        self.requests.pop(request_id, None)

    def _record_step(self, seconds: float, batch: int) -> None:
        ms = seconds * 1000
        ema = ms if self.stats.steps == 0 else 0.9 * self.stats.step_ms + 0.1 * ms
        self._recent_ms.append(ms)
        self.stats = replace(self.stats, requests=len(self.requests), steps=self.stats.steps + 1, step_ms=ema,
                             batch=batch, max_batch=max(batch, self.stats.max_batch), slowest_ms=max(self._recent_ms),
                             batched_chunks=self._batched_chunks)

    def _publish(self) -> None:
        s = self.stats
        self.stats = replace(s, requests=len(self.requests), rss_bytes=rss_bytes(),
                             extra={**s.extra, "prompt_cache": self.prompt_cache.stats()})

    # --- outbound ----------------------------------------------------------------------
    def _send_down(self, frames: list[Frame]) -> None:
        for request_id in self.links.send_down(frames):
            self._error(request_id, f"stage {self.index}: next stage {self.next_node.id} unreachable")
            self.requests.pop(request_id, None)

    def _send_coordinator(self, frames: list[Frame]) -> None:
        self.links.to_coordinator(frames)

    def _error(self, request_id: int, message: str) -> None:
        self.links.error(request_id, message)


__all__ = ["Stage"]


_PASSED = Flag.SAMPLE | Flag.SOLO | Flag.BATCH  # the flags of an input frame its output frame downstream keeps


def _named(f: Frame, h: Carry) -> Frame:
    """The NAMED frame carrying a step's hidden state and extra tensors to the next stage."""
    return to_frame(f.request_id, f.position, h.h, f.flags & _PASSED, h.extras)
