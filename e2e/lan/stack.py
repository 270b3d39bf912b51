"""The dashboard stack on the emulated LAN: one node agent per node namespace (its stages
run there too), the router and the dashboard in the control namespace (zeroconf discovery
on the bridge). Like orchestrator.demo_stack, but every process lives at its own IP.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from e2e.lan.netns import REPO, Lan, LanHost, joined
from orchestrator.agent.local_agent import SHARED_HOST_BLAS
from orchestrator.demo_stack import DEFAULT_BUDGET, MODEL_ID
from orchestrator.proc.child import ChildError, ChildProcess

AGENT_PORT = 39500
TRANSPORT = (39600, 39629)  # every node has its own IP, so each may use the whole range
DASHBOARD_PORT, ROUTER_PORT = 8080, 8000
STARTUP_TIMEOUT = 60.0


class StackError(RuntimeError):
    """A process did not come up; the message has its output."""


@dataclass
class LanStack:
    """Agents on `lan.nodes`, router and dashboard on `lan.control`."""

    lan: Lan
    root: Path
    budget: str = DEFAULT_BUDGET
    procs: list[ChildProcess] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)  # node name -> pairing token
    admin_token: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.lan.control.ip}:{DASHBOARD_PORT}"  # type: ignore[union-attr]

    @property
    def router_url(self) -> str:
        return f"http://{self.lan.control.ip}:{ROUTER_PORT}"  # type: ignore[union-attr]

    def address(self, node: LanHost) -> str:
        return f"{node.ip}:{AGENT_PORT}"

    def models_dir(self, node: LanHost) -> Path:
        return self.root / node.name / "models"

    def _spawn(self, host: LanHost, name: str, *argv: str) -> ChildProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **SHARED_HOST_BLAS, "PYTHONPATH": str(REPO)}
        proc = ChildProcess.spawn(name, host.argv(sys.executable, "-m", "orchestrator.cli", *argv),
                                  self.root / "logs" / f"{name}.log", env=env, cwd=REPO)
        self.procs.append(proc)
        return proc

    def start(self, model_src: Path, model_on: tuple[int, ...] = (0,)) -> "LanStack":
        """Put the model on the nodes `model_on` (indexes), start everything, wait for tokens and answers."""
        for node in self.lan.nodes:
            self.models_dir(node).mkdir(parents=True, exist_ok=True)
        for i in model_on:
            shutil.copytree(model_src, self.models_dir(self.lan.nodes[i]) / MODEL_ID)
        router_yaml = self.root / "router.yaml"
        router_yaml.write_text("backends: []\nhealth_checks: {enabled: true, interval: 1s, timeout: 2s, "
                               "unhealthy_threshold: 1, healthy_threshold: 1, endpoint: /v1/models}\n")
        agents = [self._spawn(n, n.name, "agent", "--host", n.ip, "--port", str(AGENT_PORT), "--name", n.name,
                              "--models-dir", str(self.models_dir(n)), "--state-dir", str(self.root / n.name / "state"),
                              "--transport-ports", f"{TRANSPORT[0]}-{TRANSPORT[1]}", "--memory-budget", self.budget)
                  for n in self.lan.nodes]
        c = self.lan.control
        assert c is not None
        self._spawn(c, "router", "router", "--config", str(router_yaml), "--host", c.ip, "--port", str(ROUTER_PORT),
                    "--reload-interval", "0.2")
        dash = self._spawn(c, "dashboard", "dashboard", "--host", c.ip, "--port", str(DASHBOARD_PORT), "--state-dir",
                           str(self.root / "dashboard"), "--router", self.router_url, "--router-config",
                           str(router_yaml), "--discovery", "--discovery-interface", c.ip)
        # Each prints its token before it binds its port: wait for the listening line too (pairing
        # right after the token once met a refused connection).
        for node, proc in zip(self.lan.nodes, agents):
            self.tokens[node.name] = self._wait(proc, r"pairing token: (\S+)")
            self._wait(proc, r"agent\.listening (url)=")
        self.admin_token = self._wait(dash, r"admin token: (\S+)")
        self._wait(dash, r"dashboard\.listening (url)=")
        return self

    @staticmethod
    def _wait(proc: ChildProcess, pattern: str) -> str:
        try:
            return proc.wait_ready(lambda: proc.printed(pattern), f"printing {pattern!r}", STARTUP_TIMEOUT, 0.1)
        except ChildError as exc:
            raise StackError(str(exc)) from None

    def logs(self, tail: int = 30) -> str:
        return "\n".join(f"----- {p.name} -----\n{p.output(tail)}" for p in self.procs)

    def stop(self) -> None:
        """SIGTERM the dashboard, the agents (they stop their stages) and the router together; then
        wait for each, SIGKILL what is left."""
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.stop(20)
            except ChildError as exc:
                print(f"LAN stack: {exc}")


@contextmanager
def running_lan_stack(lan: Lan, root: Path, model_src: Path, model_on: tuple[int, ...] = (0,)) -> Iterator[LanStack]:
    """A started `LanStack`, with this thread (its HTTP requests, a browser it starts) joined to
    the control namespace. Fails the test when the stack does not start; stops it and prints
    its logs (shown by pytest when something failed) on the way out."""
    stack = LanStack(lan, root)
    try:
        stack.start(model_src, model_on)
        with joined(lan.control):
            yield stack
    except StackError as exc:
        pytest.fail(f"the LAN stack did not start: {exc}", pytrace=False)
    finally:
        stack.stop()
        print(stack.logs())
