"""Models tab commands against real agents and the Hub stand-in: one hub download then LAN
copies, refusals before anything is fetched, cancel, a dashboard restart mid-download,
serving on one node, deletion refused while in use, and Prepare falling back to the hub."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from orchestrator.control.core import Orchestrator
from orchestrator.control.launcher import Timeouts
from orchestrator.control.rules.commands import CommandRefused
from orchestrator.control.rules.download_state import HubRef
from orchestrator.control.rules.state import Settings, State
from orchestrator.proc import wait_until
from orchestrator.registrar import ConfigFileRegistrar
from tests.support.agents import AgentProc
from tests.support.hub import HubStandIn, Repo, repo_from_dir

REPO = "org/tiny"


@dataclass
class HubEnv:
    hub: HubStandIn
    agents: list[AgentProc]
    orch: Orchestrator
    make: object
    router_yaml: Path

    def node(self, i: int) -> str:
        return self.agents[i].client.identity().fingerprint


@pytest.fixture(scope="module")
def transfer_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~19 MB: a download slow enough to interrupt at the stand-in's throttled rate."""
    from orchestrator.testmodels.llama import make_test_model

    return make_test_model(tmp_path_factory.mktemp("hubmodel") / "model", layers=8, hidden=256, shards=2)


@pytest.fixture
def henv(spawn_agent, start_router, test_model_dir: Path, transfer_model: Path, tmp_path: Path) -> Iterator[HubEnv]:
    files = repo_from_dir(test_model_dir).files
    hub = HubStandIn({REPO: repo_from_dir(test_model_dir), "org/big": repo_from_dir(transfer_model),
                      "org/gated": repo_from_dir(test_model_dir, "g", gated=True, token="hf_x"),
                      "org/gguf": Repo(files={"config.json": files["config.json"], "model.gguf": b"GGUF" * 100},
                                       commit="2" * 40)}).start()
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}
    agents = [spawn_agent(name, env=env) for name in ("node-a", "node-b", "node-c")]
    router_yaml = tmp_path / "router.yaml"
    router_yaml.write_text(yaml.safe_dump({"backends": [], "health_checks": {"enabled": True, "interval": "0.5s",
                                                                            "timeout": "1s"}}))
    router = start_router(router_yaml)
    made: list[Orchestrator] = []

    def make() -> Orchestrator:
        o = Orchestrator(tmp_path / "state", ConfigFileRegistrar(router_yaml, router.url),
                         timeouts=Timeouts(listen=60, healthy=60, stop=5),
                         lease_s=6.0, agent_timeout=5.0).start()
        made.append(o)
        return o

    orch = make()
    orch.update_settings(Settings(distributed_enabled=True, port_start=min(a.transport[0] for a in agents),
                                  port_end=max(a.transport[1] for a in agents)))
    for a in agents:
        orch.register_node(a.url, a.token)
    yield HubEnv(hub, agents, orch, make, router_yaml)
    for o in made:
        for s in o.state.sessions:
            try:
                o.stop_session(s.id)
            except CommandRefused:
                pass
        o.stop()
    hub.close()


def finished(model_id: str):
    return lambda st: any(d.model_id == model_id and d.finished for d in st.downloads)


def download_of(state: State, model_id: str):
    return next(d for d in state.downloads if d.model_id == model_id)


def test_one_hub_download_then_lan_copies_to_the_other_nodes(henv: HubEnv, test_model_dir: Path):
    nodes = [henv.node(i) for i in range(3)]
    listing = henv.orch.models.hub_files(REPO, "main", nodes[0])
    assert listing.mlx and listing.total_bytes > 0
    henv.orch.models.download(REPO, "", nodes)
    state = henv.orch.wait(finished("tiny"), 90)
    dl = download_of(state, "tiny")
    assert dl.phase == "done", dl
    assert [n.status for n in dl.nodes] == ["verified"] * 3
    assert dl.nodes[0].source == f"hub {REPO}" and all(n.source == "LAN from node-a" for n in dl.nodes[1:])
    commit = henv.hub.repos[REPO].commit
    assert len(henv.hub.gets(REPO, f"{commit}/model.safetensors")) == 1  # the hub was asked once
    for a in henv.agents:
        assert (a.models_dir / "tiny" / "model.safetensors").read_bytes() == \
            (test_model_dir / "model.safetensors").read_bytes()
    # a second download of the same name is refused: the nodes have it
    with pytest.raises(CommandRefused, match="already has a model named tiny"):
        henv.orch.models.download(REPO, "", nodes[:1])


def test_refusals_come_before_anything_is_fetched(henv: HubEnv):
    n = henv.node(0)
    for repo, words in (("org/gated", "gated repository"), ("org/gguf", "not an MLX model: GGUF"),
                        ("org/absent", "no repository org/absent"), ("not a repo", "expected org/name")):
        with pytest.raises(CommandRefused, match=words):
            henv.orch.models.download(repo, "", [n])
    henv.orch.watcher.report_every = 1e9  # no fresh report may replace the small disk set below
    node = henv.orch.state.node(n)  # a node whose disk is (reported) too small
    small = node.model_copy(update={"report": node.report.model_copy(update={"disk_free_bytes": 1000})})

    def small_disk_kept() -> bool:  # a report already in flight may still land once: set it again after it
        if henv.orch.state.node(n).report.disk_free_bytes != 1000:
            henv.orch._state = henv.orch.state.model_copy(update={"nodes": (small,) + henv.orch.state.nodes[1:]})
            return False
        return True
    wait_until(small_disk_kept, 30, interval=1.0, message="the small disk to stay set")
    with pytest.raises(CommandRefused, match="not enough disk space on node-a"):
        henv.orch.models.download(REPO, "", [n])
    assert not any(m == "GET" and "/resolve/" in p and p.endswith(".safetensors") for m, p, _ in henv.hub.requests)
    assert henv.orch.state.downloads == ()


