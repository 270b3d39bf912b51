"""Control-plane fixtures: two real agents holding a test model, a real router, an Orchestrator."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml

from orchestrator.control.core import Orchestrator, new_session_id
from orchestrator.control.launcher import Timeouts
from orchestrator.control.rules.state import Session, Settings, StagePlacement
from orchestrator.registrar import ConfigFileRegistrar
from tests.support.agents import AgentProc
from tests.support.router import RouterProc

MODEL_ID = "tiny"


@dataclass
class Env:
    """Everything a control-plane test needs, all real processes."""

    agents: list[AgentProc]
    router: RouterProc
    router_yaml: Path
    state_dir: Path
    orch: Orchestrator
    make_orchestrator: Callable[..., Orchestrator]

    def node_id(self, i: int) -> str:
        return self.agents[i].client.identity().fingerprint

    def session(self, splits: list[tuple[int, int]] = ((0, 1), (2, 3)), name: str = "tiny-cluster") -> Session:
        """Stage k on agent k (stage ports from each agent's transport range), coordinator on agent 0."""
        stages = tuple(StagePlacement(index=k, node_id=self.node_id(k), node_name=self.agents[k].name,
                                      first_layer=a, last_layer=b, host="127.0.0.1",
                                      port=self.agents[k].port_at(0)) for k, (a, b) in enumerate(splits))
        return Session(id=new_session_id(), name=name, model_id=MODEL_ID, model_name=MODEL_ID, cluster=len(stages) > 1,
                       stages=stages, coordinator_node=self.node_id(0), coordinator_host="127.0.0.1",
                       coordinator_port=self.agents[0].port_at(1))

    def backends(self) -> list[str]:
        doc = yaml.safe_load(self.router_yaml.read_text()) or {}
        return [b["name"] for b in doc.get("backends") or []]

    def engine_processes(self) -> list[str]:
        """Live engine processes on every agent (what must be zero after a failure)."""
        return [f"{a.name}:{p.cluster_id}/{p.node_id}" for a in self.agents for p in a.client.processes() if p.alive]


@pytest.fixture
def env(spawn_agent, start_router, test_model_dir: Path, tmp_path: Path) -> Iterator[Env]:
    agents = [spawn_agent(name) for name in ("node-a", "node-b")]
    for a in agents:
        shutil.copytree(test_model_dir, a.models_dir / MODEL_ID)
    router_yaml = tmp_path / "router.yaml"
    router_yaml.write_text(yaml.safe_dump({"backends": [], "health_checks": {"enabled": True, "interval": "0.5s",
                                                                            "timeout": "1s"}}))
    router = start_router(router_yaml)
    made: list[Orchestrator] = []

    def make(**kw) -> Orchestrator:
        kw.setdefault("timeouts", Timeouts(listen=60, healthy=60, stop=5))
        kw.setdefault("lease_s", 6.0)
        kw.setdefault("agent_timeout", 5.0)
        o = Orchestrator(tmp_path / "state", kw.pop("registrar", ConfigFileRegistrar(router_yaml, router.url)),
                         **kw).start()
        made.append(o)
        return o

    orch = make()
    # The dashboard's transport range must cover the ports the test agents were given.
    orch.update_settings(Settings(distributed_enabled=True, port_start=min(a.transport[0] for a in agents),
                                  port_end=max(a.transport[1] for a in agents)))
    for a in agents:
        orch.register_node(a.url, a.token)
    yield Env(agents, router, router_yaml, tmp_path / "state", orch, make)
    for o in made:
        o.stop()
