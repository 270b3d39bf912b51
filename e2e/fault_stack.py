"""A headless pipeserve stack for the recovery benchmark and the chaos run (scripts, not tests).

Node agents and `pipeserve router` run as processes of their own (own process groups, logs
under the run directory); the control plane runs in this process as the dashboard runs it,
an `Orchestrator` over a state directory, so that "the dashboard dies and comes back" is
`restart_control_plane()`. The SmolLM2 demo model is placed on every node before the run.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

from orchestrator.agent.local_agent import LocalAgent
from orchestrator.control.core import Orchestrator
from orchestrator.control.launcher import Timeouts
from orchestrator.control.rules.state import Session, Settings
from orchestrator.demo_stack import MODEL_ID
from orchestrator.proc import free_port, free_port_block
from orchestrator.registrar import ConfigFileRegistrar
from orchestrator.router.local import LocalRouter

AGENT_STARTUP_TIMEOUT_S = 60.0


@dataclass(eq=False)
class StackAgent(LocalAgent):
    """A node agent of the stack, and its node id once the control plane has registered it."""

    node_id: str = ""


@dataclass
class Stack:
    """Agents, router and an in-process control plane over `root`."""

    root: Path
    agents: list[StackAgent] = field(default_factory=list)
    router: LocalRouter | None = None
    orch: Orchestrator | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def router_url(self) -> str:
        assert self.router is not None, "start() first"
        return self.router.url

    @property
    def router_yaml(self) -> Path:
        return self.root / "router.yaml"

    def start(self, model_dir: Path, nodes: int = 2, env: dict[str, str] | None = None) -> "Stack":
        """Start `nodes` agents holding the model in `model_dir`, and the router; register the
        agents and prepare the model on all of them. `env` goes to every process on top of
        LocalAgent's (which gives each stage one BLAS thread: every "node" is this machine, and a
        fresh stage's probe steps took 5-10x longer with each OpenBLAS using every core)."""
        self.env = {**(env or {})}
        first, _ = free_port_block(10 * nodes)
        for i in range(nodes):
            a = StackAgent(f"node-{'abcdefgh'[i]}", self.root / f"node-{i}", free_port(),
                           (first + 10 * i, first + 10 * i + 9), args=["--no-advertise"], env=self.env)
            a.models_dir.mkdir(parents=True, exist_ok=True)
            shutil.copytree(model_dir, a.models_dir / MODEL_ID, dirs_exist_ok=True)
            self.agents.append(a.start(AGENT_STARTUP_TIMEOUT_S))
        self.router_yaml.write_text(yaml.safe_dump({"backends": [], "health_checks": {
            "enabled": True, "interval": "0.5s", "timeout": "1s", "unhealthy_threshold": 1, "healthy_threshold": 1}}))
        self.router = LocalRouter(self.router_yaml, free_port(), self.root / "router.log", env=self.env).start()
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
        return Orchestrator(self.root / "dashboard", ConfigFileRegistrar(self.router_yaml, self.router_url),
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
            self.router.stop(10)
