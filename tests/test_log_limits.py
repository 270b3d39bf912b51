"""A flood cannot fill the disk through a log: repeated lines collapse, the file rotates by size.

Issue 20 item 8: every request and refused connection wrote a log line and logs rotated only
on restart (62k lines, 6.6 MB in minutes). Here a real `pipeserve router` is flooded with
malformed requests, connections past its limit and ordinary requests, under a 20 kB cap.
"""

from __future__ import annotations

import io
import logging
import socket
from pathlib import Path

import requests

from orchestrator.log_limits import LimitedHandler
from orchestrator.logs import _Formatter
from orchestrator.proc import free_port, wait_until
from tests.support.router import RouterProc, write_yaml

CAP = 20_000


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _logger(handler: logging.Handler, name: str) -> logging.Logger:
    handler.setFormatter(_Formatter())
    logger = logging.getLogger(f"pipeserve.test-limits.{name}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_repeated_warnings_collapse_into_one_line_per_window() -> None:
    out, clock = io.StringIO(), _Clock()
    handler = LimitedHandler(out, clock=clock)
    log = _logger(handler, "collapse")
    for i in range(100):
        log.warning("transport.refused", extra={"fields": {"peer": f"10.0.0.9:{i}"}, "collapse_key": "10.0.0.9"})
        log.info("request.done", extra={"fields": {"n": i}})  # ordinary INFO lines are all kept
    log.warning("transport.refused", extra={"fields": {}, "collapse_key": "10.0.0.7"})  # another key: its own
    clock.now += 10.0
    log.warning("transport.refused", extra={"fields": {"peer": "10.0.0.9:1"}, "collapse_key": "10.0.0.9"})
    handler.close()
    lines = out.getvalue().splitlines()
    refused = [ln for ln in lines if "transport.refused" in ln]
    assert sum("request.done" in ln for ln in lines) == 100
    assert len(refused) == 5 + 1 + 1 + 1, refused  # a burst, the other key, the summary, the next window's first
    assert [ln for ln in refused if "… and 95 more like it in the last 10 s" in ln], refused
    assert "peer=10.0.0.9:99" in next(ln for ln in refused if "more like it" in ln)  # the last one held back


def test_unkeyed_warnings_collapse_only_when_identical() -> None:
    out = io.StringIO()
    handler = LimitedHandler(out, clock=_Clock())
    log = _logger(handler, "identical")
    for i in range(10):
        log.warning("process.kill", extra={"fields": {"node": f"stage-{i}"}})  # ten different lines: all kept
        log.warning("lease.expired", extra={"fields": {"node": "stage-0"}})  # the same line ten times
    handler.close()
    lines = out.getvalue().splitlines()
    assert sum("process.kill" in ln for ln in lines) == 10
    assert sum("lease.expired" in ln for ln in lines) == 5 + 1 and "and 5 more like it" in lines[-1], lines


def test_a_summary_is_written_when_the_flood_stops(tmp_path: Path) -> None:
    out = io.StringIO()
    handler = LimitedHandler(out, window_s=0.2)  # real time: its timer writes the summary
    log = _logger(handler, "timer")
    for _ in range(20):
        log.error("http.internal_error", extra={"fields": {}})
    wait_until(lambda: "and 15 more like it in the last 0.2 s" in out.getvalue(), 10, 0.05, "the summary")
    handler.close()


def test_a_real_router_flooded_keeps_its_log_under_the_cap(tmp_path: Path) -> None:
    cfg = write_yaml(tmp_path / "router.yaml", {"backends": [], "health_checks": {"interval": "0.5s"}})
    log_path = tmp_path / "router.log"
    router = RouterProc(cfg, free_port(), log_path, env={"PIPESERVE_LOG_MAX_BYTES": str(CAP),
                                                         "PIPESERVE_HTTP_MAX_CONNECTIONS": "8"}).start()
    held: list[socket.socket] = []
    try:
        port = router.port
        for _ in range(1500):  # malformed requests: a 400 each, one line each before
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"NOT-HTTP \x01\x02\r\n\r\n")
                s.recv(4096)
        for _ in range(16):  # idle clients past the limit: each newcomer with a request evicts one (a warning)
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            requests.get(router.url + "/health", timeout=5)
        session = requests.Session()
        for _ in range(1500):  # ordinary requests, one line each: only the rotation bounds these
            session.get(router.url + "/health", timeout=5)
        rotated = log_path.with_name("router.log.1")
        # The summary of the held-back lines comes at the end of their 10 s window.
        wait_until(lambda: "more like it in the last 10 s" in log_path.read_text(errors="replace")
                   + (rotated.read_text(errors="replace") if rotated.exists() else ""), 20, 0.2,
                   "the summary of the malformed requests")
        sizes = (log_path.stat().st_size, rotated.stat().st_size)
        print(f"log {sizes[0]} B, rotated {sizes[1]} B under a cap of {CAP} B")
        slack = 1000  # the line that crossed the cap is written before the rotation
        assert sizes[0] <= CAP + slack and sizes[1] <= CAP + slack
        assert router.proc is not None and router.proc.alive()
        assert session.get(router.url + "/health", timeout=5).status_code == 200  # still serving, logging
        wait_until(lambda: log_path.stat().st_size > 0, 5, 0.05, "the fresh log file in use")
    finally:
        for s in held:
            s.close()
        router.stop(5)
