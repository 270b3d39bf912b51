"""The session lifecycle with real agents, stage processes, coordinator and router.

Ordered launch → Healthy → chat through the router → Stop; a dying stage is torn down and
deregistered when automatic restarts are off (the time it takes is printed: measured times belong
to e2e/bench_recovery.py, not to an assertion); a dashboard restart re-adopts, repairs or cleans up.
"""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator.proc import wait_until
from tests.control.conftest import MODEL_ID, Env
from tests.support.sessions import ask, healthy, lease_ends, wait_router_lists

DEREGISTERED_S = 30.0  # a bound for a hung teardown, not a target (the target is benchmarked)


def test_launch_serves_through_the_router_then_stop_leaves_nothing(env: Env):
    """Healthy means served: a chat through the router, asked the moment Healthy is seen (no
    wait for the router's probes, no retry), is answered, not refused with 503 "starting"."""
    session = env.orch.launch(env.session(), MODEL_ID)
    s = healthy(env, session.id)
    assert isinstance(ask(env), str)
    assert [st.state for st in s.timeline] == ["done"] * len(s.timeline)
    assert f"routed by {env.router.url}" in s.timeline[-1].detail
    assert env.backends() == ["tiny-cluster"]
    assert sorted(p.split(":")[1] for p in env.engine_processes()) == sorted(
        f"{s.id}/{n}" for n in ("stage-0", "stage-1", "coordinator"))
    env.orch.stop_session(s.id)
    st = env.orch.wait(lambda st: not st.sessions)
    assert st.history[-1].health == "Stopped" and st.history[-1].phase == "stopped"
    assert env.engine_processes() == [] and env.backends() == []


@pytest.mark.parametrize("victim", ["stage-1", "coordinator"])
def test_a_dead_process_marks_unhealthy_and_deregisters(env: Env, victim: str):
    """With automatic restarts off, a fault tears the session down as a whole (with them on,
    see test_recovery): the router entry goes, then every process. The time from the kill to
    the deregistration is printed, not asserted (a loaded machine is not a failure)."""
    env.orch.update_settings(env.orch.state.settings.model_copy(update={"auto_restart": False}))
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    agent = env.agents[1] if victim == "stage-1" else env.agents[0]
    pid = agent.client.process(s.id, victim).pid
    events = env.orch.subscribe()
    killed = time.monotonic()
    import os

    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: "tiny-cluster" not in env.backends(), DEREGISTERED_S, 0.02, message="the deregistration")
    deregistered = time.monotonic() - killed
    st = env.orch.wait(lambda st: not st.sessions, 60)
    ended = st.history[-1]
    assert ended.health == "Unhealthy" and victim in ended.reason
    assert env.engine_processes() == []
    kinds: list[str] = []
    # the state changes before its events reach subscribers: read them as they come
    while "session_removed" not in kinds:
        kinds.append(events.get(timeout=10).kind)
    assert "session_faulted" in kinds
    print(f"stage death -> router deregistration: {deregistered:.2f} s")


def test_restart_re_adopts_a_healthy_session_without_registering_twice(env: Env):
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    env.orch.stop()  # the dashboard goes away; its processes keep serving (until their lease lapses)
    orch2 = env.make_orchestrator()
    st = orch2.wait(lambda st: (st.session(s.id) is not None and st.session(s.id).reason.startswith("re-adopted")), 15)
    assert st.session(s.id).health == "Healthy"
    assert isinstance(ask(env), str)  # re-adopted only once the router routes to it: asked at once
    assert env.backends() == ["tiny-cluster"]
    first = lease_ends(env, s.id)
    assert len(first) == 3, first
    # The new watcher extends every lease (every third of the 6 s lease): seen on the agents'
    # own lease clocks, with no need to sleep past a lease to know it would have lapsed.
    wait_until(lambda: (now := lease_ends(env, s.id)).keys() == first.keys()
               and all(now[k] > first[k] + 1.0 for k in first), 15, 0.2, message="every lease renewed")
    assert orch2.state.session(s.id).phase == "running" and len(env.engine_processes()) == 3


def test_restart_repairs_a_session_that_broke_while_it_was_down(env: Env):
    """A stage lost while the dashboard was away is replaced when it comes back (the others
    keep their processes), as if the fault had been seen live."""
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    before = {p.node_id: p.pid for a in env.agents for p in a.client.processes() if p.alive}
    env.orch.stop()
    env.agents[1].client.stop_process(s.id, "stage-1", 5)
    orch2 = env.make_orchestrator()
    st = orch2.wait(lambda st: (x := st.session(s.id)) is not None and x.faults
                    and x.faults[-1].outcome == "recovered", 60)
    x = st.session(s.id)
    assert x.health == "Healthy" and "dashboard restart" in x.faults[-1].reason, x.faults[-1]
    after = {p.node_id: p.pid for a in env.agents for p in a.client.processes() if p.alive}
    assert after["stage-0"] == before["stage-0"] and after["coordinator"] == before["coordinator"]
    assert env.backends() == ["tiny-cluster"]
    wait_router_lists(env, True, timeout=30)
    assert isinstance(ask(env), str)


def test_restart_cleans_up_a_broken_session_when_restarts_are_off(env: Env):
    env.orch.update_settings(env.orch.state.settings.model_copy(update={"auto_restart": False}))
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    env.orch.stop()
    env.agents[1].client.stop_process(s.id, "stage-1", 5)
    orch2 = env.make_orchestrator()
    st = orch2.wait(lambda st: not st.sessions, 30)
    assert "restart" in st.history[-1].reason and "stage-1" in st.history[-1].reason
    assert env.engine_processes() == [] and env.backends() == []


def test_removing_a_node_that_serves_a_session_is_refused(env: Env):
    from orchestrator.control.core import CommandRefused

    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    with pytest.raises(CommandRefused, match="serves tiny-cluster"):
        env.orch.remove_node(env.node_id(1))
    assert env.orch.state.node(env.node_id(1)) is not None
    env.orch.stop_session(s.id)
    env.orch.wait(lambda st: not st.sessions)
    env.orch.remove_node(env.node_id(1))
    assert env.orch.state.node(env.node_id(1)) is None
