"""A headless pipeserve stack for the recovery benchmark and the chaos run (scripts, not tests).

Node agents and `pipeserve router` run as processes of their own (own process groups, logs
under the run directory); the control plane runs in this process as the dashboard runs it,
an `Orchestrator` over a state directory, so that "the dashboard dies and comes back" is
`restart_control_plane()`. The SmolLM2 demo model is placed on every node before the run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

from orchestrator.control.core import Orchestrator
from orchestrator.control.launcher import Timeouts
from orchestrator.control.state import Session, Settings
from orchestrator.demo_stack import SHARED_HOST_BLAS
from orchestrator.registrar import ConfigFileRegistrar

MODEL_ID = "SmolLM2-135M-Instruct"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_block(size: int) -> tuple[int, int]:
    """`size` consecutive free ports (first, last)."""
    for _ in range(200):
        start = free_port()
        if start + size > 65000:
            continue
        try:
            socks = []
            for p in range(start, start + size):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return start, start + size - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


@dataclass
class Agent:
    """One node agent process."""

    name: str
    root: Path
    port: int
    transport: tuple[int, int]
    proc: subprocess.Popen | None = None
    token: str = ""
    node_id: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, env: dict[str, str]) -> "Agent":
        """Start (or restart: same state directory, so the same identity and credentials)."""
        (self.root / "models").mkdir(parents=True, exist_ok=True)
        log = self.root / "agent.log"
        argv = [sys.executable, "-m", "orchestrator.cli", "agent", "--host", "127.0.0.1", "--port", str(self.port),
                "--name", self.name, "--models-dir", str(self.root / "models"), "--state-dir", str(self.root / "state"),
                "--transport-ports", f"{self.transport[0]}-{self.transport[1]}", "--no-advertise"]
        offset = log.stat().st_size if log.exists() else 0
        self.proc = subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = log.read_bytes()[offset:].decode(errors="replace")
            token = re.search(r"pairing token: (\S+)", text)
            if token:
                self.token = token.group(1)
            try:
                if requests.get(self.url + "/v1/identity", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.name} exited: {text[-2000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"agent {self.name} did not answer")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        """SIGTERM (the agent stops its engine processes), SIGKILL after 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(5)


@dataclass
class Stack:
    """Agents, router and an in-process control plane over `root`."""

    root: Path
    agents: list[Agent] = field(default_factory=list)
    router: subprocess.Popen | None = None
    router_port: int = 0
    orch: Orchestrator | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def router_yaml(self) -> Path:
        return self.root / "router.yaml"

    def start(self, model_dir: Path, nodes: int = 2, env: dict[str, str] | None = None) -> "Stack":
        # Every "node" is this one machine, as in the demo and the tests' agents: a stage gets
        # one BLAS thread (all cores when nothing else is in flight). Without it each stage's
        # OpenBLAS spreads every GEMM over all cores that the other stage (and any other load)
        # also wants, and a fresh stage's probe steps took 5-10x longer (README, recovery).
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **SHARED_HOST_BLAS, **(env or {})}
        first, _ = free_block(10 * nodes)
        for i in range(nodes):
            a = Agent(f"node-{'abcdefgh'[i]}", self.root / f"node-{i}", free_port(),
                      (first + 10 * i, first + 10 * i + 9))
            (a.root / "models").mkdir(parents=True, exist_ok=True)
            shutil.copytree(model_dir, a.root / "models" / MODEL_ID, dirs_exist_ok=True)
            self.agents.append(a.start(self.env))
        self.router_yaml.write_text(yaml.safe_dump({"backends": [], "health_checks": {
            "enabled": True, "interval": "0.5s", "timeout": "1s", "unhealthy_threshold": 1, "healthy_threshold": 1}}))
        self.router_port = free_port()
        self.router = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "router", "--config",
                                        str(self.router_yaml), "--port", str(self.router_port),
                                        "--reload-interval", "0.2"],
                                       stdout=(self.root / "router.log").open("ab"), stderr=subprocess.STDOUT,
                                       env=self.env, start_new_session=True)
        self.orch = self._control_plane()
        self.orch.update_settings(Settings(distributed_enabled=True, port_start=first, port_end=first + 10 * nodes - 1))
        for a in self.agents:
            a.node_id = self.orch.register_node(a.url, a.token).id
        ids = [a.node_id for a in self.agents]
        self.orch.prepare(MODEL_ID, ids)
        self.orch.wait(lambda st: st.preparation is not None and st.preparation.finished, 300)
        assert self.orch.state.preparation.ready, self.orch.state.preparation
        return self

    def _control_plane(self) -> Orchestrator:
        return Orchestrator(self.root / "dashboard", ConfigFileRegistrar(self.router_yaml),
                            timeouts=Timeouts(listen=120, healthy=120, stop=5)).start()

    def restart_control_plane(self) -> Orchestrator:
        """The dashboard goes away and comes back over the same state directory."""
        self.orch.stop()
        self.orch = self._control_plane()
        return self.orch

    def launch(self) -> Session:
        """A two-stage cluster over the first two nodes (coordinator on the first)."""
        return self.orch.launch_cluster(MODEL_ID, [a.node_id for a in self.agents[:2]], context_length=2048)

    def wait_healthy(self, session_id: str, timeout: float = 300) -> Session:
        st = self.orch.wait(lambda st: (s := st.session(session_id)) is None or
                            (s.phase == "running" and s.health == "Healthy") or s.phase in ("stopped", "failed"),
                            timeout)
        return st.session(session_id)

    def processes(self, session_id: str) -> dict[str, int]:
        """Live engine processes of a session: name -> pid (as its agents report them)."""
        out = {}
        for a in self.agents:
            try:
                r = requests.get(a.url + "/v1/processes", timeout=5,
                                 headers={"Authorization": f"Bearer {self.orch.state.node(a.node_id).credential}"})
                for p in r.json()["processes"]:
                    if p["cluster_id"] == session_id and p["alive"]:
                        out[p["node_id"]] = p["pid"]
            except (requests.RequestException, ValueError, KeyError):
                pass
        return out

    def router_models(self) -> list[str]:
        try:
            r = requests.get(self.router_url + "/v1/models", timeout=2)
            return [m["id"] for m in r.json().get("data", [])] if r.status_code == 200 else []
        except requests.RequestException:
            return []

    def stop(self) -> None:
        if self.orch is not None:
            for s in self.orch.state.sessions:
                try:
                    self.orch.stop_session(s.id)
                except Exception:  # noqa: BLE001 (best effort on the way out)
                    pass
            try:
                self.orch.wait(lambda st: not st.sessions, 60)
            except TimeoutError:
                pass
            self.orch.stop()
        for a in self.agents:
            a.stop()
        if self.router is not None:
            self.router.terminate()
            self.router.wait(10)
