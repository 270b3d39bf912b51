"""Real `pipeserve agent` subprocesses for tests, on free ports; shared by every test package.

The process itself is the product's `LocalAgent` (the demo's and the benchmarks' too); a test
agent adds a paired client. A helper that cannot get its agent up fails the test at once with
the agent's own output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.agent.client import AgentClient
from orchestrator.agent.local_agent import LocalAgent
from orchestrator.proc import ChildError

STARTUP_TIMEOUT = 20.0


@dataclass(eq=False)
class AgentProc(LocalAgent):
    """A running agent subprocess and a client paired with it (label "tests")."""

    client: AgentClient = field(init=False)

    def port_at(self, i: int) -> int:
        """The i-th port of this agent's transport range."""
        assert self.transport[0] + i <= self.transport[1]
        return self.transport[0] + i

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT, pair: bool = True) -> "AgentProc":
        """Wait for the identity probe; on the first start make the client (paired unless `pair`
        is false). Fails the test with the agent's output if it dies or does not answer."""
        try:
            super().wait_ready(timeout)
        except ChildError as exc:
            pytest.fail(str(exc), pytrace=False)
        if self.starts == 1:
            assert self.token, f"agent {self.name} printed no pairing token:\n{self.output()}"
            self.client = AgentClient(self.url)
            if pair:
                self.client.pair(self.token, "tests")
        return self

    def restart(self) -> "AgentProc":
        """Start again on the same port and directories; the client keeps its credential."""
        return self.launch().wait_ready()


def gone(pid: int) -> bool:
    """Whether process `pid` has ended: no such process, or a zombie nobody has reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
