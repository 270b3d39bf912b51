"""The stage transport against hostile input, on LIVE stage processes (docs/security.md, "Stages").

Every connection must prove the cluster secret; a malformed frame closes that connection
and is logged; whatever arrives, the stage keeps serving its cluster. After each test both
stages are alive and a generation through the pipeline still equals mlx-lm's.

The fuzzers hold a local model of the stage's reader (`expect`, built on the same
`decode_header` and the micro-batch rule) and check, example by example, that the live
stage does exactly what it predicts: answers the PINGs it should, keeps a connection open
after well-formed frames, and closes it right after a malformed one (without waiting for a
claimed payload). They connect with role "fuzzer": the stage adopts only a "coordinator"
connection as its coordinator, but it does process control and FORWARD frames from any
authenticated peer, so the fuzzers also reach the MLX thread (OPEN, FORWARD with bad
shapes, dtypes, widths, token ids, request ids and KV positions, RESET, junk JSON).
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.engine import transport, wire
from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.engine.stage.sampling import decode_result
from orchestrator.engine.wire import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_GROUP,
    MAX_JSON_BYTES,
    VERSION,
    DType,
    Flag,
    Frame,
    FrameError,
    Kind,
)
from orchestrator.proc import WaitTimeout, wait_until
from tests.support.engine_harness import InTestCoordinator, assert_same, reference

SPLITS = [(0, 1), (2, 3)]
LIMIT = 64 * 1024  # max_frame_bytes of the cluster under test: small, so both sides of it are cheap to reach
PROMPT = [5, 17, 101, 33, 7, 250]
TOKENS = 12
IO_TIMEOUT = 15.0
HIDDEN, VOCAB = 64, 512  # the default test model
PING = wire.encode(Frame(Kind.PING))

FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


# --- the cluster -------------------------------------------------------------------------

class Live:
    """One local pipeline (no coordinator process) shared by this module's tests.

    A test that kills a stage gets it reported; the next test starts a fresh cluster
    instead of failing for the same reason.
    """

    def __init__(self, model: Path, root: Path) -> None:
        self.model, self.root = model, root
        self.expected = reference(model, PROMPT, TOKENS)
        self.cluster: LocalPipeline | None = None
        self.launches = 0

    def get(self) -> LocalPipeline:
        if self.cluster is None or any(not p.alive() for p in self.cluster.procs.values()):
            if self.cluster is not None:
                self.cluster.stop()
            self.launches += 1
            self.cluster = LocalPipeline(self.root / f"cluster{self.launches}", self.model, SPLITS, coordinator=False,
                                         threads=1, cluster={"max_frame_bytes": LIMIT}).start()
        return self.cluster


@pytest.fixture(scope="module")
def live_pipeline(model_factory, tmp_path_factory):
    live = Live(model_factory(), tmp_path_factory.mktemp("transport-safety"))
    yield live
    if live.cluster is not None:
        live.cluster.stop()


@pytest.fixture
def cluster(live_pipeline) -> LocalPipeline:
    """The running cluster; `launch`-style, but shared by the module (each test starts by checking it is alive)."""
    return live_pipeline.get()


def log_text(cluster: LocalPipeline, name: str) -> str:
    path = cluster.workdir / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def log_mark(cluster: LocalPipeline, name: str) -> int:
    """How many lines the stage's log has now: pass as `since` to look only at what follows."""
    return len(log_text(cluster, name).splitlines())


def wait_for_log(cluster: LocalPipeline, name: str, *needles: str, since: int = 0, timeout: float = 10.0) -> str:
    """Poll the stage's log until a line (after line `since`) contains every needle; returns it."""
    def matching() -> str | None:
        return next((line for line in log_text(cluster, name).splitlines()[since:]
                     if all(n in line for n in needles)), None)

    try:
        return wait_until(matching, timeout, 0.02, f"a log line with {needles} in {name}")
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}:\n{cluster.output(name)}") from None


def assert_alive(cluster: LocalPipeline) -> None:
    for name, proc in cluster.procs.items():
        assert proc.alive(), f"{name} {proc.describe_exit()}:\n{cluster.output(name, tail=60)}"


def assert_serves(live: Live, cluster: LocalPipeline) -> None:
    """Both stages alive, and a real generation through them equals the mlx-lm reference."""
    assert_alive(cluster)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready(timeout=20)
        assert_same(live.expected, coord.run(PROMPT, TOKENS))
    finally:
        coord.stop()
    assert_alive(cluster)


def stage_port(cluster: LocalPipeline, index: int) -> int:
    return cluster.ports[index + 1]


def raw_connect(cluster: LocalPipeline, index: int = 0) -> socket.socket:
    """A plain TCP connection to a stage: no handshake yet."""
    return socket.create_connection(("127.0.0.1", stage_port(cluster, index)), timeout=IO_TIMEOUT)


def wait_closed(sock: socket.socket, timeout: float = IO_TIMEOUT) -> bytes:
    """Read until the peer closes; returns what it sent. Fails if it is still open after `timeout`."""
    sock.settimeout(timeout)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
    except ConnectionResetError:
        return got
    except TimeoutError:
        pytest.fail(f"the stage kept the connection open for {timeout} s (received {got[:80]!r})")


# --- handshake -------------------------------------------------------------------------

