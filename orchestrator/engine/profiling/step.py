"""Time what a decode step costs beyond the layer math: the stage's and coordinator's own path.

`engine/profiling/layers.py` times the layers alone; a served token also crosses, at every stage, a
reader thread (recv, frame decode), the inbox queue to the MLX thread, the frame-to-array
conversion of every row, the stage's bookkeeping, the array-to-frame conversion (or, on the
last stage, the sampler's RESULT encoding and its `.item()` syncs) and the send; and at the
coordinator, the RESULT frames, a token event per request handed to its streaming thread
(which builds the SSE chunk), and the next step's token frames. Each is small, but there is
one of each per stage per step and per row, and on a 2-core machine the 2-stage pipeline
measured ~2.5 ms of them per token (timestamps in all three processes, outside the layers'
own step) where the prediction had 0.3 ms. Much of it is waking up: a lone request's step
finds the stage's threads asleep (IDLE_S).

So this runs the real code: a real `Stage` (its `_handle_group`, `_forward`, `_compute`,
sends) around a stand-in model whose "layers" are one trivial op, fed over a socketpair by
a reader thread exactly as the stage's own readers feed it; and the coordinator's per-step
work from its own functions (`decode_result`, `tokens_frame`, `Connection.send_group`, the
events queue, `openai_schema.response`). The times are medians of many steps, measured on
the node itself, at 1 row (after idling) and at B rows (back to back): what the planner adds
to every step. Not in it: the tokenizer's detokenization and the HTTP server's own code.
"""

from __future__ import annotations

import json
import queue
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

STEPS = 30  # per measurement: each is well under a millisecond when idle
# A lone request's step comes after the stage sat idle while the others computed: its threads
# (and, in a VM, its vCPU) are asleep and wake for it, which costs more than the code does:
# on a 2-core VM the stage path measured 0.13-0.27 ms back to back, 0.57-0.66 ms after 30 ms
# idle (0.36 after 5 ms). Idle this long before each timed 1-row step; any gap of a few ms
# lets every thread sleep.
IDLE_S = 0.02
WAIT_S = 30.0  # for a hop that never comes: the path is broken, not slow


class PathError(RuntimeError):
    """The timed path did not do what serving does (an error frame, nothing sent)."""


def _expect(q: queue.Queue, kind: Any, rows: int) -> list[Any]:
    """The next group from `q`: `rows` frames of `kind`, or PathError saying what came instead."""
    try:
        group = q.get(timeout=WAIT_S)
    except queue.Empty:
        raise PathError(f"nothing arrived in {WAIT_S:.0f} s") from None
    if [f.kind for f in group] != [kind] * rows:
        detail = next((f.payload[:200] for f in group if f.kind is not kind), b"")
        raise PathError(f"expected {rows} {kind.name} frames, got {[f.kind.name for f in group]}: {detail!r}")
    return group


class _StandInModel:
    """A StageModel's interface with no layer math: one cheap op per row, so the stage's own
    path (frames, queues, conversions, sampling's encode, sends) is all that is timed."""

    def __init__(self, info: Any, dtype: Any, first: bool, last: bool) -> None:
        self.info, self.dtype, self.first, self.last = info, dtype, first, last
        self.batchable, self.batch_refusal = True, None
        self.layer_range, self.weight_bytes = (0, 1), 0
        self.model_dir = Path()  # no tokenizer: a profiled step is never constrained by a grammar
        self.extras_in: dict[str, tuple[int, ...]] = {}  # only the hidden state crosses its boundary
        self.hidden_shape = (info.hidden_size,)
        self.speculation_refusal = None  # a profiled step never verifies
        self._hidden = mx.zeros((1, 1, info.hidden_size), dtype)
        # The head's math is timed with the layers (head_ms); real-size logits here make the
        # sampler's log-softmax, argmax and `.item()` reads cost what they do when serving.
        self._logits = mx.random.normal((1, 1, info.vocab_size))
        mx.eval(self._hidden, self._logits)

    def expects(self, position: int) -> dict[str, tuple[int, ...]]:
        return self.extras_in

    def make_cache(self) -> list[Any]:
        return []

    def forward(self, x: mx.array, cache: list[Any]) -> mx.array:
        """The hidden state passed on, or on the last stage the logits the sampler reads."""
        if self.last:
            return self._logits + x[..., :1].astype(mx.float32) * 0
        return self._hidden + (x[..., :1].astype(self.dtype) * 0 if self.first else x * 0)

    def forward_batch(self, xs: list[mx.array], caches: list[list[Any]]) -> list[mx.array]:
        return [self.forward(x, c) for x, c in zip(xs, caches)]


