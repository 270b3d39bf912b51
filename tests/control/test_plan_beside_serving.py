"""Plans beside a serving cluster (issue 38 item 4, pure): a plan shown for a running cluster
counts the memory its own stages hold as its own (refreshed once its prediction arrived, it
turned "Refused — does not fit" right above the Healthy cluster), and the layers are never timed
on a node that serves a stage."""

from __future__ import annotations

from orchestrator.agent.device_schemas import Memory
from orchestrator.agent.schemas import ProcessInfo
from orchestrator.control.rules.measured import timing_node
from orchestrator.control.rules.planning import own_memory, plan_for, plan_settings
from orchestrator.control.rules.state import Settings, State
from orchestrator.planner import Plan, Refusal
from tests.support.builders import MODEL, node, session
from tests.support.control_states import HELD

MIB = 1 << 20


def _process(cluster: str, name: str) -> ProcessInfo:
    return ProcessInfo(cluster_id=cluster, node_id=name, kind="stage", model_id=MODEL, pid=1, alive=True, port=39601,
                       port_listening=True, started_at=0, uptime_s=1, lease_remaining_s=50)


def _node(name: str, cluster: str = "s1", held: int = 600 * MIB):
    """A node with a 900 MiB budget of which `held` is held by an engine process of `cluster`."""
    memory = Memory(total_bytes=4096 * MIB, available_bytes=3000 * MIB, budget_bytes=900 * MIB,
                    processes_rss_bytes=held, free_bytes=900 * MIB - held)
    return node(name, models=HELD, memory=memory, processes=[_process(cluster, f"stage-{name[-1]}")])


def test_the_memory_a_running_cluster_holds_counts_as_free_for_its_own_plan():
    state = State(settings=Settings(distributed_enabled=True), nodes=(_node("node-a"), _node("node-b")),
                  sessions=(session(),))
    a = state.nodes[0]
    assert own_memory(state, MODEL, a, 300 * MIB) == 900 * MIB  # its own: the whole budget again
    assert own_memory(state, "another-model", a, 300 * MIB) == 300 * MIB  # another model's plan: taken
    stranger = State(nodes=(_node("node-a", cluster="s9"),), sessions=(session(),))
    assert own_memory(stranger, MODEL, stranger.nodes[0], 300 * MIB) == 300 * MIB  # not its process
    settings = plan_settings(state.settings, context_length=2048, concurrency=1)
    assert isinstance(plan_for(state, MODEL, ["n0", "n1"], settings), Plan)
    idle = state.model_copy(update={"sessions": ()})  # the same memory held by nobody it knows: refused
    assert isinstance(plan_for(idle, MODEL, ["n0", "n1"], settings), Refusal)


def test_the_layers_are_timed_on_a_node_that_serves_no_stage_or_not_at_all():
    """Timed beside a stage just launched there, the layers competed with serving (12.5 minutes
    on a busy machine for one static line)."""
    a, b, c = _node("node-a"), _node("node-b"), node("node-c", models=HELD)
    state = State(nodes=(a, b, c), sessions=(session(),))  # s1 serves on node-a and node-b
    assert timing_node(state, [a, b, c], MODEL) == (c, "")
    chosen, why = timing_node(state, [a, b], MODEL)
    assert chosen is None and "node-a, node-b serve a stage now" in why and "compete with serving" in why
    assert timing_node(state.model_copy(update={"sessions": ()}), [a, b], MODEL) == (a, "")
