"""Failure injection for every launch step: each ends with zero engine processes on every
node and zero router entries, and the timeline names the failing step."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from orchestrator.control.launcher import Timeouts
from orchestrator.proc import wait_until
from orchestrator.registrar import ConfigFileRegistrar
from tests.control.conftest import MODEL_ID, Env


def failed(env: Env, orch, session_id: str, timeout: float = 90.0):
    st = orch.wait(lambda st: not any(s.id == session_id for s in st.sessions), timeout)
    s = st.session(session_id)
    assert s.phase == "failed" and s.health == "Stopped", s
    steps = {x.key: x for x in s.timeline}
    bad = [x for x in s.timeline if x.state == "failed"]
    assert len(bad) == 1, [(x.key, x.state) for x in s.timeline]
    before = s.timeline[: s.timeline.index(bad[0])]
    assert all(x.state == "rolled_back" for x in before)
    assert all(x.state == "skipped" for x in s.timeline[s.timeline.index(bad[0]) + 1:])
    return bad[0], steps


def nothing_left(env: Env, within: float = 0.0, quiet_s: float = 0.0) -> None:
    """No engine process on any agent and no backend, by `within` seconds; with `quiet_s`, none seen
    for that long in a row (a process that appears late, and is stopped later, does not pass)."""
    deadline = time.monotonic() + within
    empty_since = None
    while time.monotonic() < deadline:
        if env.engine_processes():
            empty_since = None
        elif empty_since is None:
            empty_since = time.monotonic()
        if empty_since is not None and time.monotonic() - empty_since >= quiet_s:
            break
        time.sleep(0.2)
    assert env.engine_processes() == []
    assert env.backends() == []


def when_step(orch, key: str, state: str, action) -> threading.Thread:
    """Run action(session_id) in the background as soon as step `key` reaches `state`."""
    events = orch.subscribe()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            e = events.get(timeout=60)
            if e.kind == "launch_stepped" and e.key == key and e.state == state:
                action(e.session_id)
                return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_a_stage_that_cannot_bind_its_port(env: Env):
    session = env.session()
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", session.stages[1].port))
    blocker.listen(1)
    try:
        step, _ = failed(env, env.orch, env.orch.launch(session, MODEL_ID).id)
    finally:
        blocker.close()
    assert step.key.startswith("stage-1."), step
    assert str(session.stages[1].port) in step.detail or "in use" in step.detail, step
    nothing_left(env)


def test_a_stage_that_crashes_while_loading(env: Env):
    for f in (env.agents[1].models_dir / MODEL_ID).glob("*.safetensors"):
        f.write_bytes(b"not a safetensors file")
    step, _ = failed(env, env.orch, env.orch.launch(env.session(), MODEL_ID).id)
    assert step.key == "stage-1.listen" and "exited" in step.detail, step
    nothing_left(env)


def test_a_coordinator_that_never_becomes_healthy(env: Env):
    env.orch.stop()
    orch = env.make_orchestrator(timeouts=Timeouts(listen=60, healthy=4, stop=3))

    def freeze_stage_1(session_id: str) -> None:
        os.kill(env.agents[1].client.process(session_id, "stage-1").pid, signal.SIGSTOP)

    when_step(orch, "stage-1.listen", "done", freeze_stage_1)
    step, _ = failed(env, orch, orch.launch(env.session(), MODEL_ID).id)
    assert step.key == "coordinator.healthy" and "not healthy after 4 s" in step.detail, step
    nothing_left(env)


@pytest.fixture
def stage_1_cannot_compute(monkeypatch):
    """Agents started after this pass the fault on to the engine processes they start."""
    monkeypatch.setenv("PIPESERVE_FAULTS", "stage-1:step-error")


def test_a_stage_that_loads_but_cannot_serve(stage_1_cannot_compute, env: Env):
    """Ready means serving: the coordinator's probe fails on stage-1, and the launch fails at
    once (not after the health timeout) with the stage's error in the timeline."""
    step, _ = failed(env, env.orch, env.orch.launch(env.session(), MODEL_ID).id)
    if "Address already in use" in step.detail:  # the free port picked for the coordinator was taken
        nothing_left(env)                        # meanwhile (not this test's subject): once more
        again = env.session().model_copy(update={"coordinator_port": env.agents[0].port_at(2)})
        step, _ = failed(env, env.orch, env.orch.launch(again, MODEL_ID).id)
    assert step.key == "coordinator.healthy", step
    # the probe's own failure, not the health timeout's "did not become ready": it failed at once
    assert "cannot serve" in step.detail and "stage-1" in step.detail and "cannot compute" in step.detail, step
    nothing_left(env)


def test_a_router_that_rejects_registration(env: Env, tmp_path):
    broken = tmp_path / "broken-router.yaml"
    broken.write_text("backends: [unclosed\n")
    env.orch.stop()
    orch = env.make_orchestrator(registrar=ConfigFileRegistrar(broken))
    step, _ = failed(env, orch, orch.launch(env.session(), MODEL_ID).id)
    assert step.key == "router.register", step
    assert broken.read_text() == "backends: [unclosed\n"  # a file it cannot parse is never overwritten
    nothing_left(env)


def test_a_router_that_never_routes_to_the_session(env: Env):
    """The entry is written but the router's probe of it never passes (here: its health endpoint
    answers 404): the launch fails at router.register, saying which router, which backend and
    what the router last reported of it, and leaves nothing behind."""
    import yaml

    doc = yaml.safe_load(env.router_yaml.read_text())
    doc["health_checks"]["endpoint"] = "/no-such-endpoint"
    env.router_yaml.write_text(yaml.safe_dump(doc))
    wait_until(lambda: env.router.health()["health_checks"]["endpoint"] == "/no-such-endpoint", 30, 0.1,
               message="the router to reload its health checks")
    env.orch.stop()
    orch = env.make_orchestrator(timeouts=Timeouts(listen=60, healthy=60, stop=5, routable=5))
    step, _ = failed(env, orch, orch.launch(env.session(), MODEL_ID).id)
    assert step.key == "router.register", step
    assert f"the router at {env.router.url} does not route to backend 'tiny-cluster'" in step.detail, step
    assert "after 5 s" in step.detail and "HTTP 404" in step.detail, step
    nothing_left(env)


def test_an_agent_that_becomes_unreachable(env: Env):
    agent_b = env.agents[1]

    def freeze_agent_b(_session_id: str) -> None:
        agent_b.proc.send(signal.SIGSTOP)

    # Frozen once stage 0 is started on agent a: its listen wait (a stage loading its layers) lies between
    # that and the start request to agent b. Frozen on stage-0.listen instead, the freeze (from a watching
    # thread) raced that request, and on a loaded machine stage 1 sometimes started first.
    when_step(env.orch, "stage-0.start", "done", freeze_agent_b)
    try:
        step, _ = failed(env, env.orch, env.orch.launch(env.session(), MODEL_ID).id)
        assert step.key == "stage-1.start" and "unreachable" in step.detail, step
        assert [p for p in env.agents[0].client.processes() if p.alive] == []
    finally:
        agent_b.proc.send(signal.SIGCONT)
    # The frozen agent may still act on the start request it had queued, a moment after it resumes
    # (once right after the check above had found nothing); nobody renews that lease, so the agent
    # itself stops the process when it lapses (6 s here): nothing seen for longer than a lease.
    nothing_left(env, within=60, quiet_s=12)
