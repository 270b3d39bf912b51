"""A plan's transport reaches the session: the timeline's first step and the cluster view's
fallback say which backend runs and why a requested one does not (pure)."""

from __future__ import annotations

from orchestrator.control.rules.planning import session_from_plan
from orchestrator.control.rules.state import Session, State
from orchestrator.control.rules.timelines import timeline
from orchestrator.planner import NodeFacts, Plan, PlanSettings, plan_cluster
from tests.support.planner_inputs import bridge, lan_node, llama, rdma_nic
from webapp.views.plan import transport_view


def planned(backend: str, *nodes: NodeFacts) -> tuple[Plan, Session]:
    """The plan over `nodes` with `backend` requested, and the session made from it."""
    plan = plan_cluster(llama(), list(nodes), PlanSettings(transport_backend=backend))
    assert isinstance(plan, Plan)
    return plan, session_from_plan(plan, State(), "s1", "m", "toml")


def test_rdma_fallback_is_the_first_timeline_step_and_the_cluster_views_callout() -> None:
    _, s = planned("rdma", lan_node(0, rdma_nic(0)), lan_node(1))
    assert s.transport_fallback == "rdma requested, running on tcp: node1 has no RDMA device (RDMA on node0 (ib0))"
    first = timeline(s)[0]
    assert (first.key, first.state) == ("transport", "done")
    assert first.label == f"Transport: tcp — {s.transport_fallback}"
    assert [st.key for st in timeline(s)][1] == "stage-0.start"


def test_thunderbolt_step_names_the_addresses_and_tcp_adds_nothing() -> None:
    _, s = planned("thunderbolt", lan_node(0, bridge(0)), lan_node(1, bridge(1)))
    assert not s.transport_fallback
    assert timeline(s)[0].label == "Transport: thunderbolt (node0 169.254.7.1 on bridge0, node1 169.254.7.2 on bridge0)"
    # the agents, the router and the monitor still reach the nodes at the registry's addresses
    assert s.coordinator_host == "192.168.1.10" and [st.host for st in s.stages] == ["192.168.1.10", "192.168.1.11"]
    _, plain = planned("tcp", lan_node(0), lan_node(1))
    assert timeline(plain)[0].label == "Transport: tcp" and not plain.transport_fallback


def test_plan_preview_shows_the_transport_and_the_reason() -> None:
    plan, _ = planned("rdma", lan_node(0, rdma_nic(0)), lan_node(1))
    view = transport_view(plan.transport)
    assert view["used"] == "tcp" and view["reason"].startswith("rdma requested, running on tcp: node1")
    assert view["nodes"] == ["node0 192.168.1.10 on eth0 (ethernet, 1000 Mbit/s)",
                             "node1 192.168.1.11 on eth0 (ethernet, 1000 Mbit/s)"]
    assert transport_view(None) is None
