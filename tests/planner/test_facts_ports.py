"""Node facts from an agent's report, and the ports a plan takes on each node."""

from __future__ import annotations

from orchestrator.agent.schemas import Accelerator, Memory
from orchestrator.planner import (
    Plan,
    PlanSettings,
    allocate_ports,
    engine_version,
    node_facts_from_report,
    plan_cluster,
)
from tests.support.builders import GB, facts, report
from tests.support.planner_inputs import llama

# a Mac mini's report: 16 GB, 9 GB of it free, three free transport ports
MAC_MINI = report("mac-mini", 9 * GB, fingerprint="ab" * 16, ports=(39600, 39602, 39603), disk=100 * GB,
                  accelerator=Accelerator(family="apple-silicon", detail="M2"),
                  versions={"pipeserve": "0.1.0", "mlx": "0.32.4", "mlx_lm": "0.32.2", "python": "3.11.9"},
                  platform={"system": "Darwin"},
                  memory=Memory(total_bytes=16 * GB, available_bytes=9 * GB, budget_bytes=None, processes_rss_bytes=0,
                                free_bytes=9 * GB))


def test_node_facts_from_report() -> None:
    facts = node_facts_from_report(MAC_MINI, node_id="node-7", host="192.168.1.20")
    assert (facts.id, facts.name, facts.label) == ("node-7", "mac-mini", "mac-mini (node-7)")
    assert facts.accelerator == "apple-silicon"
    assert facts.engine_version == "pipeserve 0.1.0, mlx 0.32.4, mlx_lm 0.32.2"  # python does not matter
    assert (facts.free_bytes, facts.free_ports, facts.host) == (9 * GB, (39600, 39602, 39603), "192.168.1.20")
    default = node_facts_from_report(MAC_MINI)
    assert (default.id, default.label, default.host) == ("mac-mini", "mac-mini", None)


def test_the_physical_machine_comes_from_the_report_and_is_the_same_for_every_agent_on_it() -> None:
    from orchestrator.agent.report import machine_id, platform_facts

    here = platform_facts()["machine_id"]
    assert here == machine_id() and len(here) == 16  # hashed: the OS's own id stays on the machine
    linux = MAC_MINI.model_copy(update={"platform": {"system": "Linux", "machine_id": here}})
    assert node_facts_from_report(linux).machine == here
    assert node_facts_from_report(MAC_MINI).machine is None  # an agent that predates it: its own machine


def test_engine_version_marks_missing_packages() -> None:
    assert engine_version({"pipeserve": "0.1.0", "mlx": None}) == "pipeserve 0.1.0, mlx ?, mlx_lm ?"
    versions = {"pipeserve": "0.1.0", "mlx": None, "mlx_lm": "0.32.2"}
    mlx_missing = node_facts_from_report(MAC_MINI.model_copy(update={"versions": versions}))
    assert mlx_missing.engine_version != node_facts_from_report(MAC_MINI).engine_version


def test_coordinator_node_gets_three_ports_in_design_order() -> None:
    """Coordinator identity first, then stage 0, then HTTP (docs/configuration.md: coordinator 39600, stage-0 39601)."""
    allocation, issues = allocate_ports([facts(0), facts(1)], PlanSettings())
    assert issues == [] and allocation is not None
    assert (allocation.coordinator_port, allocation.stage_ports, allocation.http_port) == (39600, (39601, 39600), 39602)


def test_ports_come_from_the_range_and_the_free_list_only() -> None:
    s = PlanSettings(port_start=40000, port_end=40010)
    allocation, issues = allocate_ports([facts(0, ports=(40010, 39999, 40003, 40001, 40005)),
                                         facts(1, ports=(40011, 40004))], s)
    assert issues == [] and allocation is not None
    assert (allocation.coordinator_port, allocation.stage_ports, allocation.http_port) == (40001, (40003, 40004), 40005)


def test_nodes_on_one_host_never_share_a_port() -> None:
    same = [facts(i, host="127.0.0.1") for i in range(3)]
    allocation, _ = allocate_ports(same, PlanSettings())
    assert allocation is not None
    used = [allocation.coordinator_port, allocation.http_port, *allocation.stage_ports]
    assert sorted(used) == [39600, 39601, 39602, 39603, 39604]
    other_hosts = [facts(0, host="10.0.0.1"), facts(1, host="10.0.0.2")]
    allocation, _ = allocate_ports(other_hosts, PlanSettings())
    assert allocation is not None and allocation.stage_ports == (39601, 39600)


def test_plan_lists_ports_per_node() -> None:
    plan = plan_cluster(llama(), [facts(0, host="127.0.0.1"), facts(1, host="127.0.0.1")], PlanSettings())
    assert isinstance(plan, Plan)
    assert plan.ports == {"n0": (39600, 39601, 39602), "n1": (39603,)}
    coordinator = plan.coordinator
    assert (coordinator.node_id, coordinator.transport_port, coordinator.http_port) == ("n0", 39600, 39602)
    assert [s.transport_port for s in plan.stages] == [39601, 39603]
