"""Real `pipeserve agent` subprocesses for tests, on free ports; shared by every test package.

A helper that cannot get its agent up fails the test at once with the agent's own output.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.demo import SHARED_HOST_BLAS  # every test "node" is this one machine, as in the demo
from orchestrator.engine.local import free_port

STARTUP_TIMEOUT = 20.0


def free_port_block(n: int) -> tuple[int, int]:
    """n consecutive ports free right now (a transport range of its own for each agent)."""
    for _ in range(200):
        start = free_port()
        if start + n > 65535:
            continue
        socks = []
        try:
            for p in range(start, start + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return start, start + n - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


@dataclass
class AgentProc:
    """A running agent subprocess and a paired client for it."""

    name: str
    root: Path
    port: int
    ports: tuple[int, int]
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    token: str | None = None
    client: AgentClient = field(init=False)
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def port_at(self, i: int) -> int:
        """The i-th port of this agent's transport range."""
        assert self.ports[0] + i <= self.ports[1]
        return self.ports[0] + i

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def log_path(self) -> Path:
        return self.root / f"agent-{self.starts}.log"

    def output(self, tail: int = 60) -> str:
        """The last lines this agent printed (current run)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-tail:])
        except OSError:
            return "(no output)"

    def launch(self) -> "AgentProc":
        """Start the process (without waiting)."""
        self.starts += 1
        cmd = [sys.executable, "-m", "orchestrator.cli", "agent", "--host", "127.0.0.1", "--port", str(self.port),
               "--name", self.name, "--models-dir", str(self.models_dir), "--state-dir", str(self.state_dir),
               "--transport-ports", f"{self.ports[0]}-{self.ports[1]}", *self.args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", **SHARED_HOST_BLAS, **self.env})
        return self

    def wait_ready(self, pair: bool = True) -> "AgentProc":
        """Wait for the identity probe; pair on first start. Fails the test with the output if it dies."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        probe = AgentClient(self.url, timeout=1)
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"agent {self.name} exited with {self.proc.returncode}:\n{self.output()}")
            try:
                probe.identity()
                break
            except AgentError:
                if time.monotonic() > deadline:
                    pytest.fail(f"agent {self.name} not answering after {STARTUP_TIMEOUT:.0f} s:\n{self.output()}")
                time.sleep(0.05)
        probe.close()
        if self.starts == 1:
            m = re.search(r"pairing token: (\S+)", self.log_path.read_text())
            assert m, f"agent {self.name} printed no pairing token:\n{self.output()}"
            self.token = m.group(1)
            self.client = AgentClient(self.url)
            if pair:
                self.client.pair(self.token, "tests")
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Stop the agent (SIGTERM: graceful; SIGKILL: a crash) and reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def restart(self) -> "AgentProc":
        """Start again on the same port and directories; the client keeps its credential."""
        return self.launch().wait_ready()

    def kill_engine_leftovers(self) -> None:
        """Kill any process whose command line names this agent's state dir (its engine processes),
        recorded or not, so that no test leaves an orphan behind whatever went wrong."""
        marker = str(self.state_dir).encode()
        for proc_dir in Path("/proc").glob("[0-9]*"):
            try:
                if marker in (proc_dir / "cmdline").read_bytes():
                    os.kill(int(proc_dir.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue


