"""A pipeline on the emulated LAN (e2e/lan/netns.py): stage k in node k's namespace, the coordinator
on node 0, so every stage boundary and the return path cross the link profile. Needs root, like the
LAN benchmark. Drive it from inside `joined(lan.control)` (its HTTP address is on the bridge)."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import requests

from e2e.bench.client import get_json
from e2e.lan.netns import REPO, Lan
from orchestrator import settings
from orchestrator.engine.local_pipeline import write_config
from orchestrator.proc.child import ChildProcess, stop_all

STARTUP_TIMEOUT_S = 240.0  # a shared 2-core machine starting several pipelines at once


class LanPipelineSystem:
    """One pipeline across `lan.nodes` (as many nodes as stages), on ports from `port_base` up."""

    def __init__(self, lan: Lan, model_dir: Path, workdir: Path, splits: list[tuple[int, int]], solo_threads: int,
                 env: dict[str, str], model_name: str, cluster: dict[str, object], port_base: int) -> None:
        if len(lan.nodes) < len(splits):
            raise ValueError(f"{len(splits)} stages need {len(splits)} LAN nodes, not {len(lan.nodes)}")
        workdir.mkdir(parents=True, exist_ok=True)
        nodes = [lan.nodes[0], *lan.nodes[:len(splits)]]  # the coordinator beside stage 0
        self.host, self.port = nodes[0].ip, port_base + len(nodes)
        config = write_config(workdir / "cluster.toml", "bench-lan", splits, [port_base + i for i in range(len(nodes))],
                              host=[n.ip for n in nodes], **cluster)
        child_env = {**settings.process_environment(), **env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
                     settings.CLUSTER_SECRET.name: secrets.token_hex(16)}
        self.children: list[ChildProcess] = []
        try:
            for k, node in enumerate(nodes[1:]):
                self._spawn(node, f"stage-{k}", workdir, child_env,
                            "stage", "--config", str(config), "--node-id", f"stage-{k}", "--model", str(model_dir),
                            "--threads", "1", "--solo-threads", str(solo_threads))
            coordinator = self._spawn(nodes[0], "coordinator", workdir, child_env,
                                      "coordinator", "--config", str(config), "--node-id", "coordinator",
                                      "--model", str(model_dir), "--host", self.host, "--port", str(self.port),
                                      "--model-name", model_name)
            coordinator.wait_ready(lambda: get_json(self.port, "/health", self.host).get("ready"),
                                   "a ready /health", STARTUP_TIMEOUT_S, interval=0.5,
                                   ignore=(OSError, ValueError, requests.RequestException))
        except BaseException:
            self.stop()
            raise

    def _spawn(self, node, name: str, workdir: Path, env: dict[str, str], *argv: str) -> ChildProcess:
        child = ChildProcess.spawn(name, node.argv(sys.executable, "-m", "orchestrator.cli", *argv),
                                   workdir / f"{name}.log", env=env, cwd=REPO)
        self.children.append(child)
        return child

    def health(self) -> dict:
        """The coordinator's GET /health document."""
        return get_json(self.port, "/health", self.host)

    def stop(self) -> None:
        """Stop the coordinator and the stages."""
        stop_all(reversed(self.children))