def _pair(role: str) -> tuple[Any, Any]:
    """Two connected transport.Connections (no handshake: both ends are ours); the first notes
    when its last send returned (`sent_at`): where the timed process's path ends."""
    from orchestrator.engine.transport import Connection

    class Timed(Connection):
        sent_at = 0.0

        def send(self, *frames: Any) -> None:
            super().send(*frames)
            self.sent_at = time.perf_counter()

    a, b = socket.socketpair()
    return Timed(a, "profile", role, 1 << 30), Connection(b, "profile", role, 1 << 30)


def _drain(conn: Any, got: queue.Queue | None = None) -> None:
    """Read groups until the connection closes (what the next hop's reader does)."""
    try:
        while True:
            group = conn.recv_group()
            if got is not None:
                got.put(group)
    except (ConnectionError, OSError, ValueError):
        pass


def _stage(info: Any, dtype: Any, last: bool) -> Any:
    """A real Stage (stage 1 of 2, or of 3 when it passes hidden states on) around the stand-in."""
    from orchestrator.engine.config import ClusterConfig
    from orchestrator.engine.stage.stage import Stage
    from orchestrator.logs import EventLogger

    n = max(3, info.num_layers)
    depth = 2 if last else 3
    nodes = [{"id": "c", "address": "127.0.0.1:1", "role": "hybrid"}] + [
        {"id": f"s{k}", "address": f"127.0.0.1:{k + 2}", "role": "pipeline_stage", "stage": k,
         "layers": f"{k * n // depth}-{(k + 1) * n // depth - 1}"} for k in range(depth)]
    config = ClusterConfig.model_validate({"cluster": {"name": "profile", "pipeline_parallel_size": depth},
                                           "nodes": nodes})
    model = _StandInModel(info, dtype, first=False, last=last)
    return Stage(config, config.stages[1], model, b"profile", socket.socket(), EventLogger("profile"))


def time_stage_path(info: Any, dtype: Any, rows: int, last: bool, steps: int = STEPS, idle_s: float = 0.0) -> float:
    """Median ms of one decode step of `rows` requests through a stage, layers excepted: from
    its input frames on the socket to its output frames sent on (its send returned: reading them
    is the next process's path, which starts at its socket); `idle_s` asleep before each."""
    from orchestrator.engine.tensors import to_frame
    from orchestrator.engine.wire import Flag, Frame, Kind, encode

    stage = _stage(info, dtype, last)
    up, stage_in = _pair("coordinator" if last else "stage-0")
    stage_out, down = _pair("stage")
    inbox: queue.SimpleQueue = queue.SimpleQueue()  # the stage's own inbox is one (its gate's readers feed it)
    if last:
        stage.links.coordinator = stage_out
    else:
        stage.links.downstream = stage_out
    got: queue.Queue = queue.Queue()
    threads = [threading.Thread(target=_drain, args=(stage_in, inbox), daemon=True),
               threading.Thread(target=_drain, args=(down, got), daemon=True)]
    for t in threads:
        t.start()
    try:
        ids = list(range(1, rows + 1))
        opens = [Frame(Kind.OPEN, r, payload=json.dumps({"temperature": 0}).encode()) for r in ids]
        stage._handle_group(opens)
        if not last:
            _expect(got, Kind.OPEN, rows)  # the OPEN frames went on downstream
        h = mx.random.normal((1, 1, stage.model.info.hidden_size)).astype(stage.model.dtype)
        mx.eval(h)
        times = []
        for step in range(steps + 3):  # three to warm up
            group = [to_frame(r, step, h, Flag.SAMPLE) for r in ids]
            data = b"".join(encode(f) for f in _more(group))
            time.sleep(idle_s)
            t0 = time.perf_counter()
            up.sock.sendall(data)
            stage._handle_group(inbox.get(timeout=WAIT_S))
            _expect(got, Kind.RESULT if last else Kind.FORWARD, rows)  # the next hop has the whole group
            if step >= 3:
                times.append((stage_out.sent_at - t0) * 1000)
        return statistics.median(times)
    finally:
        for c in (up, stage_in, stage_out, down):
            c.close()
        stage.gate.stop()


def _more(frames: list[Any]) -> list[Any]:
    """A micro-batch as `Connection.send_group` marks it: MORE on all but the last frame."""
    return [f.with_more(i < len(frames) - 1) for i, f in enumerate(frames)]


