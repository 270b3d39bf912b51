"""Three real agents, a router and a control plane for the recovery tests that move or copy a stage
(tests/control/test_recovery_move.py, test_recovery_copy.py), and the looks they take."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Iterator

import yaml

from orchestrator.control.core import Orchestrator
from orchestrator.control.launcher import Timeouts
from orchestrator.control.rules.state import Settings
from orchestrator.registrar import ConfigFileRegistrar
from tests.control.conftest import MODEL_ID, Env

RECOVERY_TIMEOUT = 180.0


def three_agents(spawn_agent, start_router, test_model_dir: Path, tmp_path: Path,
                 args: dict[str, tuple[str, ...]], holding: tuple[str, ...]) -> Iterator[Env]:
    """node-a, node-b (the cluster) and node-c (spare), each with `args[name]`; `holding` have the model."""
    agents = [spawn_agent(name, *args.get(name, ())) for name in ("node-a", "node-b", "node-c")]
    for a in agents:
        if a.name in holding:
            shutil.copytree(test_model_dir, a.models_dir / MODEL_ID)
    router_yaml = tmp_path / "router.yaml"
    router_yaml.write_text(yaml.safe_dump({"backends": [], "health_checks": {"enabled": True, "interval": "0.5s",
                                                                            "timeout": "1s"}}))
    router = start_router(router_yaml)
    orch = Orchestrator(tmp_path / "state", ConfigFileRegistrar(router_yaml, router.url),
                        timeouts=Timeouts(listen=90, healthy=90, stop=5), lease_s=6.0, agent_timeout=3.0).start()
    orch.update_settings(Settings(distributed_enabled=True, port_start=min(a.port_at(0) for a in agents),
                                  port_end=max(a.port_at(3) for a in agents)))
    for a in agents:
        orch.register_node(a.url, a.token)
    yield Env(agents, router, router_yaml, tmp_path / "state", orch, lambda **kw: orch)
    orch.stop()


def pids(env: Env, session_id: str, agents: list[int]) -> dict[str, tuple[str, int]]:
    """(node, pid) of each live engine process of the session on the given agents, by its name."""
    return {p.node_id: (env.agents[i].name, p.pid) for i in agents for p in env.agents[i].client.processes()
            if p.cluster_id == session_id and p.alive}


def vanish(env: Env, i: int) -> None:
    """Node i is gone: its agent and its engine processes are killed at once (a machine lost)."""
    agent = env.agents[i]
    agent.stop(signal.SIGKILL)
    agent.kill_engine_leftovers()


def ended(env: Env, session_id: str, timeout: float = RECOVERY_TIMEOUT):
    """Wait for the fault, then for its outcome; returns the session (live or in the history)."""
    env.orch.wait(lambda st: (s := st.session(session_id)) is not None and len(s.faults) >= 1, timeout)
    st = env.orch.wait(lambda st: (s := st.session(session_id)) is None or (
        s.phase != "recovering" and s.faults[-1].outcome != "recovering"), timeout)
    return st.session(session_id) or next(s for s in st.history if s.id == session_id)
