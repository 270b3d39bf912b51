"""Real `pipeserve agent` subprocesses for tests, on free ports; shared by every test package.

A helper that cannot get its agent up fails the test at once with the agent's own output.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.demo_stack import SHARED_HOST_BLAS  # every test "node" is this one machine, as in the demo
from orchestrator.proc import ChildError, ChildProcess, kill_marked

STARTUP_TIMEOUT = 20.0


@dataclass
class AgentProc:
    """A running agent subprocess and a paired client for it."""

    name: str
    root: Path
    port: int
    ports: tuple[int, int]
    args: list[str]
    env: dict[str, str]
    proc: ChildProcess | None = None
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
        return self.proc.output(tail) if self.proc is not None else "(no output)"

    def launch(self) -> "AgentProc":
        """Start the process (without waiting)."""
        self.starts += 1
        cmd = [sys.executable, "-m", "orchestrator.cli", "agent", "--host", "127.0.0.1", "--port", str(self.port),
               "--name", self.name, "--models-dir", str(self.models_dir), "--state-dir", str(self.state_dir),
               "--transport-ports", f"{self.ports[0]}-{self.ports[1]}", *self.args]
        self.proc = ChildProcess.spawn(f"agent {self.name}", cmd, self.log_path,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1", **SHARED_HOST_BLAS, **self.env})
        return self

    def wait_ready(self, pair: bool = True) -> "AgentProc":
        """Wait for the identity probe; pair on first start. Fails the test with the output if it dies."""
        assert self.proc is not None
        probe = AgentClient(self.url, timeout=1)
        try:
            self.proc.wait_ready(probe.identity, "an answer to the identity probe", STARTUP_TIMEOUT,
                                 ignore=(AgentError,))
        except ChildError as exc:
            pytest.fail(str(exc), pytrace=False)
        finally:
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
        """Stop the agent (SIGTERM: graceful; SIGKILL: a crash) and reap it; returns its exit status."""
        if self.proc is None:
            return None
        self.proc.send(sig)
        if not self.proc.wait_exit(timeout):
            self.proc.stop(0)
        return self.proc.returncode

    def restart(self) -> "AgentProc":
        """Start again on the same port and directories; the client keeps its credential."""
        return self.launch().wait_ready()

    def kill_engine_leftovers(self) -> None:
        """Kill any process whose command line names this agent's state dir (its engine processes),
        recorded or not, so that no test leaves an orphan behind whatever went wrong."""
        kill_marked(str(self.state_dir))
