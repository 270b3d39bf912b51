"""Engine processes through real agents: a pipeline served via two agents, leases, stop, safety."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
import requests

from orchestrator.agent.client import AgentError
from orchestrator.agent.schemas import FileEntry, Manifest
from orchestrator.proc import wait_until
from tests.agent.conftest import copy_model
from tests.support.engine_jobs import MODEL, cluster_toml, stage_request


def test_stage_and_coordinator_through_two_agents_serve_a_chat(spawn_agent, test_model_dir, tmp_path):
    a, b = spawn_agent("a"), spawn_agent("b")
    for agent in (a, b):
        copy_model(test_model_dir, agent.models_dir, MODEL)
    coord_addr, http_port = b.port_at(0), b.port_at(1)
    config = cluster_toml(tmp_path, [(0, 1), (2, 3)], [coord_addr, a.port_at(0), b.port_at(2)])
    secret = secrets.token_hex(16)

    s0 = a.client.start_process(stage_request(config, "stage-0", secret))
    s1 = b.client.start_process(stage_request(config, "stage-1", secret))
    assert s0.created and s1.created and s0.pid != s1.pid
    for agent in (a, b):
        nid = "stage-0" if agent is a else "stage-1"
        wait_until(lambda agent=agent, nid=nid: (agent.client.process("c1", nid).port_listening
                                                 or not agent.client.process("c1", nid).alive),
                 60, message=f"{nid} listening")
        assert agent.client.process("c1", nid).alive, agent.client.logs("c1", nid)
    coord = b.client.start_process({"kind": "coordinator", "cluster_id": "c1", "node_id": "coordinator",
                                    "model_id": MODEL, "config": config, "secret": secret, "lease_s": 60,
                                    "http_port": http_port})
    assert coord.created and coord.port == http_port

    def healthy() -> bool:
        assert b.client.process("c1", "coordinator").alive, b.client.logs("c1", "coordinator")
        try:
            return requests.get(f"http://127.0.0.1:{http_port}/health", timeout=2).json().get("ready", False)
        except requests.RequestException:
            return False

    wait_until(healthy, 60, message="the coordinator to be healthy")
    r = requests.post(f"http://127.0.0.1:{http_port}/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] >= 1 and isinstance(body["choices"][0]["message"]["content"], str)

    # Report: per process alive, pid, port listening; logs are retrievable.
    listed = {p.node_id: p for p in b.client.report().processes}
    assert set(listed) == {"stage-1", "coordinator"} and all(p.alive and p.port_listening for p in listed.values())
    stage_log = a.client.logs("c1", "stage-0")
    assert any("transport.listening" in line for line in stage_log)
    assert not any("transport.refused" in line for line in stage_log)  # status polls never poke the stage
    assert b.client.report().memory.processes_rss_bytes > 0

    # Stop is confirmed: the answer comes once the process is gone, with how it ended.
    stopped = b.client.stop_process("c1", "coordinator")
    assert not stopped.alive and (stopped.signal == "SIGTERM" or stopped.exit_code == 0), stopped
    assert stopped.stop_reason == "requested"
    with pytest.raises(ProcessLookupError):
        os.kill(stopped.pid, 0)
    assert b.client.stop_process("c1", "coordinator").alive is False  # idempotent


def test_lease_expiry_stops_processes_and_renewal_keeps_them(spawn_agent, test_model_dir, tmp_path):
    a = spawn_agent("a")
    copy_model(test_model_dir, a.models_dir, MODEL)
    config = cluster_toml(tmp_path, [(0, 1), (2, 3)], [a.port_at(0), a.port_at(1), a.port_at(2)])
    secret = secrets.token_hex(16)
    # Margins for a loaded 2-core machine: "held" is renewed ~13 times per lease, and each
    # outcome is awaited (20 s) instead of assumed after a fixed sleep.
    held = a.client.start_process(stage_request(config, "stage-0", secret, lease_s=4, cluster_id="held"))
    lapsing = a.client.start_process(stage_request(config, "stage-1", secret, lease_s=1.5, cluster_id="lapsing"))

    def renew_held_until_lapsing_is_gone() -> bool:
        assert a.client.renew_lease("held", 4).renewed == ["stage-0"]  # the control plane renews "held" only
        return not a.client.process("lapsing", "stage-1").alive

    wait_until(renew_held_until_lapsing_is_gone, 20, message="the unrenewed lease to lapse", interval=0.3)
    gone = a.client.process("lapsing", "stage-1")
    assert gone.stop_reason == "lease expired", gone
    assert a.client.process("held", "stage-0").alive
    wait_until(lambda: not a.client.process("held", "stage-0").alive, 20,
               message="the lease to lapse once renewals stop")
    assert a.client.process("held", "stage-0").stop_reason == "lease expired"
    for info in (held, lapsing):
        with pytest.raises(ProcessLookupError):
            os.kill(info.pid, 0)
    with pytest.raises(AgentError) as err:
        a.client.renew_lease("held", 1.5)
    assert err.value.status == 404  # the control plane learns its processes are gone


def test_start_is_idempotent_conflicts_are_refused_and_the_secret_stays_off_argv(spawn_agent, test_model_dir,
                                                                                   tmp_path):
    a = spawn_agent("a")
    copy_model(test_model_dir, a.models_dir, MODEL)
    config = cluster_toml(tmp_path, [(0, 3)], [a.port_at(0), a.port_at(1)])
    secret = "s3cret-" + secrets.token_hex(12)
    first = a.client.start_process(stage_request(config, "stage-0", secret))
    again = a.client.start_process(stage_request(config, "stage-0", secret))
    assert first.created and not again.created and again.pid == first.pid
    other = cluster_toml(tmp_path, [(0, 3)], [a.port_at(0), a.port_at(2)])
    with pytest.raises(AgentError) as err:
        a.client.start_process(stage_request(other, "stage-0", secret))
    assert err.value.status == 409
    assert [p.pid for p in a.client.processes()] == [first.pid]

    cmdline = Path(f"/proc/{first.pid}/cmdline").read_bytes()
    assert secret.encode() not in cmdline and b"stage" in cmdline
    assert secret.encode() in Path(f"/proc/{first.pid}/environ").read_bytes()
    toml_path = a.state_dir / "processes" / "c1" / "stage-0" / "cluster.toml"
    assert toml_path.stat().st_mode & 0o777 == 0o600 and secret not in toml_path.read_text()
    assert os.getpgid(first.pid) == first.pid  # its own process group
    # The model under a running process is not replaced by a download.
    other_files = Manifest(files={"x.json": FileEntry(size=1, sha256="0" * 64)})
    with pytest.raises(AgentError) as err:
        a.client.fetch(MODEL, {"kind": "peer", "url": "http://127.0.0.1:9", "ticket": "t" * 20}, other_files)
    assert err.value.status == 409 and err.value.code == "model_in_use" and "c1/stage-0" in err.value.message
    a.client.stop_process("c1", "stage-0")


BAD_STARTS = [
    ({"kind": "bash"}, 400),
    ({"config": "not = [toml"}, 400),
    ({"node_id": "stage-9"}, 400),
    ({"node_id": "coordinator"}, 400),  # a stage cannot run the coordinator's node
    ({"model_id": "../tm"}, 400),
    ({"model_id": "/etc"}, 400),
    ({"model_id": "absent"}, 404),
    ({"cluster_id": "../../etc"}, 400),
    ({"secret": "short"}, 400),
    ({"command": ["/bin/sh", "-c", "id"]}, 400),  # no field can carry a command line
    ({"kind": "coordinator", "node_id": "coordinator", "http_port": "IN_RANGE", "http_host": "--config=/etc/x"}, 400),
    ({"config": "[cluster]\nname='x'\npipeline_parallel_size=1\nsecret_file='/etc/shadow'\n"
                "[[nodes]]\nid='coordinator'\naddress='127.0.0.1:1'\nrole='hybrid'\n"
                "[[nodes]]\nid='stage-0'\naddress='127.0.0.1:2'\nrole='pipeline_stage'\nstage=0\nlayers='0-3'\n"}, 400),
]


def test_bad_start_requests_are_refused_and_start_nothing(spawn_agent, test_model_dir, tmp_path):
    a = spawn_agent("a")
    copy_model(test_model_dir, a.models_dir, MODEL)
    good = stage_request(cluster_toml(tmp_path, [(0, 3)], [a.port_at(0), a.port_at(1)]), "stage-0",
                         secrets.token_hex(16))
    for change, status in BAD_STARTS:
        change = {k: a.port_at(2) if v == "IN_RANGE" else v for k, v in change.items()}
        r = requests.post(a.url + "/v1/processes", json={**good, **change},
                          headers={"Authorization": f"Bearer {a.client.credential}"})
        assert r.status_code == status, (change, r.text)
        assert r.json()["error"]["message"], change
    assert a.client.processes() == []
    assert not (a.state_dir / "processes" / "c1").exists()


def test_transport_port_outside_the_range_is_refused(spawn_agent, test_model_dir, tmp_path):
    a = spawn_agent("a")
    copy_model(test_model_dir, a.models_dir, MODEL)
    outside = a.transport[1] + 100
    with pytest.raises(AgentError) as err:
        a.client.start_process(stage_request(cluster_toml(tmp_path, [(0, 3)], [a.port_at(0), outside]), "stage-0",
                                             secrets.token_hex(16)))
    assert err.value.status == 400 and err.value.code == "port_out_of_range"
