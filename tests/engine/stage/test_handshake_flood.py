"""A handshake flood never keeps a stage's own peers out (issue 20, item 2), on a LIVE stage.

Before: 96 threads reconnecting to a stage's transport port in a loop held its 32
handshake slots; a `kill -9` recovery took 90 s instead of 3 s (the coordinator got a slot
85 s after the new stage listened) and every refusal was logged (40 MB in 90 s). Now the
cluster's own hosts have slots of their own, strangers get at most 4 each, and repeated
refusals are logged at most once per 10 s. The flood comes from other loopback addresses
(127.0.0.2–9, "hosts" outside the cluster); the peer proves the secret from 127.0.0.1,
the cluster's host. Bounded: 48 flood threads for a few seconds.
"""

from __future__ import annotations

import socket
import threading
import time

from orchestrator.engine import transport
from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.engine.wire import Frame, Kind

SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]
FLOODERS = 48


def test_a_handshake_flood_from_strangers_never_keeps_a_peer_out(model_factory, tmp_path):
    p = LocalPipeline(tmp_path, model_factory(), [(0, 3)], coordinator=False, threads=1).start()
    port = p.ports[1]
    stop = threading.Event()
    refused = [0]

    def flood(source: str) -> None:
        while not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
            except OSError:
                continue
            try:
                s.settimeout(10)
                while s.recv(4096):  # the hello, then silence until the stage gives up on us
                    pass
                refused[0] += 1
            except OSError:
                pass
            finally:
                s.close()

    threads = [threading.Thread(target=flood, args=(SOURCES[i % len(SOURCES)],), daemon=True)
               for i in range(FLOODERS)]
    log = tmp_path / "stage-0.log"
    try:
        for t in threads:
            t.start()
        time.sleep(2.0)  # the strangers' slots are full (each holds one for the 5 s handshake timeout)
        for _ in range(5):
            conn = transport.connect(("127.0.0.1", port), p.secret.encode(), "probe", 1 << 20)
            try:
                conn.send(Frame(Kind.PING))
                assert conn.recv().kind is Kind.PONG
            finally:
                conn.close()
            time.sleep(0.5)
        time.sleep(3.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=20)
        p.stop()
    lines = [line for line in log.read_text(errors="replace").splitlines() if "transport.refused" in line]
    print(f"{refused[0]} flood connections ended; {len(lines)} refusal lines logged")
    assert refused[0] > 2 * len(lines), "refusals of a flood are logged throttled, not one line each"
    assert any("already in progress" in line for line in lines)