def test_cancel_then_a_dashboard_restart_resumes_a_running_download(henv: HubEnv, transfer_model: Path):
    nodes = [henv.node(0), henv.node(1)]
    henv.hub.rate_bps = 2e6
    henv.orch.models.download("org/big", "", nodes, model_id="big")
    henv.orch.wait(lambda st: download_of(st, "big").nodes[0].done_bytes > 1_000_000, 60)
    henv.orch.stop()  # the dashboard goes away mid-download; the agent keeps downloading
    henv.hub.rate_bps = None
    again = henv.make()
    state = again.wait(finished("big"), 120)
    assert download_of(state, "big").phase == "done", download_of(state, "big")
    assert (henv.agents[1].models_dir / "big").is_dir()

    henv.hub.rate_bps = 1e6
    henv.orch = again
    again.models.download("org/big", "", [henv.node(2)], model_id="big2")
    again.wait(lambda st: download_of(st, "big2").nodes[0].done_bytes > 500_000, 60)
    again.models.cancel("big2")
    state = again.wait(finished("big2"), 30)
    assert download_of(state, "big2").phase == "cancelled"
    assert not (henv.agents[2].models_dir / "big2").exists()
    assert not (henv.agents[2].models_dir / ".partial" / "big2").exists()


def test_a_download_survives_its_agent_restarting(henv: HubEnv, transfer_model: Path):
    """The worker waits for the agent to come back, fetches again, and the agent resumes."""
    n = henv.node(1)
    henv.hub.rate_bps = 2e6
    henv.orch.models.download("org/big", "", [n], model_id="big")
    henv.orch.wait(lambda st: download_of(st, "big").nodes[0].done_bytes > 2_000_000, 60)
    agent = henv.agents[1]
    agent.stop()
    henv.orch.wait(lambda st: "unreachable" in download_of(st, "big").nodes[0].detail, 30)
    henv.hub.rate_bps = None
    agent.restart()
    state = henv.orch.wait(finished("big"), 120)
    dl = download_of(state, "big")
    assert dl.phase == "done" and dl.nodes[0].status == "verified", dl
    ranged = [r for m, p, r in henv.hub.requests if m == "GET" and p.endswith(".safetensors") and r]
    assert ranged, "the restarted agent resumed its partial file with a Range request"
    assert (agent.models_dir / "big" / "model-00001-of-00002.safetensors").is_file()


def test_serve_on_one_node_chat_stop_and_delete(henv: HubEnv):
    n = henv.node(1)
    henv.orch.models.download(REPO, "", [n])
    henv.orch.wait(finished("tiny"), 60)
    henv.orch.wait(lambda st: any(m.id == "tiny" for m in st.node(n).report.models), 15)
    s = henv.orch.models.serve("tiny", n)
    assert not s.cluster and len(s.stages) == 1
    state = henv.orch.wait(lambda st: st.session(s.id).health in ("Healthy", "Stopped"), 120)
    assert state.session(s.id).health == "Healthy", state.session(s.id)
    r = requests.post(s.url + "/v1/chat/completions", json={"model": "tiny", "max_tokens": 4,
                                                           "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"] is not None
    assert s.name in (yaml.safe_load(henv.router_yaml.read_text()) or {}).get("backends", [{}])[0].get("name", "")
    with pytest.raises(CommandRefused, match="used by session"):
        henv.orch.models.delete("tiny", n)
    henv.orch.stop_session(s.id)
    henv.orch.wait(lambda st: st.session(s.id).phase in ("stopped", "failed"), 60)
    henv.orch.models.delete("tiny", n)
    assert not (henv.agents[1].models_dir / "tiny").exists()
    henv.orch.wait(lambda st: all(m.id != "tiny" for m in st.node(n).report.models), 10)


def test_prepare_downloads_from_the_hub_once_when_no_node_has_the_model(henv: HubEnv):
    nodes = [henv.node(0), henv.node(2)]
    henv.orch.prepare("tiny", nodes, hub=HubRef(repo_id=REPO))
    state = henv.orch.wait(lambda st: st.preparation is not None and st.preparation.finished, 90)
    assert state.preparation.ready, state.preparation
    rows = {r.node_id: r for r in state.preparation.nodes}
    assert rows[nodes[0]].source == f"hub {REPO}" and rows[nodes[1]].source == "node-a"
    commit = henv.hub.repos[REPO].commit
    assert len(henv.hub.gets(REPO, f"{commit}/model.safetensors")) == 1
    shutil.rmtree(henv.agents[2].models_dir / "tiny")  # without the hub, a missing model is still refused
    henv.orch.prepare("absent", nodes)
    state = henv.orch.wait(lambda st: st.preparation.model_id == "absent" and st.preparation.finished, 30)
    assert "no registered node has model 'absent'" in state.preparation.error
