"""A node agent as a child process of this machine: the demo's nodes, the tests' agents and the
benchmarks' nodes all start `pipeserve agent` through `LocalAgent` (docs/architecture.md,
"A process of the machine").

The agent listens on 127.0.0.1; its models and state live under one directory, so a restart
over the same directory keeps its identity and credentials. What it prints goes to one log
file per start, so the pairing token (printed at a fresh state's first start) and a failed
start's output are read from the run they belong to.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import settings
from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.proc import ChildProcess, kill_marked

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0  # an agent stops its engine processes before it exits
PAIRING_TOKEN = r"pairing token: (\S+)"

# Every local "node" is this one machine: a stage computes on one BLAS thread while others
# also work, and on every core when the coordinator says nothing else is in flight (the SOLO
# flag). Agents pass their environment on to the stages they start.
SHARED_HOST_BLAS = {settings.STAGE_THREADS.name: "1", settings.SOLO_THREADS.name: str(os.cpu_count() or 1)}


@dataclass(eq=False)
class LocalAgent:
    """One `pipeserve agent` process on 127.0.0.1, its directories and its pairing token."""

    name: str
    root: Path  # models/ and state/ go here
    port: int
    transport: tuple[int, int]  # first and last port of its transport range
    args: list[str] = field(default_factory=list)  # further command-line options
    env: dict[str, str] = field(default_factory=dict)  # over this process's, PYTHONUNBUFFERED and SHARED_HOST_BLAS
    log_dir: Path | None = None  # default: root
    die_with_parent: bool = False  # see ChildProcess.spawn
    python: str = sys.executable
    proc: ChildProcess | None = None
    token: str | None = None  # printed at the first start over a fresh state directory
    starts: int = 0

    @property
    def address(self) -> str:
        """host:port, as a user types it into the dashboard."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def log_path(self) -> Path:
        """The log of the current (latest) start."""
        name = self.name if self.starts <= 1 else f"{self.name}-{self.starts}"
        return (self.log_dir or self.root) / f"{name}.log"

    def argv(self) -> list[str]:
        """The command line of `pipeserve agent` for this node."""
        return [self.python, "-m", "orchestrator.cli", "agent", "--host", "127.0.0.1", "--port", str(self.port),
                "--name", self.name, "--models-dir", str(self.models_dir), "--state-dir", str(self.state_dir),
                "--transport-ports", f"{self.transport[0]}-{self.transport[1]}", *self.args]

    def launch(self) -> "LocalAgent":
        """Start the process without waiting for it (a restart reuses the same directories)."""
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.proc = ChildProcess.spawn(f"agent {self.name}", self.argv(), self.log_path,
                                       die_with_parent=self.die_with_parent,
                                       env={**settings.process_environment(), "PYTHONUNBUFFERED": "1",
                                            **SHARED_HOST_BLAS, **self.env})
        return self

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> "LocalAgent":
        """Wait until the agent answers its identity probe and note the pairing token it printed
        (it prints it before it listens). ChildError with its output if it exits or times out."""
        assert self.proc is not None, "launch() first"
        probe = AgentClient(self.url, timeout=1)
        try:
            self.proc.wait_ready(probe.identity, "an answer on " + self.url, timeout, ignore=(AgentError,))
        finally:
            probe.close()
        if self.token is None:
            self.token = self.proc.printed(PAIRING_TOKEN)
        return self

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> "LocalAgent":
        """`launch` and `wait_ready`."""
        return self.launch().wait_ready(timeout)

    def output(self, tail: int = 60) -> str:
        """The last lines this agent printed in its current run."""
        return self.proc.output(tail) if self.proc is not None else "(no output)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def send(self, sig: int) -> None:
        """Signal the agent alone: its engine processes run in sessions of their own, so SIGKILL
        here is an agent crash that leaves them running (they notice by watching their parent)."""
        if self.proc is not None:
            self.proc.send(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Send `sig` (SIGTERM: the agent stops its engine processes first; SIGKILL: a crash), SIGKILL
        after `timeout`, and reap it. Returns its exit status (None if it never started)."""
        if self.proc is None:
            return None
        self.send(sig)
        if not self.proc.wait_exit(timeout):
            self.proc.stop(0)
        return self.proc.returncode

    def kill_engine_leftovers(self) -> list[int]:
        """Kill every process whose command line names this agent's state directory (its engine
        processes, recorded or not), so that nothing outlives a test or a benchmark whatever went
        wrong; returns their pids."""
        return kill_marked(str(self.state_dir))
