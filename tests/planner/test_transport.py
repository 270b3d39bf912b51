"""Transport backends (planner/transport.py) from fake interface reports: thunderbolt binds on
the Thunderbolt-bridge addresses or refuses naming the node; rdma is detected per node and
runs on tcp with the reason; every boundary names the interfaces it uses."""

from __future__ import annotations

from orchestrator.planner import Plan, PlanSettings, Refusal, plan_cluster, plan_to_cluster_config
from orchestrator.planner.perf_inputs import LayerTiming, LinkCost
from orchestrator.planner.result import RefusalCode
from orchestrator.planner.transport import plan_transport
from tests.support.planner_inputs import bridge, lan_node, llama, rdma_nic

T = LayerTiming(layer_ms_b1_solo=1.0, layer_ms_b1=1.0, layer_ms_bB=2.0, batch=8, prefill_ms_per_token=0.1)


def test_tcp_binds_where_the_registry_reaches_each_node() -> None:
    plan = plan_cluster(llama(), [lan_node(0), lan_node(1)])
    assert isinstance(plan, Plan) and plan.transport is not None
    t = plan.transport
    assert (t.requested, t.used, t.reason) == ("tcp", "tcp", "")
    assert [n.host for n in t.nodes] == ["192.168.1.10", "192.168.1.11"]
    assert t.nodes[0].interface == "eth0 (ethernet, 1000 Mbit/s)"
    config = plan_to_cluster_config(plan, "c")
    assert [n.address.split(":")[0] for n in config.nodes] == ["192.168.1.10", "192.168.1.10", "192.168.1.11"]


def test_thunderbolt_binds_and_connects_on_the_bridge_addresses() -> None:
    plan = plan_cluster(llama(), [lan_node(0, bridge(0)), lan_node(1, bridge(1))],
                        PlanSettings(transport_backend="thunderbolt"))
    assert isinstance(plan, Plan) and plan.transport is not None
    assert plan.transport.used == "thunderbolt" and not plan.transport.reason
    # IPv4 before a link-local IPv6 (which would need a scope id to bind)
    assert [n.host for n in plan.transport.nodes] == ["169.254.7.1", "169.254.7.2"]
    config = plan_to_cluster_config(plan, "c", hosts={"n0": "192.168.1.10", "n1": "192.168.1.11"})
    assert {n.id: n.address for n in config.nodes} == {
        "coordinator": f"169.254.7.1:{plan.coordinator.transport_port}",
        "stage-0": f"169.254.7.1:{plan.stages[0].transport_port}",
        "stage-1": f"169.254.7.2:{plan.stages[1].transport_port}"}
    # the stages keep the registry's address for everything else (agents, monitor, HTTP)
    assert plan.coordinator.host == "192.168.1.10"
    assert "Transport: thunderbolt (node0 169.254.7.1 on bridge0, node1 169.254.7.2 on bridge0)" == \
        plan.transport.summary


def test_thunderbolt_is_refused_naming_each_node_without_an_interface() -> None:
    nodes = [lan_node(0, bridge(0)), lan_node(1), lan_node(2, bridge(2, up=False)),
             lan_node(3, bridge(3, addresses=()))]
    result = plan_cluster(llama(), nodes, PlanSettings(transport_backend="thunderbolt"))
    assert isinstance(result, Refusal)
    refused = [r for r in result.reasons if r.code == RefusalCode.NO_THUNDERBOLT]
    assert [r.node_id for r in refused] == ["n1", "n2", "n3"]
    assert refused[0].message.startswith("node node1 has no Thunderbolt bridge interface with an address "
                                         "(eth0 (ethernet, 1000 Mbit/s))")
    assert "choose the tcp transport in Settings" in refused[0].message


def test_rdma_is_detected_per_node_and_falls_back_to_tcp_saying_why() -> None:
    plan = plan_cluster(llama(), [lan_node(0, rdma_nic(0)), lan_node(1)], PlanSettings(transport_backend="rdma"))
    assert isinstance(plan, Plan) and plan.transport is not None
    t = plan.transport
    assert (t.requested, t.used) == ("rdma", "tcp")
    assert t.reason == "rdma requested, running on tcp: node1 has no RDMA device (RDMA on node0 (ib0))"
    assert [n.host for n in t.nodes] == ["192.168.1.10", "192.168.1.11"]  # tcp where the registry reaches them
    assert t.summary == f"Transport: tcp — {t.reason}"
    # the engine's config keeps the requested backend (the engine falls back itself)
    assert plan_to_cluster_config(plan, "c").cluster.transport_backend == "rdma"


def test_rdma_everywhere_still_runs_on_tcp_the_engine_has_no_rdma_data_path() -> None:
    t, problems = plan_transport([lan_node(0, rdma_nic(0)), lan_node(1, rdma_nic(1))], "rdma")
    assert not problems and t.used == "tcp"
    assert t.reason == ("rdma requested, running on tcp: every node has RDMA (node0 (ib0), node1 (ib0)), "
                        "but pipeserve's engine has no RDMA data path yet")


def test_every_boundary_names_the_interfaces_it_uses() -> None:
    measured = LinkCost(rtt_ms=0.3, bandwidth_Bps=117e6, interface="eth0 (ethernet, 1000 Mbit/s)")
    a = lan_node(0, bridge(0), timing=T, n1=measured)
    b = lan_node(1, bridge(1), timing=T)
    tcp = plan_cluster(llama(), [a, b])
    assert [x.interface for x in tcp.performance.boundaries] == ["eth0 (ethernet, 1000 Mbit/s)"] * 2
    tb = plan_cluster(llama(), [a, b], PlanSettings(transport_backend="thunderbolt"))
    # the probe ran over eth0: the boundary says the data takes bridge0 and where the numbers come from
    assert [x.interface for x in tb.performance.boundaries] == [
        "bridge0 → bridge0 (thunderbolt); measured over eth0"] * 2
