"""A router as a child process of this machine: the demo's router, the tests' routers and the
benchmarks' stack all start `pipeserve router` through `LocalRouter` (docs/architecture.md,
"A process of the machine").

It listens on 127.0.0.1 over a config file that its caller writes (and edits: the router
reloads it), and is ready once its `/health` answers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import requests

from orchestrator import settings
from orchestrator.proc import ChildProcess

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@dataclass(eq=False)
class LocalRouter:
    """One `pipeserve router` process on 127.0.0.1."""

    config_path: Path
    port: int
    log_path: Path
    reload_interval: float = 0.2  # seconds between looks at the config file
    env: dict[str, str] = field(default_factory=dict)  # over this process's, with PYTHONUNBUFFERED
    die_with_parent: bool = False  # see ChildProcess.spawn
    python: str = sys.executable
    proc: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        """The command line of `pipeserve router` for this router."""
        return [self.python, "-m", "orchestrator.cli", "router", "--config", str(self.config_path),
                "--port", str(self.port), "--reload-interval", f"{self.reload_interval:g}"]

    def launch(self) -> "LocalRouter":
        """Start the process without waiting for it; its output is appended to `log_path`."""
        self.proc = ChildProcess.spawn("router", self.argv(), self.log_path, append=True,
                                       die_with_parent=self.die_with_parent,
                                       env={**settings.process_environment(), "PYTHONUNBUFFERED": "1", **self.env})
        return self

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> "LocalRouter":
        """Wait until `/health` answers 200. ChildError with its output if it exits or times out."""
        assert self.proc is not None, "launch() first"
        self.proc.wait_ready(lambda: requests.get(self.url + "/health", timeout=1).status_code == 200,
                             "an answer on " + self.url + "/health", timeout, ignore=(requests.RequestException,))
        return self

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> "LocalRouter":
        """`launch` and `wait_ready`; a router that does not come up is stopped before the error."""
        self.launch()
        try:
            return self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def output(self, tail: int = 200) -> str:
        """The last lines the router printed."""
        return self.proc.output(tail) if self.proc is not None else "(no output)"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, SIGKILL after `timeout`; nothing if it never started or already exited."""
        if self.proc is not None:
            self.proc.stop(timeout)
