"""Links measured on the path the stage transport takes, across network namespaces.

node-a and node-b share the emulated LAN (10.77.0.0/24, plain veth: the agents' HTTP API is
reached there) and a Thunderbolt cable (10.78.0.0/24) whose frames cross the user-space relay
(relay.py), 2 ms each way. A thunderbolt plan gives the stages the cable's addresses; the
control plane has the agents measure their links at those addresses (control/perf.py), and
the relay's 4 ms round trip shows in the sample, in the link matrix and in the plan's boundary
table (one figure for both), while the agents' own HTTP round trip over the LAN does not have
it. Skipped, with the reason, where the LAN cannot be built (not root).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.lan.netns import MTU, PREFIX, REPO, Lan, LanError, joined, remove_leftovers, run, unavailable
from e2e.lan.profiles import PROFILES
from e2e.lan.stack import AGENT_PORT, TRANSPORT
from orchestrator.agent.client import AgentClient
from orchestrator.agent.local_agent import SHARED_HOST_BLAS
from orchestrator.control.perf import measure_links, transport_hosts
from orchestrator.control.rules.measured import with_performance
from orchestrator.control.rules.state import Node, PreviewedPlan, State
from orchestrator.planner import Plan, PlanSettings, node_facts_from_report, plan_cluster
from orchestrator.planner.perf_inputs import LayerTiming
from orchestrator.proc.child import ChildProcess
from orchestrator.testmodels.llama import make_test_model
from webapp.views.perf import link_matrix

WHY = unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")
CABLE = "10.78.0"
DELAY_MS = 2.0  # each way: a 4 ms round trip
# the planner needs a timing to predict; the links are what this test is about
TIMING = LayerTiming(layer_ms_b1_solo=1.0, layer_ms_b1=1.0, layer_ms_bB=2.0, prefill_ms_per_token=0.1)


def relayed_cable(lan: Lan) -> subprocess.Popen:
    """node-a's and node-b's thunderbolt0, joined by a relay adding DELAY_MS each way (in a
    namespace of its own, where its TAP names are free; deleted with the LAN's)."""
    ns = lan._netns(f"{PREFIX}{lan.tag}r")
    relay = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "e2e.lan.relay", "--pairs", "1",
                              "--delay-ms", str(DELAY_MS), "--mtu", str(MTU)], cwd=REPO, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if (relay.stdout.readline().strip() if relay.stdout else "") != "ready":
        relay.kill()
        _, err = relay.communicate(timeout=10)
        raise LanError(f"the cable's relay did not start: {err}")
    for tap, node, i in (("ln0", lan.nodes[0], 1), ("lb0", lan.nodes[1], 2)):
        run("ip", "-n", ns, "link", "set", tap, "netns", node.ns)
        run("ip", "-n", node.ns, "link", "set", tap, "name", "thunderbolt0")
        run("ip", "-n", node.ns, "link", "set", "thunderbolt0", "mtu", str(MTU), "up")
        run("ip", "-n", node.ns, "addr", "add", f"{CABLE}.{i}/24", "dev", "thunderbolt0")
    return relay


def test_a_relay_on_the_stage_path_shows_in_the_measured_link_and_the_plan(tmp_path: Path) -> None:
    remove_leftovers()
    with Lan(PROFILES["loopback"], 2) as lan:
        relay = relayed_cable(lan)
        procs: list[ChildProcess] = []
        try:
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **SHARED_HOST_BLAS, "PYTHONPATH": str(REPO)}
            for n in lan.nodes:
                models = tmp_path / n.name / "models"
                models.mkdir(parents=True)
                procs.append(ChildProcess.spawn(n.name, n.argv(
                    sys.executable, "-m", "orchestrator.cli", "agent", "--host", n.ip, "--port", str(AGENT_PORT),
                    "--name", n.name, "--models-dir", str(models), "--state-dir", str(tmp_path / n.name / "state"),
                    "--transport-ports", f"{TRANSPORT[0]}-{TRANSPORT[1]}", "--no-advertise"),
                    tmp_path / f"{n.name}.log", env=env, cwd=REPO))
            make_test_model(tmp_path / "node-a" / "models" / "m", layers=4)
            with joined(lan.control):  # type: ignore[arg-type]
                check(lan, procs)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.stop(10)
            relay.terminate()
            relay.communicate(timeout=10)


def check(lan: Lan, procs: list[ChildProcess]) -> None:
    agents, nodes = {}, []
    for n, proc in zip(lan.nodes, procs):
        token = proc.wait_ready(lambda p=proc: p.printed(r"pairing token: (\S+)"), "its pairing token", 60, 0.1)
        url = f"http://{n.ip}:{AGENT_PORT}"
        # the token is printed before the agent's server binds: pairing at once was refused under load
        proc.wait_ready(lambda u=url: AgentClient(u).identity(), "an answer to /v1/identity", 60, 0.1)
        credential = AgentClient(url).pair(token, "links test").credential
        agents[n.name] = AgentClient(url, credential)
        nodes.append(Node(id=n.name, name=n.name, url=url, credential=credential, report=agents[n.name].report()))
    facts = [node_facts_from_report(n.report, node_id=n.id, host=n.host).model_copy(update={"timing": TIMING})
             for n in nodes]  # type: ignore[arg-type]
    info = next(m for m in agents["node-a"].report().models if m.id == "m")
    settings = PlanSettings(transport_backend="thunderbolt", context_length=512)
    plan = plan_cluster(info.description, facts, settings, model_name="m")
    assert isinstance(plan, Plan), plan
    shown = State(nodes=tuple(nodes), plan=PreviewedPlan(model_id="m", node_ids=("node-a", "node-b"),
                                                          context_length=512, result=plan))
    hosts = transport_hosts(shown, ["node-a", "node-b"])
    assert hosts == {"node-a": f"{CABLE}.1", "node-b": f"{CABLE}.2"}  # where the stages will talk

    assert measure_links(agents, nodes, hosts)
    nodes = [n.model_copy(update={"report": agents[n.id].report()}) for n in nodes]
    [sample] = nodes[0].report.links  # type: ignore[union-attr]
    assert sample.error is None, sample.error
    assert sample.path.startswith(f"{CABLE}.2:") and sample.interface.startswith("thunderbolt0"), sample
    assert sample.path_rtt_ms >= 2 * DELAY_MS, sample  # the relay's round trip is in the figure ...
    # ... which the agents' HTTP path over the LAN lacks (compared with each other, not with a fixed
    # figure: load on a shared 2-core machine inflates both round trips alike)
    assert sample.http_rtt_ms < sample.path_rtt_ms, sample

    # one figure for the link matrix and the plan's boundary table
    state = shown.model_copy(update={"nodes": tuple(nodes)})
    cell = link_matrix(state, ["node-a", "node-b"])["rows"][0][1]
    measured = with_performance(facts, nodes, "m")
    replanned = plan_cluster(info.description, [f.model_copy(update={"timing": TIMING}) for f in measured], settings,
                             model_name="m")
    assert isinstance(replanned, Plan) and replanned.performance is not None
    boundary = replanned.performance.boundaries[0]
    assert boundary.measured and boundary.link.startswith(f"{sample.path_rtt_ms:.2f} ms"), boundary
    assert cell["text"].startswith(f"{sample.path_rtt_ms:.2f} ms"), cell
    assert "thunderbolt0" in boundary.interface and "measured over" not in boundary.interface, boundary
