"""The thunderbolt transport across network namespaces: node-a and node-b share the emulated
LAN (10.77.0.0/24) and a direct cable whose ends are named `thunderbolt0` (10.78.0.0/24, as
a Thunderbolt bridge is a point-to-point IP link); node-c has the LAN only.

From the agents' real reports (interfaces found in each namespace's /sys/class/net), a plan
with transport `thunderbolt` over node-a + node-c is refused naming node-c; over node-a +
node-b it binds the stages on the cable's addresses, the launcher starts them through the
agents, the stages' sockets are on 10.78.0.x and a completion goes through. Skipped, with
the reason, where the LAN cannot be built (not root).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import requests

from e2e.lan.netns import Lan, remove_leftovers, run, unavailable
from e2e.lan.profiles import PROFILES
from e2e.lan.stack import AGENT_PORT, LanStack, running_lan_stack
from orchestrator.agent.client import AgentClient
from orchestrator.control.launcher import Launcher
from orchestrator.control.rules.planning import session_from_plan
from orchestrator.control.rules.state import State
from orchestrator.demo_stack import MODEL_ID
from orchestrator.planner import Plan, PlanSettings, Refusal, node_facts_from_report, plan_cluster, plan_to_cluster_toml
from orchestrator.planner.result import RefusalCode

WHY = unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")
CABLE = "10.78.0"


class NoRouter:
    """The launcher's registrar, without a router (this test calls the coordinator itself)."""

    router_url = None  # nobody to ask whether it routes: the router.register step ends once "written"

    def register(self, *_: object, **__: object) -> None:
        pass

    def deregister(self, *_: object) -> None:
        pass


def cable(lan: Lan) -> None:
    """A veth pair between node-a and node-b, each end named thunderbolt0 (what netif calls a
    Thunderbolt bridge), at 10.78.0.1 and .2; deleted with the namespaces."""
    a, b = lan.nodes[0].ns, lan.nodes[1].ns
    run("ip", "-n", a, "link", "add", "thunderbolt0", "type", "veth", "peer", "name", "tbpeer", "netns", b)
    run("ip", "-n", b, "link", "set", "tbpeer", "name", "thunderbolt0")
    for ns, i in ((a, 1), (b, 2)):
        run("ip", "-n", ns, "addr", "add", f"{CABLE}.{i}/24", "dev", "thunderbolt0")
        run("ip", "-n", ns, "link", "set", "thunderbolt0", "up")


def sockets(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "ss", "-tnH"], capture_output=True, text=True).stdout + \
        subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnH"], capture_output=True, text=True).stdout


def test_thunderbolt_binds_on_the_cable_and_refuses_a_node_without_one(demo_model: Path, tmp_path: Path) -> None:
    remove_leftovers()
    with Lan(PROFILES["loopback"], 3) as lan:
        cable(lan)
        with running_lan_stack(lan, tmp_path, demo_model, model_on=(0, 1)) as stack:  # stage 1 runs on node 1
            check(stack)


def check(stack: LanStack) -> None:
    lan = stack.lan
    agents, facts = {}, {}
    for n in lan.nodes:
        client = AgentClient(f"http://{n.ip}:{AGENT_PORT}")
        client = AgentClient(client.base_url, client.pair(stack.tokens[n.name], "transport test").credential)
        report = client.report()
        agents[n.name], facts[n.name] = client, node_facts_from_report(report, node_id=n.name, host=n.ip)
    kinds = {i.name: i.kind for i in facts["node-a"].interfaces}
    assert kinds["thunderbolt0"] == "thunderbolt" and kinds["eth0"] == "virtual", kinds
    info = next(m for m in agents["node-a"].report().models if m.id == MODEL_ID)
    settings = PlanSettings(transport_backend="thunderbolt", context_length=512)

    refused = plan_cluster(info.description, [facts["node-a"], facts["node-c"]], settings, model_name=MODEL_ID)
    assert isinstance(refused, Refusal)
    [reason] = [r for r in refused.reasons if r.code == RefusalCode.NO_THUNDERBOLT]
    assert reason.node_id == "node-c" and reason.message.startswith("node node-c has no Thunderbolt bridge interface")

    plan = plan_cluster(info.description, [facts["node-a"], facts["node-b"]], settings, model_name=MODEL_ID)
    assert isinstance(plan, Plan), plan
    assert [n.host for n in plan.transport.nodes] == [f"{CABLE}.1", f"{CABLE}.2"]
    toml = plan_to_cluster_toml(plan, "tb-test")
    session = session_from_plan(plan, State(), "tb1", MODEL_ID, toml)
    assert session.transport.startswith("Transport: thunderbolt (node-a 10.78.0.1 on thunderbolt0")
    events: list = []
    launcher = Launcher(session, {"node-a": agents["node-a"], "node-b": agents["node-b"]}, NoRouter(),
                        events.append)  # type: ignore[arg-type]
    try:
        assert launcher.launch(MODEL_ID, "s" * 32), [e for e in events if getattr(e, "state", "") == "failed"]
        stage1_port = plan.stages[1].transport_port
        b_sockets = sockets(lan.nodes[1].ns)
        assert f"{CABLE}.2:{stage1_port}" in b_sockets, b_sockets  # stage 1 listens on the cable ...
        a_sockets = sockets(lan.nodes[0].ns)
        assert f"{CABLE}.2:{stage1_port}" in a_sockets, a_sockets  # ... and stage 0 reaches it over it
        r = requests.post(session.url + "/v1/completions", timeout=120, json={
            "model": MODEL_ID, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"].strip()
    finally:
        assert launcher.teardown() == []
