"""Links and compute on real agents: probe tickets, measured links, interfaces, timed layers."""

from __future__ import annotations

import pytest
import requests
from pydantic import ValidationError

from orchestrator import settings
from orchestrator.agent import compute
from orchestrator.agent.client import AgentError
from orchestrator.agent.job_follower import follow_job
from orchestrator.agent.linkecho import MIN_DIFFERENCE_S, SMALL_PAYLOAD
from orchestrator.agent.local_agent import SHARED_HOST_BLAS
from orchestrator.agent.netif import describe, linux_kind, linux_speed
from orchestrator.agent.perf_routes import PROBE_SCOPE, ticket_allows
from orchestrator.agent.perf_schemas import MeasureLinksRequest
from orchestrator.proc import wait_until
from tests.agent.conftest import copy_model


@pytest.mark.parametrize("scope, access, model_id, allowed", [
    (PROBE_SCOPE, "probe", None, True),
    (PROBE_SCOPE, "file", PROBE_SCOPE, False),  # no model is called ':links', and no file is read with it
    (PROBE_SCOPE, "credential", None, False),
    ("m", "probe", None, False),  # a file ticket cannot probe
    ("m", "file", "m", True),
    ("m", "file", "other", False),
])
def test_ticket_scopes(scope, access, model_id, allowed):
    assert ticket_allows(scope, access, model_id) is allowed


def test_two_agents_measure_their_link_with_probe_tickets(spawn_agent):
    a, b = spawn_agent("a"), spawn_agent("b")
    echo = b.url + "/v1/links/echo"
    assert requests.get(echo, timeout=5).status_code == 401  # like every agent route: credentials
    ticket = b.client.links_ticket(ttl_s=60)
    assert requests.get(echo, headers={"Authorization": f"Bearer {ticket}"}, timeout=5).status_code == 200
    # the probe ticket opens nothing else
    for path in ("/v1/report", "/v1/models", "/v1/links"):
        assert requests.get(b.url + path, headers={"Authorization": f"Bearer {ticket}"}, timeout=5).status_code == 403
    # small, bounded probes: a request for more pings or bigger payloads than the agent allows is refused
    for too_much in ({"pings": 51}, {"payload_bytes": 2 << 20}, {"interval_s": 1.0}):
        with pytest.raises(ValidationError):
            MeasureLinksRequest.model_validate({"peers": [], **too_much})
    [sample] = a.client.measure_links([{"node_id": "b", "name": "b", "url": b.url, "ticket": ticket}],
                                      interval_s=5)
    assert sample.error is None, sample.error
    assert 0 < sample.http_rtt_ms < 200 and sample.bandwidth_Bps > 1e6
    # loopback may be too fast to time: then the figure is a lower bound, and said to be one
    floor = ((1 << 20) - SMALL_PAYLOAD) / MIN_DIFFERENCE_S
    assert (sample.bandwidth_Bps == floor) if sample.bandwidth_lower_bound else (sample.bandwidth_Bps <= floor)
    assert sample.rtt_ms is None or 0 < sample.rtt_ms < 50
    # measured on the transport's path too: an echo at b's stage address, on a port of its range
    host, port = sample.path.rsplit(":", 1)
    assert host == "127.0.0.1" and b.transport[0] <= int(port) <= b.transport[1], sample.path
    assert 0 < sample.path_rtt_ms < 200 and sample.plan_rtt_ms == sample.path_rtt_ms
    assert sample.interface.startswith("lo (loopback")
    report = a.client.report()
    assert [s.node_id for s in report.links] == ["b"]
    assert any(i.kind == "loopback" and "127.0.0.1" in i.addresses for i in report.interfaces)
    first = report.links[0].at
    # ... and periodically after that
    wait_until(lambda: a.client.links()[0].at != first, 30, 0.5, message="a periodic re-measurement")
    # a wrong ticket is a failed sample, not a failed call
    [bad] = a.client.measure_links([{"node_id": "b", "url": b.url, "ticket": "x" * 20}])
    assert bad.error and "401" in bad.error
    # a stage address that is not b's cannot be measured, and says so (no figure from another path)
    [elsewhere] = a.client.measure_links([{"node_id": "b", "url": b.url, "ticket": ticket,
                                           "transport_host": "192.0.2.9"}])
    assert elsewhere.error and "cannot echo at 192.0.2.9" in elsewhere.error and elsewhere.path_rtt_ms is None


def test_an_agent_times_a_models_layers_once(spawn_agent, test_model_dir):
    a = spawn_agent("a")
    copy_model(test_model_dir, a.models_dir, "tiny")
    with pytest.raises(AgentError) as missing:
        a.client.profile("absent")
    assert missing.value.status == 404
    assert a.client.profile("tiny").state == "absent"
    assert a.client.profile("tiny", start=True).state in ("running", "done")
    # a busy machine's timing is taken again (agent/compute.py), each try bounded like the first
    status = follow_job(lambda: a.client.profile("tiny"), "timing a tiny model", 240 * compute.TRIES, 0.5)
    assert status.state == "done", status.error
    p = status.profile
    assert p.layer_ms_b1_solo > 0 and p.layer_ms_bB > 0 and p.prefill_ms_per_token > 0 and p.batch == 8
    # timed with the stage's BLAS threads: a local agent's, one per stage and every core when SOLO
    base, solo = (int(SHARED_HOST_BLAS[s.name]) for s in (settings.STAGE_THREADS, settings.SOLO_THREADS))
    assert p.threads == (base, solo)
    # the per-step path beyond the layers and steps of 2 and 4 rows are timed with them
    assert p.step_ms_b1 > 0 and p.last_step_ms_bB > 0 and p.coordinator_ms_b1 > 0
    assert [r for r, _ in p.layer_ms_rows] == [2, 4]
    assert a.client.profile("tiny", start=True).profile == p  # cached per model
    assert [c.model_id for c in a.client.report().compute] == ["tiny"]


def test_interface_kinds_from_sysfs(tmp_path):
    def iface(name: str, *, type_: str = "1", device: bool = True, wireless: bool = False, speed: str = "1000"):
        d = tmp_path / name
        d.mkdir()
        (d / "type").write_text(type_)
        (d / "speed").write_text(speed)
        if device:
            (d / "device").mkdir()
        if wireless:
            (d / "wireless").mkdir()
    iface("eth0")
    iface("wlan0", wireless=True, speed="-1")
    iface("thunderbolt0")
    iface("veth1", device=False, speed="10000")
    iface("ib0", type_="32")
    assert [linux_kind(n, tmp_path) for n in ("eth0", "wlan0", "thunderbolt0", "veth1", "ib0", "lo")] == \
        ["ethernet", "wifi", "thunderbolt", "virtual", "infiniband", "loopback"]
    assert linux_speed("eth0", tmp_path) == 1000 and linux_speed("wlan0", tmp_path) is None
    from orchestrator.agent.perf_schemas import NetInterface
    assert describe(NetInterface(name="eth0", kind="ethernet", speed_mbps=1000, rdma=True)) == \
        "eth0 (ethernet, 1000 Mbit/s, RDMA)"