def time_coordinator_path(rows: int, steps: int = STEPS, idle_s: float = 0.0, streams: bool = False) -> float:
    """Median ms of the coordinator's path per decode step of `rows` requests: RESULT frames in,
    a token event per request to its streaming thread, the next step's frames sent to stage 0 —
    the part of a token's interval the coordinator adds. With `streams`, until every streaming
    thread has also built and written its SSE chunk (work that overlaps the stages' next step);
    `idle_s` asleep before each."""
    from orchestrator.engine.coordinator import openai_schema as oa
    from orchestrator.engine.coordinator.generation import TokenEvent
    from orchestrator.engine.stage.sampling import RESULT, decode_result
    from orchestrator.engine.tensors import tokens_frame
    from orchestrator.engine.wire import Flag, Frame, Kind, encode

    last, mine = _pair("coordinator")
    to_stage, stage0 = _pair("coordinator")
    inbox: queue.SimpleQueue = queue.SimpleQueue()  # as the scheduler's and each request's are
    events = [queue.SimpleQueue() for _ in range(rows)]
    sinks = [socket.socketpair() for _ in range(rows)]  # each request's HTTP connection
    written = threading.Semaphore(0)

    def streamer(events: queue.SimpleQueue, sink: socket.socket) -> None:
        rid = oa.completion_id("completion")
        while (event := events.get()) is not None:
            body = oa.response("completion", rid, "m", f"t{event.token}", None, None, None, stream=True)
            sink.sendall(b"data: " + json.dumps(body).encode() + b"\n\n")
            written.release()

    def reader() -> None:
        try:
            while True:
                inbox.put(("frames", mine.recv_group()))
        except (ConnectionError, OSError, ValueError):
            pass

    threads = [threading.Thread(target=reader, daemon=True),
               threading.Thread(target=_drain, args=(stage0,), daemon=True)]
    threads += [threading.Thread(target=streamer, args=(q, s[0]), daemon=True) for q, s in zip(events, sinks)]
    threads += [threading.Thread(target=_drain_raw, args=(s[1],), daemon=True) for s in sinks]
    for t in threads:
        t.start()
    try:
        times = []
        for step in range(steps + 3):
            results = [Frame(Kind.RESULT, r, step, payload=RESULT.pack(100 + r, -0.5)) for r in range(rows)]
            data = b"".join(encode(f) for f in _more(results))
            time.sleep(idle_s)
            t0 = time.perf_counter()
            last.sock.sendall(data)
            _, frames = inbox.get(timeout=WAIT_S)
            out = []
            for f in frames:
                token, logprob, top = decode_result(f.payload)
                events[f.request_id].put(TokenEvent(token, logprob, tuple(top)))
                out.append(tokens_frame(f.request_id, f.position, [token], Flag.SAMPLE))
            to_stage.send_group(out)
            for _ in range(rows):  # every request's chunk is on its way to its client
                if not written.acquire(timeout=WAIT_S):
                    raise PathError("a streaming thread wrote nothing")
            if step >= 3:
                times.append(((time.perf_counter() if streams else to_stage.sent_at) - t0) * 1000)
        return statistics.median(times)
    finally:
        for q in events:
            q.put(None)
        for c in (last, mine, to_stage, stage0):
            c.close()
        for a, b in sinks:
            a.close()
            b.close()


def _drain_raw(sock: socket.socket) -> None:
    try:
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass


def step_overheads(info: Any, dtype: Any, batch: int) -> dict[str, float]:
    """The LayerTiming fields: per-step path ms at 1 and `batch` rows, for a stage that passes
    hidden states on, for the last stage (results), and for the coordinator. `info` and
    `dtype` are the model's (shard.ModelInfo, the activations' mx dtype): frame sizes."""
    out = {}
    # One request's step finds every thread asleep (the other stages were computing); a batch
    # of B comes to a busy stage, straight after its previous group.
    for key, rows, idle in (("b1", 1, IDLE_S), ("bB", batch, 0.0)):
        out[f"step_ms_{key}"] = time_stage_path(info, dtype, rows, last=False, idle_s=idle)
        out[f"last_step_ms_{key}"] = time_stage_path(info, dtype, rows, last=True, idle_s=idle)
        out[f"coordinator_ms_{key}"] = time_coordinator_path(rows, idle_s=idle)
    return out


def table(info: Any, dtype: Any, batch: int, rounds: int) -> list[str]:
    """A markdown table of every path, `rounds` times: 1 row after IDLE_S asleep (a lone request's
    step) and `batch` rows back to back; the coordinator also through its streaming threads."""
    rows = ["| round | stage passing hidden on, 1 row / B rows | last stage (sampling), 1 / B | "
            "coordinator, 1 / B | coordinator with SSE written, 1 / B |", "|---|---|---|---|---|"]
    for r in range(rounds):
        cells = []
        for measure in (lambda n, idle: time_stage_path(info, dtype, n, last=False, idle_s=idle),
                        lambda n, idle: time_stage_path(info, dtype, n, last=True, idle_s=idle),
                        lambda n, idle: time_coordinator_path(n, idle_s=idle),
                        lambda n, idle: time_coordinator_path(n, idle_s=idle, streams=True)):
            cells.append(f"{measure(1, IDLE_S):.3f} / {measure(batch, 0.0):.3f}")
        rows.append(f"| {r + 1} | " + " | ".join(cells) + " |")
    return rows

