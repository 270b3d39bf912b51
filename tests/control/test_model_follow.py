"""LAN copies that follow the hub download file by file, with real agents and the Hub stand-in.

The stand-in holds the last shard half sent until the test releases it, so the hub node is
caught mid-download: the copying nodes must already hold the shards verified before it, the
hub node must offer (and serve) those and never the half-downloaded one, and the end result
on every node is the verified, identical model. A hub failure stops every copy with the hub's
reason; a cancel stops all of them. The slow test measures how much sooner the last node is
done than when the copies wait for the whole hub download (printed, never asserted).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from orchestrator.control.core import Orchestrator
from orchestrator.control.launcher import Timeouts
from orchestrator.control.rules.state import State
from orchestrator.proc import wait_until
from orchestrator.registrar import ConfigFileRegistrar
from tests.support.agents import AgentProc
from tests.support.hub import HubStandIn, repo_from_dir

REPO = "org/shards"
FIRST, HELD = "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"


@pytest.fixture(scope="module")
def sharded_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~19 MB in three shards (7.6, 7.1 and 4.7 MB) plus config and tokenizer files."""
    from orchestrator.testmodels.llama import make_test_model

    return make_test_model(tmp_path_factory.mktemp("shards") / "model", layers=8, hidden=256, shards=3)


@dataclass
class FollowEnv:
    hub: HubStandIn
    agents: list[AgentProc]
    orch: Orchestrator

    def node(self, i: int) -> str:
        return self.agents[i].client.identity().fingerprint

    def hold(self) -> threading.Event:
        """The hub node's download of the last shard stops half way until the event is set."""
        gate = threading.Event()
        self.hub.hold[(REPO, HELD)] = gate
        return gate


@pytest.fixture
def fenv(spawn_agent, sharded_model: Path, tmp_path: Path) -> Iterator[FollowEnv]:
    hub = HubStandIn({REPO: repo_from_dir(sharded_model)}).start()
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}
    agents = [spawn_agent(name, env=env) for name in ("node-a", "node-b", "node-c")]
    router_yaml = tmp_path / "router.yaml"
    router_yaml.write_text(yaml.safe_dump({"backends": []}))
    orch = Orchestrator(tmp_path / "state", ConfigFileRegistrar(router_yaml), timeouts=Timeouts(listen=30, healthy=30,
                                                                                                stop=5),
                        lease_s=6.0, agent_timeout=5.0).start()
    for a in agents:
        orch.register_node(a.url, a.token)
    yield FollowEnv(hub, agents, orch)
    for gate in hub.hold.values():
        gate.set()
    orch.stop()
    hub.close()


def download_of(state: State, model_id: str):
    return next(d for d in state.downloads if d.model_id == model_id)


def finished(model_id: str):
    return lambda st: any(d.model_id == model_id and d.finished for d in st.downloads)


def partial(agent: AgentProc, model_id: str, rel: str) -> Path:
    """Where an agent's download keeps a verified file until the model is complete."""
    return agent.models_dir / ".partial" / model_id / "files" / rel


def test_copies_take_each_file_once_the_hub_node_has_verified_it(fenv: FollowEnv, sharded_model: Path):
    nodes = [fenv.node(i) for i in range(3)]
    a, b, c = fenv.agents
    total = fenv.orch.models.hub_files(REPO, "main", nodes[0]).total_bytes
    gate = fenv.hold()
    fenv.orch.models.download(REPO, "", nodes, model_id="m")
    try:
        # The hub node is stuck half way through the last shard, and the copying nodes already
        # hold the first shard, verified (renamed from .part only after its sha256 matched).
        # (Both awaited: on a loaded machine the copies can take the first shard while the hub
        # node is still on the second, before it reached the held one.)
        held_part = a.models_dir / ".partial" / "m" / "files" / (HELD + ".part")
        wait_until(lambda: held_part.is_file() and all(partial(x, "m", FIRST).is_file() for x in (b, c)), 60,
                   message="the hub node half way through the last shard, the copying nodes holding the first")
        assert not (a.models_dir / "m").exists()
        for x in (b, c):
            assert partial(x, "m", FIRST).read_bytes() == (sharded_model / FIRST).read_bytes()
            assert not partial(x, "m", HELD).exists()
        dl = download_of(fenv.orch.state, "m")
        assert dl.nodes[0].status == "downloading" and [n.status for n in dl.nodes[1:]] == ["copying"] * 2, dl
        # progress stays live and right: bytes against the whole model's size
        state = fenv.orch.wait(lambda st: all(n.done_bytes >= (sharded_model / FIRST).stat().st_size
                                              for n in download_of(st, "m").nodes[1:]), 15)
        assert all(n.total_bytes == total and n.done_bytes < total for n in download_of(state, "m").nodes), state

        # The hub node offers what it verified, never the file it is still downloading.
        ticket = a.client.ticket("m").ticket
        auth = {"Authorization": f"Bearer {ticket}"}
        offered = requests.get(f"{a.url}/v1/models/m/files", headers=auth, timeout=10).json()
        assert offered["state"] == "running" and not offered["complete"], offered
        assert FIRST in offered["manifest"]["files"] and HELD not in offered["manifest"]["files"]
        assert requests.get(f"{a.url}/v1/models/m/files/{HELD}", headers=auth, timeout=10).status_code == 404
        r = requests.get(f"{a.url}/v1/models/m/files/{FIRST}", headers=auth, timeout=10)
        assert r.status_code == 200 and r.content == (sharded_model / FIRST).read_bytes()
    finally:
        gate.set()
    state = fenv.orch.wait(finished("m"), 90)
    dl = download_of(state, "m")
    assert dl.phase == "done", dl
    assert [n.status for n in dl.nodes] == ["verified"] * 3, dl.nodes
    assert dl.nodes[0].source == f"hub {REPO}" and all(n.source == "LAN from node-a" for n in dl.nodes[1:])
    commit = fenv.hub.repos[REPO].commit
    for rel in (r for r in fenv.hub.repos[REPO].files if r.endswith(".safetensors")):  # (listings read config.json)
        assert len(fenv.hub.gets(REPO, f"{commit}/{rel}")) == 1, rel  # the hub was asked once per weights file
    want = {p.relative_to(sharded_model).as_posix(): p.read_bytes() for p in sharded_model.rglob("*") if p.is_file()}
    for x in fenv.agents:
        got = {p.relative_to(x.models_dir / "m").as_posix(): p.read_bytes()
               for p in (x.models_dir / "m").rglob("*") if p.is_file()}
        assert got == want, x.name
        assert not (x.models_dir / ".partial" / "m").exists()