def test_wrong_secret_is_refused_and_logged(live_pipeline, cluster):
    mark = log_mark(cluster, "stage-0")
    with pytest.raises(ConnectionError):  # HandshakeError, or the stage closing (reset) the socket
        transport.connect(("127.0.0.1", stage_port(cluster, 0)), b"not-the-secret", "coordinator", LIMIT)
    line = wait_for_log(cluster, "stage-0", "transport.refused", "wrong cluster secret", since=mark)
    assert "WARN" in line
    # the right secret still gets in, and proves the stage knows it too
    conn = transport.connect(("127.0.0.1", stage_port(cluster, 0)), cluster.secret.encode(), "fuzzer", LIMIT)
    conn.send(Frame(Kind.PING))
    conn.sock.settimeout(IO_TIMEOUT)
    pong = conn.recv()
    assert pong.kind is Kind.PONG and pong.json()["stage"] == 0
    conn.close()
    assert_serves(live_pipeline, cluster)


def test_an_impostor_stage_is_detected_by_the_client():
    """The client side: a listener that answers the hello but cannot prove the secret is refused."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def impostor() -> None:
        sock, _ = server.accept()
        with sock:
            nonce = wire.new_nonce()
            sock.sendall(wire.server_hello(nonce))
            head = transport.recv_exact(sock, 7)
            rest = transport.recv_exact(sock, wire.rest_length(head))
            client_nonce = rest[-64:-32]
            sock.sendall(wire.server_proof(b"guessed", nonce, client_nonce))
            sock.recv(1)

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    with pytest.raises(wire.HandshakeError, match="stage failed to prove the cluster secret"):
        transport.connect(("127.0.0.1", port), b"the-real-secret", "coordinator", LIMIT)
    t.join(IO_TIMEOUT)
    server.close()


GARBAGE = [
    pytest.param(b"GET / HTTP/1.1\r\nHost: stage\r\n\r\n", "did not start with PSHC", id="http"),
    pytest.param(bytes.fromhex("160301020001000200") + b"\0" * 60, "did not start with PSHC", id="tls-client-hello"),
    pytest.param(PING, "did not start with PSHC", id="frame-before-handshake"),
    pytest.param(b"PSHC\x03\x05\x0bcoordinator" + b"\0" * 64, "handshake version 3, this build 2", id="future-version"),
    pytest.param(b"PSHC\x02\x03\x0bcoordinator" + b"\0" * 64, "wire version 3, this build 5", id="older-frames"),
    pytest.param(b"PSHC\x02\x05\x00" + b"\0" * 64, "malformed handshake", id="empty-role"),
    pytest.param(b"PSHC\x02\x05\x0bcoordinator" + b"\0" * 64, "wrong cluster secret", id="zero-mac"),
    pytest.param(b"PSHC\x02\x05\xff" + b"x" * 40, "peer closed the connection", id="truncated-then-close"),
    pytest.param(b"\0" * 3, "peer closed the connection", id="three-bytes-then-close"),
]


@pytest.mark.parametrize("read_hello", [True, False], ids=["after-hello", "without-reading-hello"])
def test_garbage_instead_of_a_handshake_is_refused(live_pipeline, cluster, read_hello):
    for param in GARBAGE:
        data, reason = param.values
        mark = log_mark(cluster, "stage-0")
        sock = raw_connect(cluster)
        with sock:
            if read_hello:
                assert wire.parse_server_hello(transport.recv_exact(sock, 6 + wire.NONCE))
            sock.sendall(data)
            if reason == "peer closed the connection":
                sock.shutdown(socket.SHUT_WR)  # half-close: the stage sees end of stream mid-handshake
            got = wait_closed(sock)
            assert b"PSOK" not in got, f"{param.id}: the stage accepted garbage"
        wait_for_log(cluster, "stage-0", "transport.refused", reason, since=mark)
    assert_serves(live_pipeline, cluster)


def test_silent_clients_do_not_block_the_stage_and_time_out(live_pipeline, cluster):
    """Clients that connect and send nothing (or half a handshake) hold no one up, and are
    dropped after transport.HANDSHAKE_TIMEOUT."""
    marks = [log_mark(cluster, "stage-0"), log_mark(cluster, "stage-1")]
    t0 = time.monotonic()
    silent = [raw_connect(cluster, 0), raw_connect(cluster, 1), raw_connect(cluster, 0)]
    half = raw_connect(cluster, 0)
    half.sendall(b"PSHC\x02\x05")  # 6 of the 7 head bytes, then nothing
    try:
        assert_serves(live_pipeline, cluster)  # while they are all connected
        for sock in silent + [half]:
            wait_closed(sock, timeout=transport.HANDSHAKE_TIMEOUT + 10)
        elapsed = time.monotonic() - t0
        assert elapsed >= transport.HANDSHAKE_TIMEOUT - 0.5, f"closed after {elapsed:.1f} s"
        wait_for_log(cluster, "stage-0", "transport.refused", "timed out", since=marks[0])
        wait_for_log(cluster, "stage-1", "transport.refused", "timed out", since=marks[1])
    finally:
        for sock in silent + [half]:
            sock.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Without blocking: has the stage closed this connection? (Reads and drops what it sent.)"""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True
    finally:
        sock.setblocking(True)


