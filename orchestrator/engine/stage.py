"""A pipeline stage: owns a layer range, receives frames over TCP, computes, passes on.

Threads: one accept thread, one reader per connection (which also answers PINGs, so a
stage busy with a long prefill still proves it is alive), and the MLX thread — the
caller of `Stage.run()` — which alone owns the model, the KV caches and the outbound
connections. Readers feed it through one inbox queue.
"""

from __future__ import annotations

import errno
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..logs import EventLogger
from . import transport
from .config import ClusterConfig, NodeSpec
from .faults import Faults
from .routes import format_address, next_address
from .sampling import Sampler
from .shard import StageModel
from .stage_stats import Progress, StageStats, progress_json, rss_bytes
from .tensors import from_frame, to_frame
from .wire import Flag, Frame, FrameError, HandshakeError, Kind, json_frame

DOWNSTREAM_CONNECT_TIMEOUT = 5.0
MAX_PENDING_HANDSHAKES = 32  # unauthenticated connections at once; legitimate peers need a handful
ACCEPT_BACKOFF = (0.05, 1.0)  # pause after a failed accept(), doubling up to the second value


@dataclass
class RequestState:
    """One request's state on this stage."""

    cache: list[Any]
    sampler: Sampler | None = None
    position: int = 0


class Stage:
    """The stage process's state and loops."""

    def __init__(self, config: ClusterConfig, node: NodeSpec, model: StageModel, secret: bytes,
                 listener: socket.socket, log: EventLogger, blas: str = "reference",
                 threads: tuple[int, int] = (0, 0)) -> None:
        self.config = config
        self.node = node
        self.model = model
        self.secret = secret
        self.listener = listener
        self.log = log
        self.index = node.stage or 0
        stages = config.stages
        self.next_node = stages[self.index + 1] if self.index + 1 < len(stages) else None
        self.upstream_role = "coordinator" if self.index == 0 else f"stage-{self.index - 1}"
        self.max_frame = config.cluster.max_frame_bytes
        self.inbox: queue.Queue = queue.Queue()
        # MLX-thread state
        self.requests: dict[int, RequestState] = {}
        self.coordinator: transport.Connection | None = None
        self.downstream: transport.Connection | None = None
        self.stats = StageStats(self.index, model.layer_range, rss_bytes=rss_bytes(),
                                weight_bytes=model.weight_bytes, extra={"blas": blas, "node": node.id})
        self._stop = threading.Event()
        self._pending = threading.BoundedSemaphore(MAX_PENDING_HANDSHAKES)
        # (base, solo) BLAS threads: solo for steps marked SOLO, base otherwise; (0, 0) = never switch.
        self.base_threads, self.solo_threads = threads
        self.faults = Faults.for_node(node.id)
        self._batch_refusal_logged = False
        self.current_threads = self.base_threads
        self.progress: Progress | None = None  # written by the MLX thread, read by readers' PONGs

    # --- network threads ---------------------------------------------------------------
    def serve(self) -> None:
        """Accept connections in a background thread."""
        threading.Thread(target=self._accept_loop, name="accept", daemon=True).start()

    def _accept_loop(self) -> None:
        """Accept until the stage stops; no error ends it (EMFILE today may be gone in a second)."""
        pause = ACCEPT_BACKOFF[0]
        while not self._stop.is_set():
            try:
                sock, addr = self.listener.accept()
            except OSError as exc:
                if self._stop.is_set():
                    return
                transient = exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM,
                                          errno.ECONNABORTED, errno.EPROTO)
                (self.log.warning if transient else self.log.error)("transport.accept_failed", reason=exc,
                                                                     retry_in_s=pause)
                self._stop.wait(pause)
                pause = min(pause * 2, ACCEPT_BACKOFF[1])
                continue
            pause = ACCEPT_BACKOFF[0]
            peer = f"{addr[0]}:{addr[1]}"
            if not self._pending.acquire(blocking=False):
                # Too many handshakes in progress: whoever holds them cannot starve the stage of
                # threads and descriptors; a real peer retries (its connect backs off).
                self.log.warning("transport.refused", peer=peer,
                                 reason=f"{MAX_PENDING_HANDSHAKES} handshakes already in progress")
                sock.close()
                continue
            try:
                threading.Thread(target=self._reader, args=(sock, peer), name=f"conn-{peer}", daemon=True).start()
            except RuntimeError as exc:  # no thread could be started: refuse this one, keep accepting
                self._pending.release()
                sock.close()
                self.log.warning("transport.refused", peer=peer, reason=exc)

    def _reader(self, sock: socket.socket, peer: str) -> None:
        adopted: list[transport.Connection] = []

        def adopt(conn: transport.Connection) -> None:
            # Queued before the peer hears it is accepted: a RESULT for a request it starts
            # right after its handshake can then never find the stage without a coordinator.
            if conn.role == "coordinator":
                adopted.append(conn)
                self.inbox.put(("coordinator", conn))

        try:
            try:
                conn = transport.accept(sock, peer, self.secret, self.max_frame, on_verified=adopt)
            finally:
                self._pending.release()
        except (HandshakeError, OSError) as exc:
            self.log.warning("transport.refused", peer=peer, reason=exc)
            for c in adopted:  # verified, but the acceptance could not be sent
                self.inbox.put(("closed", c))
            return
        self.log.info("transport.accepted", peer=peer, role=conn.role)
        try:
            while True:
                group = conn.recv_group()
                if group[0].kind is Kind.PING:
                    stats = self.stats
                    conn.send(json_frame(Kind.PONG, {**stats.as_json(), "progress": progress_json(
                        stats, self.progress, self.inbox.qsize(), time.monotonic())}))
                    continue
                if conn.role != self.upstream_role:
                    # Requests enter a stage only from its upstream neighbour; anyone else who
                    # knows the secret may probe liveness but not drive or reset requests.
                    self.log.warning("frame.unexpected_sender", peer=peer, role=conn.role,
                                     expected=self.upstream_role, kind=group[0].kind.name)
                    continue
                self.inbox.put(("group", conn, group))
        except FrameError as exc:
            self.log.warning("transport.malformed_frame", peer=peer, role=conn.role, reason=exc)
        except (ConnectionError, OSError) as exc:
            self.log.info("transport.closed", peer=peer, role=conn.role, reason=exc)
        finally:
            conn.close()
            self.inbox.put(("closed", conn))

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
                if item[1] is self.coordinator:
                    self.coordinator = None
                    self._drop_all("coordinator disconnected")
            elif what == "group":
                self._handle_group(item[2])

    def stop(self) -> None:
        """Ask the loops to end and close the listener."""
        self._stop.set()
        try:
            self.listener.close()
        except OSError:
            pass

    def _adopt_coordinator(self, conn: transport.Connection) -> None:
        if self.coordinator is not None and self.coordinator is not conn:
            self.coordinator.close()
        self.coordinator = conn
        self._drop_all("new coordinator session")

    def _drop_all(self, reason: str) -> None:
        if self.requests:
            self.log.info("requests.dropped", count=len(self.requests), reason=reason)
        self.requests.clear()
        self._publish()

    def _handle_group(self, group: list[Frame]) -> None:
        out: list[Frame] = []
        run: list[Frame] = []
        for frame in group:
            if frame.kind is Kind.FORWARD:
                run.append(frame)
                continue
            if run:
                out += self._forward(run)
                run = []
            out += self._control(frame)
        if run:
            out += self._forward(run)
        if out:
            self._send_down(out)

    def _control(self, frame: Frame) -> list[Frame]:
        """OPEN / CLOSE / RESET: update state; returns what to pass downstream."""
        if frame.kind is Kind.RESET:
            self._drop_all("reset by coordinator")
            return [frame] if self.next_node else []
        if frame.kind is Kind.ROUTE:
            self._reroute(frame)
            return [frame] if self.next_node else []  # on to the (possibly new) next stage
        if frame.kind is Kind.OPEN:
            try:
                sampler = Sampler.from_params(frame.json()) if self.model.last else None
            except (ValueError, FrameError) as exc:  # from_params turns any junk JSON into ValueError
                self._error(frame.request_id, f"bad sampling parameters: {exc}")
                return []
            self.requests[frame.request_id] = RequestState(self.model.make_cache(), sampler)
        elif frame.kind is Kind.CLOSE:
            self.requests.pop(frame.request_id, None)
        else:
            self.log.warning("frame.unexpected", kind=frame.kind.name)
            return []
        self._publish()
        return [frame] if self.next_node else []

    def _reroute(self, frame: Frame) -> None:
        """Take the next stage's address from a ROUTE frame: it moved to another node (engine/routes.py)."""
        try:
            address = next_address(frame, self.index)
        except FrameError as exc:
            self.log.warning("route.malformed", reason=exc)
            return
        if self.next_node is None or address is None or address == self.next_node.host_port:
            return
        old = self.next_node.address
        self.next_node = self.next_node.model_copy(update={"address": format_address(address)})
        if self.downstream is not None:  # it leads to where the stage used to be
            self.downstream.close()
            self.downstream = None
        self.log.info("downstream.moved", peer=self.next_node.address, was=old)

    def _forward(self, frames: list[Frame]) -> list[Frame]:
        """Run the layers for FORWARD frames; returns hidden frames (or sends RESULTs if last)."""
        work: list[tuple[Frame, RequestState, mx.array]] = []
        for f in frames:
            state = self.requests.get(f.request_id)
            if state is None:
                self._error(f.request_id, f"stage {self.index}: unknown request")
            elif f.position != state.position:
                self._error(f.request_id, f"stage {self.index}: KV position {f.position} != expected {state.position}")
                self.requests.pop(f.request_id, None)
            else:
                try:
                    work.append((f, state, from_frame(f, first=self.model.first, hidden=self.model.info.hidden_size,
                                                         vocab=self.model.info.vocab_size, dtype=self.model.dtype)))
                except ValueError as exc:
                    self._error(f.request_id, f"stage {self.index}: {exc}")
        if not work:
            return []
        self._set_threads(all(f.flags & Flag.SOLO for f, _, _ in work))
        t0 = time.perf_counter()
        first, _, x0 = work[0]
        self.progress = Progress(time.monotonic(), first.request_id, first.position, int(x0.shape[1]), len(work))
        try:
            outputs = self._compute(work)
        except Exception as exc:  # a failed step fails its requests, not the stage
            self.log.error("step.failed", exc_info=True, requests=len(work))
            for f, _, _ in work:
                self._error(f.request_id, f"stage {self.index}: {exc}")
                self.requests.pop(f.request_id, None)
            return []
        finally:
            self.progress = None
        self._record_step(time.perf_counter() - t0, len(work))
        return outputs

    def _set_threads(self, solo: bool) -> None:
        """Use all the host's cores for SOLO steps (no other stage has work), the base count otherwise."""
        if not (self.solo_threads and self.base_threads):
            return
        want = self.solo_threads if solo else self.base_threads
        if want != self.current_threads:
            from . import blas

            blas.set_threads(want)  # MLX is idle between steps: no BLAS call is running now
            self.current_threads = want

    def _compute(self, work: list[tuple[Frame, RequestState, mx.array]]) -> list[Frame]:
        model = self.model
        self.faults.before_step()
        decode = all(x.shape[1] == 1 and s.position > 0 for _, s, x in work)
        if len(work) > 1 and decode and model.batchable:
            hs = model.forward_batch([x for _, _, x in work], [s.cache for _, s, _ in work])
            if model.batch_refusal and not self._batch_refusal_logged:
                self._batch_refusal_logged = True
                self.log.warning("batch.unavailable", reason=model.batch_refusal,
                                 detail="decode steps now run one request at a time (still exact)")
        else:
            hs = [model.forward(x, s.cache) for _, s, x in work]
        for (f, s, x), h in zip(work, hs):
            s.position += x.shape[1]
        states = [c.state for _, s, _ in work for c in s.cache]
        if not model.last:
            mx.eval(hs, states)
            return [to_frame(f.request_id, f.position, h, f.flags & (Flag.SAMPLE | Flag.SOLO)) for (f, _, _), h in zip(work, hs)]
        results = []
        sampled = [(f, s, model.logprobs(h)) for (f, s, _), h in zip(work, hs) if f.flags & Flag.SAMPLE]
        tokens = [s.sampler.sample(lp) for _, s, lp in sampled]
        mx.eval(tokens, [lp for _, _, lp in sampled], states)  # a prefill chunk's head is never computed
        for (f, s, lp), token in zip(sampled, tokens):
            results.append(Frame(Kind.RESULT, f.request_id, s.position, payload=s.sampler.encode(int(token.item()), lp)))
        if results:
            self._send_coordinator(results)
        return []

    def _record_step(self, seconds: float, batch: int) -> None:
        ms = seconds * 1000
        ema = ms if self.stats.steps == 0 else 0.9 * self.stats.step_ms + 0.1 * ms
        self.stats = StageStats(self.index, self.model.layer_range, len(self.requests), self.stats.steps + 1,
                                ema, batch, max(batch, self.stats.max_batch), rss_bytes(), self.stats.weight_bytes,
                                self.stats.extra)

    def _publish(self) -> None:
        s = self.stats
        self.stats = StageStats(s.stage, s.layers, len(self.requests), s.steps, s.step_ms, s.batch, s.max_batch,
                                rss_bytes(), s.weight_bytes, s.extra)

    # --- outbound ----------------------------------------------------------------------
    def _send_down(self, frames: list[Frame]) -> None:
        # Twice: a next stage that was replaced leaves a dead connection behind, noticed only
        # now; its successor listens on the same address, so one fresh connection delivers.
        for _ in range(2):
            conn = self._downstream()
            if conn is None:
                break
            try:
                conn.send_group(frames)
                return
            except OSError as exc:
                self.log.warning("downstream.lost", peer=conn.peer, reason=exc)
                conn.close()
                self.downstream = None
        for f in frames:
            if f.kind in (Kind.FORWARD, Kind.OPEN):
                self._error(f.request_id, f"stage {self.index}: next stage {self.next_node.id} unreachable")
                self.requests.pop(f.request_id, None)

    def _downstream(self) -> transport.Connection | None:
        if self.downstream is not None:
            return self.downstream
        assert self.next_node is not None
        deadline = time.monotonic() + DOWNSTREAM_CONNECT_TIMEOUT
        delay = 0.05
        while True:
            try:
                self.downstream = transport.connect(self.next_node.host_port, self.secret,
                                                    f"stage-{self.index}", self.max_frame)
                self.log.info("downstream.connected", peer=self.next_node.address)
                threading.Thread(target=_drain, args=(self.downstream,), daemon=True).start()
                return self.downstream
            except (OSError, HandshakeError) as exc:
                if time.monotonic() + delay > deadline:
                    self.log.warning("downstream.unreachable", peer=self.next_node.address, reason=exc)
                    return None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _send_coordinator(self, frames: list[Frame]) -> None:
        if self.coordinator is None:
            self.log.warning("coordinator.absent", dropped=len(frames))
            return
        try:
            self.coordinator.send_group(frames)
        except OSError as exc:
            self.log.warning("coordinator.lost", reason=exc)

    def _error(self, request_id: int, message: str) -> None:
        self.log.warning("request.failed", request=request_id, reason=message)
        self._send_coordinator([json_frame(Kind.ERROR, {"message": message}, request_id=request_id)])


def _drain(conn: transport.Connection) -> None:
    """Read (and discard) whatever the next stage sends, so a closed peer is noticed."""
    try:
        while True:
            conn.recv()
    except (ConnectionError, OSError, FrameError):
        conn.close()


__all__ = ["Stage"]