def test_a_failed_hub_download_stops_every_copy_with_its_reason(fenv: FollowEnv):
    nodes = [fenv.node(i) for i in range(3)]
    gate = fenv.hold()
    fenv.hub.corrupt[(REPO, HELD)] = 2  # differs from its announced hash twice: the hub node gives up
    fenv.orch.models.download(REPO, "", nodes, model_id="m")
    wait_until(lambda: all(partial(x, "m", FIRST).is_file() for x in fenv.agents[1:]), 60,
               message="the copying nodes hold the first shard")
    gate.set()
    state = fenv.orch.wait(finished("m"), 60)
    dl = download_of(state, "m")
    assert dl.phase == "failed" and dl.error.startswith("hub download on node-a failed: mismatch"), dl
    assert [n.status for n in dl.nodes] == ["failed"] * 3, dl.nodes
    assert all(n.detail == dl.error for n in dl.nodes[1:]), dl.nodes
    for x in fenv.agents:
        wait_until(lambda x=x: not (x.models_dir / ".partial" / "m").exists(), 10,
                   message=f"{x.name} dropped its files")
        assert not (x.models_dir / "m").exists()


def test_cancel_stops_the_hub_download_and_every_copy(fenv: FollowEnv):
    nodes = [fenv.node(i) for i in range(3)]
    gate = fenv.hold()
    fenv.orch.models.download(REPO, "", nodes, model_id="m")
    wait_until(lambda: all(partial(x, "m", FIRST).is_file() for x in fenv.agents[1:]), 60,
               message="the copying nodes hold the first shard")
    fenv.orch.models.cancel("m")
    state = fenv.orch.wait(finished("m"), 30)
    gate.set()
    dl = download_of(state, "m")
    assert dl.phase == "cancelled" and [n.status for n in dl.nodes] == ["cancelled"] * 3, dl
    for x in fenv.agents:
        wait_until(lambda x=x: not (x.models_dir / ".partial" / "m").exists(), 10,
                   message=f"{x.name} dropped its files")
        assert not (x.models_dir / "m").exists()


@pytest.mark.slow
def test_measure_how_much_sooner_the_last_node_is_done(spawn_agent, tmp_path: Path,
                                                       tmp_path_factory: pytest.TempPathFactory):
    """Hub at 8 MB/s, the hub node's uploads at 24 MB/s (its LAN link, shared by the copies): the last
    node's time with copies after the whole hub download, then with copies following it. Printed."""
    from orchestrator.testmodels.llama import make_test_model

    model = make_test_model(tmp_path_factory.mktemp("bench") / "model", layers=8, hidden=384, shards=4)
    hub = HubStandIn({REPO: repo_from_dir(model)}).start()
    hub.rate_bps = 8e6
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}
    a = spawn_agent("node-a", "--upload-limit", "24M", env=env)
    others = [spawn_agent(n, env=env) for n in ("node-b", "node-c")]
    try:
        hub_source = {"kind": "hf", "repo_id": REPO}
        t0 = time.monotonic()
        a.client.fetch("after", hub_source)
        assert a.client.wait_download("after", 300).state == "done"
        hub_s = time.monotonic() - t0
        manifest = a.client.model("after").manifest
        for x in others:
            x.client.fetch_from_peers("after", [a.client], manifest)
        assert all(x.client.wait_download("after", 300).state == "done" for x in others)
        after_s = time.monotonic() - t0

        t0 = time.monotonic()
        a.client.fetch("follow", hub_source)
        wait_until(lambda: a.client.progress("follow").state == "running", 10)
        for x in others:
            x.client.follow_peer("follow", a.client)
        assert a.client.wait_download("follow", 300).state == "done"
        assert all(x.client.wait_download("follow", 300).state == "done" for x in others)
        follow_s = time.monotonic() - t0
        for x in others:
            assert x.client.check("follow", manifest).status == "present"
    finally:
        hub.close()
    size = sum(e.size for e in manifest.files.values())
    print(f"\nfollow gain: {size / 1e6:.1f} MB in {len(manifest.files)} files, hub alone {hub_s:.2f} s; last node "
          f"done after {after_s:.2f} s copying after the hub download, {follow_s:.2f} s following it: "
          f"{after_s - follow_s:.2f} s sooner ({(1 - follow_s / after_s) * 100:.0f} %)")