def test_a_trickled_handshake_is_dropped_at_its_deadline(live_pipeline, cluster):
    """One byte every second used to reset the 5 s per-read timeout forever; the whole
    handshake now has HANDSHAKE_TIMEOUT, however the bytes trickle."""
    sock = raw_connect(cluster)
    trickle = b"PSHC\x02\x05\xff" + b"r" * 300  # a valid head announcing a long role: the stage waits for it
    t0 = time.monotonic()
    closed_after = None
    with sock:
        wire.parse_server_hello(transport.recv_exact(sock, 6 + wire.NONCE))
        for sent, byte in enumerate(trickle, 1):
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed_after = sent
                break
            time.sleep(1.0)
            if _closed_by_peer(sock):
                closed_after = sent
                break
            if time.monotonic() - t0 > transport.HANDSHAKE_TIMEOUT + 20:
                break  # the trickle is longer than that: give up on a stage that never closes it
    print(f"trickled handshake closed after {closed_after} bytes, {time.monotonic() - t0:.0f} s "
          f"(deadline {transport.HANDSHAKE_TIMEOUT} s)")
    # closed mid-trickle, one byte a second keeping every read alive: the whole handshake's deadline
    assert closed_after is not None, f"still open after {time.monotonic() - t0:.0f} s of one byte per second"
    assert_serves(live_pipeline, cluster)


def test_unauthenticated_connections_past_the_cap_are_closed_at_once(live_pipeline, cluster):
    """MAX_PENDING_HANDSHAKES silent clients are all a stage keeps; more are closed at once,
    before any handshake starts (they never get the server hello), and a real coordinator
    gets in once the others have timed out."""
    from orchestrator.engine.stage.gate import MAX_PENDING_HANDSHAKES

    mark = log_mark(cluster, "stage-0")
    extra = 8
    t0 = time.monotonic()
    socks = [raw_connect(cluster) for _ in range(MAX_PENDING_HANDSHAKES + extra)]
    try:
        received = [wait_closed(s, timeout=transport.HANDSHAKE_TIMEOUT + 20) for s in socks]
    finally:
        for s in socks:
            s.close()
    refused = sum(1 for got in received if not got)
    print(f"{refused} of {len(socks)} silent connections closed before the hello; "
          f"all closed within {time.monotonic() - t0:.1f} s")
    assert refused >= extra, f"only {refused} refused at once"
    assert all(len(got) == 6 + wire.NONCE for got in received if got)  # the others got the hello only
    wait_for_log(cluster, "stage-0", "transport.refused", "handshakes already in progress", since=mark)
    assert_serves(live_pipeline, cluster)


def test_the_stage_keeps_accepting_after_running_out_of_descriptors(live_pipeline, cluster):
    """EMFILE used to end the accept loop for good (the stage then never accepted again).
    The stage's descriptor limit is lowered from outside (prlimit) until accept() fails."""
    import os
    import resource

    pid = cluster.procs["stage-0"].pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    used = len(os.listdir(f"/proc/{pid}/fd"))
    mark = log_mark(cluster, "stage-0")
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (used + 2, hard))
    socks: list[socket.socket] = []
    try:
        socks = [raw_connect(cluster) for _ in range(10)]
        line = wait_for_log(cluster, "stage-0", "transport.accept_failed", "Too many open files", since=mark)
        print(f"stage at {used + 2} descriptors: {line}")
    finally:
        for s in socks:
            s.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert_serves(live_pipeline, cluster)  # a coordinator still connects and gets identical output


# --- frames after a good handshake --------------------------------------------------------

def expect(stream: bytes, limit: int = LIMIT) -> tuple[str, int]:
    """What the stage's reader does with `stream` on a fresh connection.

    Returns (outcome, pongs): outcome "open" (every frame read, connection kept),
    "incomplete" (the stage is waiting for more bytes) or "malformed" (it closes); pongs is
    how many PONGs it sends before that. Mirrors Connection.recv_group: a group ends at the
    first frame without MORE, is answered with a PONG when it starts with a PING, and may
    not grow past MAX_GROUP frames.
    """
    at, pongs, group = 0, 0, []
    while True:
        if len(stream) - at < HEADER_SIZE:
            return ("open" if at == len(stream) and not group else "incomplete"), pongs
        try:
            head, length = wire.decode_header(stream[at:at + HEADER_SIZE], limit)
        except FrameError:
            return "malformed", pongs
        if len(stream) - at - HEADER_SIZE < length:
            return "incomplete", pongs
        at += HEADER_SIZE + length
        group.append(head.kind)
        if head.flags & Flag.MORE:
            if len(group) >= MAX_GROUP:
                return "malformed", pongs
        else:
            pongs += group[0] is Kind.PING
            group = []


