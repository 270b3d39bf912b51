"""A stage whose node's agent vanished is restarted on another node; the others keep their processes.

Real agents (three), stage processes, coordinator and router. A 2-stage cluster runs on
node-a (stage 0, coordinator) and node-b (stage 1); node-b goes away, stage 1 comes back on
node-c, the coordinator and stage 0 learn its address while they run (engine/stage_address.py).
Timing is printed, never asserted beyond generous bounds (a loaded 2-core machine).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.agent.client import AgentError
from orchestrator.proc import wait_until
from tests.control.conftest import MODEL_ID, Env
from tests.support.recovery_rig import ended, pids, three_agents, vanish
from tests.support.sessions import ask, healthy, wait_router_lists


@pytest.fixture
def env3(spawn_agent, start_router, test_model_dir: Path, tmp_path: Path) -> Iterator[Env]:
    yield from three_agents(spawn_agent, start_router, test_model_dir, tmp_path, {}, ("node-a", "node-b", "node-c"))


@pytest.fixture
def env_no_room(spawn_agent, start_router, test_model_dir: Path, tmp_path: Path) -> Iterator[Env]:
    """node-a has no memory to spare (a 1 MiB budget); node-c does not hold the model, and could
    copy it from node-a but has no memory to spare either."""
    yield from three_agents(spawn_agent, start_router, test_model_dir, tmp_path,
                            {"node-a": ("--memory-budget", "1M"), "node-c": ("--memory-budget", "1M")},
                            ("node-a", "node-b"))


def test_a_stage_whose_node_vanished_moves_to_a_spare_node(env3: Env):
    env = env3
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    answer = ask(env)
    before = pids(env, s.id, [0, 1])
    assert before["stage-1"][0] == "node-b"
    node_b, node_c = env.node_id(1), env.node_id(2)
    killed = time.monotonic()
    vanish(env, 1)
    s = ended(env, s.id)
    took = time.monotonic() - killed
    assert s.phase == "running" and s.health == "Healthy", (s.reason, [(x.key, x.state, x.detail) for x in s.timeline])
    assert ask(env) == answer  # Healthy after the move means routed: asked at once, no wait for the router
    assert s.stages[1].node_name == "node-c" and s.stages[1].node_id == node_c
    assert (s.stages[1].first_layer, s.stages[1].last_layer) == (2, 3)
    assert node_b not in s.node_ids
    after = pids(env, s.id, [0, 2])
    assert after["stage-0"] == before["stage-0"] and after["coordinator"] == before["coordinator"]
    assert after["stage-1"][0] == "node-c"
    fault = s.faults[-1]
    assert fault.outcome == "recovered" and fault.processes == ("stage-1",)
    assert "agent unreachable" in fault.post_mortems[0].ended, fault.post_mortems
    steps = {x.key: x for x in s.timeline if x.key.startswith("recovery-1.")}
    move = next(x for k, x in steps.items() if k.endswith("stage-1.move"))
    assert "stage 1 moved to node-c" in move.label and move.state == "done", move
    assert all(x.state == "done" for x in steps.values() if x.key.startswith(move.key.rsplit("stage-1", 1)[0])), \
        [(x.key, x.state, x.detail) for x in steps.values()]
    assert f":{s.stages[1].port}" in s.config_toml and "node-c" not in s.config_toml  # addresses, not names
    assert env.backends() == ["tiny-cluster"]
    assert ask(env) == answer  # stage 0's weights, the new stage 1 and the coordinator agree (greedy)
    print(f"node-b lost -> stage 1 Healthy on node-c in {took:.2f} s (fault seen -> Healthy: {fault.recovery_s} s)")

    # node-b's agent comes back: nothing of the session runs there, and nothing restarts it.
    env.agents[1].restart()
    time.sleep(3)
    stale = [p for p in env.agents[1].client.processes() if p.cluster_id == s.id]
    assert not [p for p in stale if p.alive], stale
    assert env.orch.state.session(s.id).stages[1].node_name == "node-c"
    assert ask(env) == answer
    env.orch.stop_session(s.id)
    env.orch.wait(lambda st: not st.sessions, 60)
    assert env.engine_processes() == [] and env.backends() == []


def test_a_stale_stage_on_a_node_that_was_cut_off_ends_with_its_lease(env3: Env):
    """node-b's agent stops answering (SIGSTOP: a partition) while its stage still runs; stage 1
    moves to node-c. When node-b answers again, its stale stage's lease has run out (the control
    plane no longer renews it there) and its agent stops it; the cluster keeps its answers."""
    env = env3
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    wait_router_lists(env, True)
    answer = ask(env)
    stale_pid = pids(env, s.id, [1])["stage-1"][1]
    env.agents[1].proc.send(signal.SIGSTOP)
    try:
        s = ended(env, s.id)
        assert s.phase == "running" and s.stages[1].node_name == "node-c", (
            s.reason, [(x.key, x.state, x.detail) for x in s.timeline])
        os.kill(stale_pid, 0)  # the stale stage outlived the move: its agent could not stop it
        wait_router_lists(env, True, timeout=30)
        assert ask(env) == answer
    finally:
        env.agents[1].proc.send(signal.SIGCONT)
    wait_router_lists(env, True, timeout=30)
    # ignore: a kept-alive connection to the agent may have been closed while it was frozen
    wait_until(lambda: not any(p.alive for p in env.agents[1].client.processes() if p.cluster_id == s.id), 60,
               message="node-b's agent did not stop its stale stage", ignore=(AgentError,))
    [gone] = [p for p in env.agents[1].client.processes() if p.cluster_id == s.id]
    # Its lease ran out, or the recovery's stop request (sent while it was frozen) came through first.
    assert gone.stop_reason in ("lease expired", "requested"), gone
    print(f"the stale stage on node-b ended: {gone.stop_reason}")
    assert env.orch.state.session(s.id).health == "Healthy"
    assert ask(env) == answer


def test_with_no_node_to_take_the_stage_the_session_is_torn_down_with_the_reason(env_no_room: Env):
    env = env_no_room
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    vanish(env, 1)
    ended(env, s.id)
    st = env.orch.wait(lambda st: not st.sessions, 60)
    s = st.history[-1]
    assert s.phase == "stopped" and s.health == "Unhealthy", s.reason
    assert "recovery failed after 3 attempt(s)" in s.reason and "no registered node can take stage 1" in s.reason
    assert "node-a: " in s.reason and "free, the stage needs" in s.reason, s.reason
    assert "node-c: 1.0 MiB free, the stage needs" in s.reason, s.reason
    assert not any(x.key.endswith(".copy") for x in s.timeline), s.timeline  # nothing copied for nothing
    assert s.faults[-1].outcome == "stopped" and s.faults[-1].attempts == 3
    live = [f"{a.name}:{p.node_id}" for a in (env.agents[0], env.agents[2]) for p in a.client.processes() if p.alive]
    assert live == [] and env.backends() == []
