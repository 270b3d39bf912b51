"""A real `pipeserve dashboard` process on a free loopback port, for attacks that need the real
server (gunicorn's worker, real sockets), and raw-socket websocket helpers that cost no thread
per connection (the tests open hundreds)."""

from __future__ import annotations

import base64
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from orchestrator.proc import free_port, wait_until
from orchestrator.proc.wait import WaitTimeout

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 60.0  # a loaded 2-core machine imports the web stack slowly


@dataclass
class Dashboard:
    """One running dashboard process and what a test needs to talk to it."""

    proc: subprocess.Popen
    port: int
    state_dir: Path
    log_path: Path
    admin_token: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def login(self, token: str | None = None) -> requests.Session:
        """A requests session logged in with `token` (default: the admin token)."""
        s = requests.Session()
        r = s.post(self.url + "/login", data={"token": token or self.admin_token}, allow_redirects=False, timeout=10)
        assert r.status_code == 302, (r.status_code, r.text[:300])
        return s

    def csrf(self, session: requests.Session) -> str:
        """The CSRF token a logged-in session's pages carry."""
        html = session.get(self.url + "/settings", timeout=10).text
        return re.search(r'<meta name="csrf-token" content="([^"]*)"', html).group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `pipeserve ARGS` to completion."""
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def start_dashboard(tmp: Path, *extra: str, env: dict | None = None) -> Dashboard:
    """Start `pipeserve dashboard` (no discovery, an unreachable router) and wait until it answers."""
    port, state = free_port(), tmp / "dashboard-state"
    log_path = tmp / f"dashboard-{port}.log"
    argv = [sys.executable, "-m", "orchestrator.cli", "dashboard", "--host", "127.0.0.1", "--port", str(port),
            "--state-dir", str(state), "--router", "http://127.0.0.1:9", "--no-discovery", *extra]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    d = Dashboard(proc, port, state, log_path)

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"dashboard exited with {proc.returncode}:\n{d.log()}")
        m = re.search(r"admin token: (\S+)", d.log())
        if not m:
            return False
        d.admin_token = m.group(1)
        return requests.get(d.url + "/login", timeout=2).status_code == 200

    try:
        wait_until(answers, STARTUP_TIMEOUT, interval=0.1, message="the dashboard to answer",
                   ignore=(requests.RequestException,))
    except WaitTimeout:
        d.stop()
        raise RuntimeError(f"dashboard did not answer within {STARTUP_TIMEOUT} s:\n{d.log()}") from None
    return d


# --- websockets over raw sockets ------------------------------------------------------------

def ws_request(port: int, path: str, cookie: str = "", origin: str | None = None) -> bytes:
    """The bytes of a websocket upgrade request."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    if cookie:
        lines.append(f"Cookie: session={cookie}")
    if origin:
        lines.append(f"Origin: {origin}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def ws_connect(port: int, path: str, cookie: str = "", origin: str | None = None,
               timeout: float = 10) -> tuple[socket.socket, int, bytes]:
    """Open a websocket: (socket, HTTP status of the answer, bytes read after the headers)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(ws_request(port, path, cookie, origin))
    status, rest = read_upgrade(sock, time.monotonic() + timeout)
    return sock, status, rest


def read_upgrade(sock: socket.socket, deadline: float) -> tuple[int, bytes]:
    """Read an HTTP answer's head: (status, the bytes after it); status 0 if none came in time."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return 0, buf
        chunk = sock.recv(65536)
        if not chunk:
            return 0, buf
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    return int(head.split(b" ", 2)[1]), rest


def read_frames(sock: socket.socket, pending: bytes, timeout: float) -> tuple[list[tuple[int, bytes]], bool]:
    """Server frames until a close frame, EOF or `timeout`: ([(opcode, payload)], closed)."""
    deadline, buf, frames = time.monotonic() + timeout, pending, []
    while True:
        while len(buf) >= 2:
            length, at = buf[1] & 0x7F, 2
            if length == 126:
                if len(buf) < 4:
                    break
                length, at = struct.unpack("!H", buf[2:4])[0], 4
            elif length == 127:
                if len(buf) < 10:
                    break
                length, at = struct.unpack("!Q", buf[2:10])[0], 10
            if len(buf) < at + length:
                break
            frames.append((buf[0] & 0x0F, buf[at:at + length]))
            buf = buf[at + length:]
            if frames[-1][0] == 8:
                return frames, True
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return frames, False
        try:
            chunk = sock.recv(65536)
        except OSError:
            return frames, True
        if not chunk:
            return frames, True
        buf += chunk


def close_code(frames: list[tuple[int, bytes]]) -> tuple[int, str] | None:
    """The (code, reason) of the close frame among `frames`, if any."""
    for opcode, payload in frames:
        if opcode == 8 and len(payload) >= 2:
            return struct.unpack("!H", payload[:2])[0], payload[2:].decode(errors="replace")
    return None