class Fuzzer:
    """An authenticated client (role "fuzzer") that checks each throw against `expect`.

    It keeps its connection while the stage does, and reconnects after the stage (or the
    fuzzer itself, for a deliberately truncated frame) closed it.
    """

    def __init__(self, cluster: LocalPipeline, index: int) -> None:
        self.cluster, self.index = cluster, index
        self.name = f"stage-{index}"
        self.conn: transport.Connection | None = None
        self.outcomes = {"open": 0, "incomplete": 0, "malformed": 0}

    def _context(self) -> str:
        proc = self.cluster.procs[self.name]
        alive = proc.alive()
        state = "alive" if alive else f"EXITED ({proc.describe_exit()})"
        note = "" if alive else (" (the example Hypothesis reports may only be the first to notice:"
                                                " the log says which frame killed it)")
        return f"{self.name} is {state}{note}; its log ends:\n{self.cluster.output(self.name, tail=30)}"

    def _connect(self) -> transport.Connection:
        if self.conn is None:
            try:
                self.conn = transport.connect(("127.0.0.1", stage_port(self.cluster, self.index)),
                                              self.cluster.secret.encode(), "fuzzer", 1 << 20)
            except (OSError, wire.HandshakeError) as exc:
                pytest.fail(f"cannot connect to {self.name}: {exc}\n{self._context()}")
            self.conn.sock.settimeout(IO_TIMEOUT)
        return self.conn

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def throw(self, data: bytes, *, sync: bool = True) -> str:
        """Send `data` (then a PING unless `sync` is False) and check the stage's reaction."""
        stream = data + (PING if sync else b"")
        outcome, pongs = expect(stream)
        self.outcomes[outcome] += 1
        conn = self._connect()
        try:
            conn.sock.sendall(stream)
        except OSError as exc:
            # only a stage that already closed on a malformed frame may refuse our bytes
            assert outcome == "malformed", \
                f"send failed ({exc}) for a {outcome} stream {stream[:72].hex()}\n{self._context()}"
            self._drop()
            return outcome
        if outcome == "malformed":
            wait_closed(conn.sock)
            self._drop()
            return outcome
        for _ in range(pongs):
            try:
                frame = conn.recv()
            except (OSError, FrameError) as exc:
                pytest.fail(f"expected a PONG after a {outcome} stream, got {exc!r}; stream {stream[:72].hex()}\n"
                            f"{self._context()}")
            assert frame.kind is Kind.PONG, f"expected a PONG, got {frame}"
            assert frame.json()["stage"] == self.index
        if outcome == "incomplete":
            self._drop()  # the stage is waiting for bytes that will never come: hang up
        return outcome

    def close(self) -> None:
        self._drop()


@pytest.fixture
def fuzzers(cluster):
    made: list[Fuzzer] = []

    def make(index: int) -> Fuzzer:
        made.append(Fuzzer(cluster, index))
        return made[-1]

    yield make
    for f in made:
        f.close()


def _header(magic=MAGIC, version=VERSION, kind=2, dtype=1, flags=0, ndim=1, pad=0, rid=1, pos=0, s=(1, 0, 0),
            length=4) -> bytes:
    """A raw frame header with every field settable (default: FORWARD of one int32)."""
    return HEADER.pack(magic, version, kind, dtype, flags, ndim, pad, rid, pos, *s, length)


def frame_bytes(kind: Kind, dtype: DType = DType.NONE, shape: tuple[int, ...] = (), payload: bytes = b"",
                rid: int = 1, pos: int = 0, flags: Flag = Flag.NONE) -> bytes:
    return wire.encode(Frame(kind, rid, pos, dtype, shape, flags, payload))


def test_expect_model_agrees_with_the_decoder():
    """The local model of the reader, on hand-made streams."""
    assert expect(b"") == ("open", 0)
    assert expect(PING * 3) == ("open", 3)
    more_ping = frame_bytes(Kind.PING, flags=Flag.MORE)
    assert expect(more_ping + frame_bytes(Kind.OPEN)) == ("open", 1)
    assert expect(frame_bytes(Kind.OPEN, flags=Flag.MORE) + PING) == ("open", 0)
    assert expect(more_ping) == ("incomplete", 0)
    assert expect(PING[:10]) == ("incomplete", 0)
    assert expect(b"XX" + PING[2:]) == ("malformed", 0)
    assert expect(PING + b"\0" * 36) == ("malformed", 1)
    assert expect(more_ping * (MAX_GROUP - 1) + PING) == ("open", 1)
    assert expect(more_ping * MAX_GROUP) == ("malformed", 0)
    assert expect(_header(s=(LIMIT // 4 + 1, 0, 0), length=LIMIT + 4)) == ("malformed", 0)


def test_oversized_frame_closes_only_that_connection(live_pipeline, cluster, fuzzers):
    """A header claiming more than max_frame_bytes is refused at once, without waiting for
    the payload; a frame of exactly the limit is accepted."""
    mark = log_mark(cluster, "stage-0")
    keep = fuzzers(0)
    assert keep.throw(b"") == "open"
    victim = fuzzers(0)
    n = LIMIT // 4 + 1
    assert victim.throw(_header(rid=77, s=(n, 0, 0), length=4 * n), sync=False) == "malformed"  # no payload sent
    wait_for_log(cluster, "stage-0", "transport.malformed_frame",
                 f"frame of {4 * n} bytes exceeds the {LIMIT}-byte limit", since=mark)
    huge = _header(dtype=int(DType.BFLOAT16), ndim=3, rid=77, s=(1, 2**31, 2**30), length=2**32 - 1)
    assert victim.throw(huge, sync=False) == "malformed"
    # exactly at the limit is read in full (then dropped: a fuzzer is not stage 0's upstream)
    exact = frame_bytes(Kind.FORWARD, DType.INT32, (LIMIT // 4,), bytes(LIMIT), rid=77)
    assert victim.throw(exact) == "open"
    assert keep.throw(b"") == "open"  # the other connection was never disturbed
    assert_serves(live_pipeline, cluster)
    wait_for_log(cluster, "stage-0", "frame.unexpected_sender", "role=fuzzer", since=mark)


def test_micro_batch_longer_than_max_group_closes_the_connection(live_pipeline, cluster, fuzzers):
    mark = log_mark(cluster, "stage-1")
    f = fuzzers(1)
    assert f.throw(frame_bytes(Kind.PING, flags=Flag.MORE) * (MAX_GROUP - 1)) == "open"  # 256 with our PING
    assert f.throw(frame_bytes(Kind.PING, flags=Flag.MORE) * MAX_GROUP) == "malformed"
    wait_for_log(cluster, "stage-1", "transport.malformed_frame", f"micro-batch longer than {MAX_GROUP} frames",
                 since=mark)
    assert_serves(live_pipeline, cluster)


# --- property-based fuzzing ---------------------------------------------------------------



@st.composite
def random_headers(draw) -> bytes:
    """Valid magic (mostly) and version, every other field random or near-valid, and a
    payload that may or may not match the claimed length."""
    kind = draw(st.integers(1, 8) | st.integers(0, 255))
    dtype = draw(st.integers(0, 4) | st.integers(0, 255))
    ndim = draw(st.integers(0, 3) | st.integers(0, 255))
    s = tuple(draw(st.integers(1, 6)) if i < min(ndim, 3) else 0 for i in range(3))
    if draw(st.booleans()):
        s = tuple(draw(st.integers(0, 2**32 - 1) | st.integers(0, 3)) for _ in range(3))
    honest = math.prod(s[:min(ndim, 3)]) * (DType(dtype).itemsize if dtype in (1, 2, 3, 4) else 1)
    length = draw(st.sampled_from([honest, honest, 0, honest + 1, max(honest - 1, 0)]) | st.integers(0, 2**32 - 1))
    raw = _header(magic=draw(st.sampled_from([MAGIC] * 8 + [b"SP", b"P\0"])),
                  version=draw(st.sampled_from([VERSION] * 8 + [0, 3])),
                  kind=kind, dtype=dtype, flags=draw(st.integers(0, 3) | st.integers(0, 255)), ndim=ndim,
                  pad=draw(st.integers(0, 255)), rid=draw(st.integers(0, 2**64 - 1)),
                  pos=draw(st.integers(0, 2**32 - 1)), s=s, length=length & 0xFFFFFFFF)
    payload_len = draw(st.sampled_from([length, 0, min(length, 3)]) if length <= 4096 else st.integers(0, 64))
    return raw + draw(st.binary(min_size=payload_len, max_size=payload_len))


@given(data=st.binary(min_size=1, max_size=160))
@settings(FUZZ, max_examples=500)
def fuzz_random_bytes(f: Fuzzer, data: bytes) -> None:
    f.throw(data)


@given(parts=st.lists(random_headers(), min_size=1, max_size=3))
@settings(FUZZ, max_examples=800)
def fuzz_random_headers(f: Fuzzer, parts: list[bytes]) -> None:
    f.throw(b"".join(parts))


def _valid_frames(index: int) -> st.SearchStrategy[bytes]:
    tokens = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8).map(
        lambda ids: frame_bytes(Kind.FORWARD, DType.INT32, (len(ids),), np.asarray(ids, np.int32).tobytes()))
    hidden = st.integers(1, 3).map(lambda n: _hidden((1, n, HIDDEN)))
    control = st.sampled_from([frame_bytes(Kind.OPEN, payload=b"{}"), frame_bytes(Kind.CLOSE), PING,
                               frame_bytes(Kind.PING, flags=Flag.MORE) + PING])
    return (tokens if index == 0 else hidden) | control


@given(frames=st.lists(st.sampled_from([0, 1]), min_size=1, max_size=3), data=st.data())
@settings(FUZZ, max_examples=400)
def fuzz_truncated(f: Fuzzer, frames: list[int], data) -> None:
    """Valid frames, the last cut short (header only, mid-header or mid-payload), then hang up."""
    blob = b"".join(data.draw(_valid_frames(f.index)) for _ in frames)
    cut = data.draw(st.integers(1, len(blob) - 1))
    f.throw(blob[:cut], sync=False)


@given(dtype=st.sampled_from([1, 2, 3, 4]), ndim=st.integers(1, 3), data=st.data())
@settings(FUZZ, max_examples=200)
def fuzz_oversized_claims(f: Fuzzer, dtype: int, ndim: int, data) -> None:
    """Headers claiming more than max_frame_bytes, honestly shaped or not, with a little payload."""
    itemsize = DType(dtype).itemsize
    length = data.draw(st.integers(LIMIT + 1, 2**32 - 1) | st.integers(LIMIT + 1, LIMIT + 64))
    if data.draw(st.booleans()) and length % itemsize == 0 and length // itemsize < 2**32:
        s = ((1,) * (ndim - 1) + (length // itemsize,) + (0, 0))[:3]
    else:
        s = tuple(data.draw(st.integers(1, 2**32 - 1)) if i < ndim else 0 for i in range(3))
    raw = _header(kind=data.draw(st.sampled_from(list(Kind))), dtype=dtype, ndim=ndim, s=s, length=length)
    f.throw(raw + data.draw(st.binary(max_size=128)), sync=data.draw(st.booleans()))


def _forward(index: int) -> st.SearchStrategy[bytes]:
    """FORWARD frames for stage `index`: right or wrong dtype, rank, width, token ids, request id, position."""
    rid = st.sampled_from([1, 2, 3, 0, 2**64 - 1]) | st.integers(0, 2**64 - 1)
    pos = st.integers(0, 6) | st.integers(0, 2**32 - 1)
    flags = st.sampled_from([Flag.NONE, Flag.SAMPLE])

    @st.composite
    def tokens(draw) -> bytes:
        ids = draw(st.lists(st.integers(0, VOCAB - 1) | st.integers(-2**31, 2**31 - 1)
                            | st.sampled_from([-1, VOCAB, VOCAB + 1]), min_size=1, max_size=12))
        arr = np.asarray(ids, np.int32)
        shape = draw(st.sampled_from([(len(ids),), (len(ids),), (1, len(ids)), (1, len(ids), 1)]))
        dtype = draw(st.sampled_from([DType.INT32] * 4 + [DType.FLOAT32]))
        return frame_bytes(Kind.FORWARD, dtype, shape, arr.tobytes(), draw(rid), draw(pos), draw(flags))

    @st.composite
    def hidden(draw) -> bytes:
        dtype = draw(st.sampled_from([DType.FLOAT32] * 4 + [DType.BFLOAT16, DType.FLOAT16, DType.INT32]))
        width = draw(st.sampled_from([HIDDEN] * 4 + [HIDDEN - 1, HIDDEN + 1, 2 * HIDDEN, 1]))
        n = draw(st.integers(1, 4))
        shape = draw(st.sampled_from([(1, n, width)] * 4 + [(2, n, width), (n, width), (n * width,)]))
        count = math.prod(shape)
        if draw(st.booleans()):
            size = count * dtype.itemsize
            payload = draw(st.binary(min_size=size, max_size=size))  # NaN, inf, anything
        else:
            payload = (np.random.default_rng(count).standard_normal(count).astype(np.float32).tobytes()
                       if dtype is DType.FLOAT32 else bytes(count * dtype.itemsize))
        return frame_bytes(Kind.FORWARD, dtype, shape, payload, draw(rid), draw(pos), draw(flags))

    return tokens() if index == 0 else hidden()


SAMPLING = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.0, 0.7, 1.0]), "top_p": st.sampled_from([0.5, 1.0]),
    "top_logprobs": st.integers(0, 5), "seed": st.integers(0, 2**40),
})


def _semantic(index: int) -> st.SearchStrategy[bytes]:
    """Well-formed frames of every kind, so the MLX thread sees OPEN/FORWARD/CLOSE/RESET sequences."""
    rid = st.sampled_from([1, 2, 3])
    opens = st.builds(lambda p, r, fl: wire.encode(wire.json_frame(Kind.OPEN, p, request_id=r, flags=fl)),
                      SAMPLING, rid, st.sampled_from([Flag.NONE, Flag.MORE]))
    others = st.builds(lambda k, r, fl: frame_bytes(k, rid=r, flags=fl),
                       st.sampled_from([Kind.CLOSE, Kind.RESET, Kind.PING, Kind.RESULT, Kind.PONG, Kind.ERROR]), rid,
                       st.sampled_from([Flag.NONE, Flag.MORE, Flag.SAMPLE]))
    return st.lists(st.one_of(opens, _forward(index), _forward(index), others), min_size=1, max_size=6).map(b"".join)


@given(data=st.data())
@settings(FUZZ, max_examples=400)
def fuzz_semantic(f: Fuzzer, data) -> None:
    assert f.throw(data.draw(_semantic(f.index))) == "open"


def _junk_json() -> st.SearchStrategy[bytes]:
    nested = st.one_of(st.integers(1, MAX_JSON_BYTES).map(lambda n: b"[" * n),
                       st.integers(1, MAX_JSON_BYTES // 2).map(lambda n: b"[" * n + b"]" * n),
                       st.integers(1, MAX_JSON_BYTES // 5).map(lambda n: b'{"a":' * n))
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=10)
    wrong_types = st.dictionaries(
        st.sampled_from(["temperature", "top_p", "top_logprobs", "seed", "max_tokens"]),
        st.one_of(st.none(), st.text(max_size=5), st.lists(st.integers(), max_size=2),
                  st.dictionaries(st.text(max_size=2), st.integers(), max_size=1), st.integers(-2**70, 2**70),
                  st.sampled_from([10**400, -10**400]), st.floats(), st.sampled_from(["nan", "inf", "1e999"])),
        max_size=3)

    def as_json(value: object) -> bytes:
        return json.dumps(value).encode()  # floats: NaN and Infinity, as Python writes them

    return st.one_of(
        st.binary(max_size=256), values.map(as_json), wrong_types.map(as_json), nested,
        st.sampled_from([b"1e999", b"-1e999", b"NaN", b'{"temperature": Infinity}',
                         b'{"seed": 1e999, "temperature": 1}',
                         b'{"top_logprobs": 1e400}', b"\xff\xfe{}", b"{}" * 2, b"\"" * 7]))


@given(kind=st.sampled_from([Kind.OPEN] * 4 + [Kind.RESET, Kind.CLOSE, Kind.PING, Kind.PONG, Kind.ERROR, Kind.RESULT]),
       payload=_junk_json(), rid=st.sampled_from([1, 2, 3]),
       flags=st.sampled_from([Flag.NONE, Flag.SAMPLE]))
@settings(FUZZ, max_examples=600)
def fuzz_junk_json(f: Fuzzer, kind: Kind, payload: bytes, rid: int, flags: Flag) -> None:
    assert len(payload) <= MAX_JSON_BYTES
    assert f.throw(frame_bytes(kind, payload=payload, rid=rid, flags=flags)) == "open"


FUZZERS: dict[str, tuple[Callable, tuple[int, ...], tuple[str, ...]]] = {
    # name: (fuzz function, stages to throw at, outcomes that must each have happened)
    "random-bytes": (fuzz_random_bytes, (0, 1), ("malformed",)),
    "random-headers": (fuzz_random_headers, (0, 1), ("malformed", "open", "incomplete")),
    "truncated": (fuzz_truncated, (0, 1), ("incomplete",)),
    "oversized-claims": (fuzz_oversized_claims, (0,), ("malformed",)),
    "semantic-frames": (fuzz_semantic, (0, 1), ("open",)),
    "junk-json": (fuzz_junk_json, (0, 1), ("open",)),
}


@pytest.mark.parametrize("name", list(FUZZERS))
def test_fuzzing_a_live_stage(live_pipeline, cluster, fuzzers, name):
    """Thousands of hostile frames in all: the live stage behaves as `expect` says on each,
    logs the malformed ones, stays up, and still generates exactly."""
    fuzz, stages, must_see = FUZZERS[name]
    marks = {i: log_mark(cluster, f"stage-{i}") for i in stages}
    seen = {"open": 0, "incomplete": 0, "malformed": 0}
    for index in stages:
        f = fuzzers(index)
        fuzz(f)
        for k, v in f.outcomes.items():
            seen[k] += v
        f.close()
    for outcome in must_see:
        assert seen[outcome] > 0, f"{name}: the strategy never produced a {outcome} stream ({seen})"
    assert_serves(live_pipeline, cluster)
    if seen["malformed"]:
        for index in stages:
            wait_for_log(cluster, f"stage-{index}", "transport.malformed_frame", "role=fuzzer",
                         since=marks[index])


# --- what reaches the MLX thread: each bad FORWARD/OPEN fails its request, not the stage -----

def _tokens(ids: list[int], rid: int = 1, pos: int = 0, dtype: DType = DType.INT32, shape=None,
            flags=Flag.NONE) -> bytes:
    arr = np.asarray(ids, np.int32 if dtype is DType.INT32 else np.float32)
    return frame_bytes(Kind.FORWARD, dtype, shape or (len(ids),), arr.tobytes(), rid, pos, flags)


def _hidden(shape, dtype: DType = DType.FLOAT32, rid: int = 1, pos: int = 0, flags=Flag.SAMPLE) -> bytes:
    n = math.prod(shape)
    payload = (np.linspace(-1, 1, n, dtype=np.float32).tobytes() if dtype is DType.FLOAT32
               else bytes(n * dtype.itemsize))
    return frame_bytes(Kind.FORWARD, dtype, shape, payload, rid, pos, flags)


def _open(params: bytes = b"{}", rid: int = 1) -> bytes:
    return frame_bytes(Kind.OPEN, payload=params, rid=rid)


FIRST_ONLY = "the first stage takes a 1-D int32 frame"
HIDDEN_ONLY = "expected hidden states [1, L, 64]"
BAD_SAMPLING = "bad sampling parameters"

BAD_REQUESTS = [
    # (stage, frames, expected ERROR message); the coordinator connection gets the ERROR
    pytest.param(0, _tokens([1, 2]), "stage 0: unknown request", id="s0-unknown-request"),
    pytest.param(0, _open() + _tokens([1, 2], pos=3), "stage 0: KV position 3 != expected 0", id="s0-kv-position"),
    pytest.param(0, _open() + _tokens([1, VOCAB]), "token id outside the vocabulary (0..511)", id="s0-token-too-big"),
    pytest.param(0, _open() + _tokens([-1, 2]), "token id outside the vocabulary", id="s0-negative-token"),
    pytest.param(0, _open() + _tokens([2**31 - 1]), "token id outside the vocabulary", id="s0-int32-max-token"),
    pytest.param(0, _open() + _tokens([1, 2], dtype=DType.FLOAT32), FIRST_ONLY, id="s0-float-tokens"),
    pytest.param(0, _open() + _tokens([1, 2], shape=(1, 2)), FIRST_ONLY, id="s0-2d-tokens"),
    pytest.param(0, _open() + _hidden((1, 2, HIDDEN)), FIRST_ONLY, id="s0-hidden"),
    pytest.param(1, _hidden((1, 1, HIDDEN)), "stage 1: unknown request", id="s1-unknown-request"),
    pytest.param(1, _open() + _hidden((1, 1, HIDDEN), pos=9), "stage 1: KV position 9 != expected 0",
                 id="s1-kv-position"),
    pytest.param(1, _open() + _hidden((1, 2, HIDDEN - 1)), "expected hidden states [1, L, 64], got FLOAT32 (1, 2, 63)",
                 id="s1-narrow"),
    pytest.param(1, _open() + _hidden((1, 2, 2 * HIDDEN)), HIDDEN_ONLY, id="s1-wide"),
    pytest.param(1, _open() + _hidden((2, 1, HIDDEN)), "expected hidden states [1, L, 64], got FLOAT32 (2, 1, 64)",
                 id="s1-batch-2"),
    pytest.param(1, _open() + _hidden((2, HIDDEN)), HIDDEN_ONLY, id="s1-rank-2"),
    pytest.param(1, _open() + _hidden((1, 2, HIDDEN), DType.BFLOAT16), "hidden states in BFLOAT16, this model runs",
                 id="s1-bf16"),
    pytest.param(1, _open() + _hidden((1, 2, HIDDEN), DType.FLOAT16), "hidden states in FLOAT16, this model runs",
                 id="s1-f16"),
    pytest.param(1, _open() + _tokens([1, 2]), "expected hidden states [1, L, 64], got INT32 (2,)", id="s1-tokens"),
    pytest.param(1, _open(b'{"temperature": 99}'), f"{BAD_SAMPLING}: sampling parameters out of range", id="s1-hot"),
    pytest.param(1, _open(b'{"temperature": "hot"}'), BAD_SAMPLING, id="s1-temperature-text"),
    pytest.param(1, _open(b"not json"), f"{BAD_SAMPLING}: OPEN frame payload is not JSON", id="s1-not-json"),
    pytest.param(1, _open(b"[" * 50000), f"{BAD_SAMPLING}: OPEN frame payload is not JSON", id="s1-deep-json"),
    pytest.param(1, _open(b"[]"), BAD_SAMPLING, id="s1-json-list"),
    pytest.param(1, _open(b"null"), BAD_SAMPLING, id="s1-json-null"),
    pytest.param(1, _open(b'{"temperature": [1]}'), BAD_SAMPLING, id="s1-temperature-list"),
    pytest.param(1, _open(b'{"top_logprobs": 1e400}'), BAD_SAMPLING, id="s1-top-logprobs-inf"),
    pytest.param(1, _open(b'{"temperature": 1, "seed": {}}'), BAD_SAMPLING, id="s1-seed-dict"),
    pytest.param(1, _open(b'{"top_p": ' + b"9" * 400 + b"}"), BAD_SAMPLING, id="s1-huge-int"),
]


def as_coordinator(cluster: LocalPipeline, index: int) -> transport.Connection:
    """Connect as the stage's coordinator (no real one is running), so its ERRORs and RESULTs come to us."""
    conn = transport.connect(("127.0.0.1", stage_port(cluster, index)), cluster.secret.encode(), "coordinator",
                             1 << 20)
    conn.sock.settimeout(IO_TIMEOUT)
    return conn


@pytest.mark.parametrize("index,frames,message", BAD_REQUESTS)
def test_a_bad_request_gets_an_error_and_the_stage_carries_on(live_pipeline, cluster, index, frames, message):
    conn = as_coordinator(cluster, index)
    # Requests enter a stage only from its upstream neighbour: stage 0 from the coordinator,
    # stage k from stage k-1. ERRORs and RESULTs always go to the coordinator.
    sender = conn if index == 0 else transport.connect(
        ("127.0.0.1", stage_port(cluster, index)), cluster.secret.encode(), f"stage-{index - 1}", 1 << 20)
    try:
        sender.sock.sendall(frames)
        try:
            reply = conn.recv()
        except (OSError, FrameError) as exc:
            pytest.fail(f"no ERROR from stage-{index} ({exc!r}):\n{cluster.output(f'stage-{index}', tail=30)}")
        assert reply.kind is Kind.ERROR, reply
        assert message in reply.json()["message"]
        # the same connection still works: a good request on it is served
        if index == 1:
            sender.sock.sendall(_open(rid=5) + _hidden((1, 3, HIDDEN), rid=5))
            result = conn.recv()
            assert result.kind is Kind.RESULT and result.request_id == 5 and result.position == 3
            token = decode_result(result.payload)[0]
            assert 0 <= token < VOCAB
        else:
            conn.send(Frame(Kind.PING))
            assert conn.recv().kind is Kind.PONG
    finally:
        conn.close()
        sender.close()
    assert_serves(live_pipeline, cluster)


def test_requests_from_a_peer_that_is_not_upstream_are_ignored(live_pipeline, cluster):
    """Knowing the secret lets a peer probe liveness, not drive or reset another stage's requests."""
    mark = log_mark(cluster, "stage-1")
    coordinator = as_coordinator(cluster, 1)
    try:
        coordinator.sock.sendall(_open(rid=9) + _hidden((1, 3, HIDDEN), rid=9))
        wait_for_log(cluster, "stage-1", "frame.unexpected_sender", "role=coordinator", "expected=stage-0", since=mark)
        coordinator.send(Frame(Kind.PING))
        assert coordinator.recv().kind is Kind.PONG  # no RESULT or ERROR came first: the frames were dropped
    finally:
        coordinator.close()
    assert_serves(live_pipeline, cluster)


def test_a_result_reaches_a_coordinator_right_after_its_handshake(live_pipeline, cluster):
    """The stage must adopt a coordinator before telling it the handshake succeeded.

    Otherwise a request started the moment the handshake completes (the coordinator's
    warm-up probe, through stage 0) can reach the last stage before the adoption does, and
    its RESULT is dropped ("coordinator.absent"): the pipeline then waits forever.
    """
    upstream = transport.connect(("127.0.0.1", stage_port(cluster, 1)), cluster.secret.encode(), "stage-0",
                                 1 << 20)
    coord = None
    try:
        for rid in range(1, 201):
            if coord is not None:
                coord.close()
            coord = as_coordinator(cluster, 1)
            coord.sock.settimeout(3)
            upstream.sock.sendall(_open(rid=rid) + _hidden((1, 1, HIDDEN), rid=rid))
            try:
                reply = coord.recv()
            except TimeoutError:
                pytest.fail(f"attempt {rid}: the RESULT never reached the new coordinator:\n"
                            f"{cluster.output('stage-1', tail=8)}")
            assert (reply.kind, reply.request_id) == (Kind.RESULT, rid), reply
    finally:
        upstream.close()
        if coord is not None:
            coord.close()
    assert_serves(live_pipeline, cluster)
