"""Replacing one faulted process while the others keep their processes (same PIDs) and weights.

Real agents, stage processes, coordinator and router. Timing is printed, never asserted
beyond generous bounds (a loaded 2-core machine).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from orchestrator.control.rules.state import Settings
from tests.control.conftest import MODEL_ID, Env
from tests.support.sessions import ask, healthy, pids, wait_router_lists


def recovered(env: Env, session_id: str, timeout: float = 120.0):
    """Wait for the fault to be seen, then for Healthy again; returns the session."""
    env.orch.wait(lambda st: (s := st.session(session_id)) is not None and len(s.faults) >= 1, timeout)
    st = env.orch.wait(lambda st: (s := st.session(session_id)) is not None and s.phase != "recovering"
                       and s.faults[-1].outcome != "recovering", timeout)
    s = st.session(session_id)
    assert s.phase == "running" and s.health == "Healthy", (s.reason, [(x.key, x.state, x.detail) for x in s.timeline])
    return s


@pytest.mark.parametrize("victim", ["stage-1", "stage-0", "coordinator"])
def test_a_killed_process_is_replaced_and_the_others_keep_their_pids(env: Env, victim: str):
    """Healthy again means served again: asked the moment the recovery ended, the router routes the
    chat (the attempt's router.register step waited for it), with no wait in the test."""
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    answer = ask(env)
    before = pids(env, s.id)
    killed = time.monotonic()
    os.kill(before[victim], signal.SIGKILL)
    s = recovered(env, s.id)
    took = time.monotonic() - killed
    after = pids(env, s.id)
    assert after[victim] != before[victim]
    assert {k: v for k, v in after.items() if k != victim} == {k: v for k, v in before.items() if k != victim}
    fault = s.faults[-1]
    assert fault.outcome == "recovered" and fault.processes == (victim,) and fault.recovery_s is not None
    [mortem] = fault.post_mortems
    assert mortem.process == victim and "SIGKILL" in mortem.ended, mortem
    assert mortem.log_tail, "the post-mortem keeps the process's last output"
    steps = [x for x in s.timeline if x.key.startswith("recovery-1.1.")]
    assert steps and all(x.state == "done" for x in steps), [(x.key, x.state, x.detail) for x in steps]
    assert ask(env) == answer  # the survivors' weights and the new process agree: same greedy answer
    assert env.backends() == ["tiny-cluster"]
    print(f"{victim}: kill -9 -> Healthy again in {took:.2f} s (fault seen -> Healthy: {fault.recovery_s} s)")


def test_during_a_recovery_the_router_answers_503_with_retry_after_not_404(env: Env):
    """The backend stays registered while its pipeline is repaired: through the real router a
    client gets 503 + Retry-After ("come back soon"), never 404 "model not found"."""
    import requests

    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    wait_router_lists(env, True)
    os.kill(pids(env, s.id)["stage-1"], signal.SIGKILL)
    env.orch.wait(lambda st: st.session(s.id).phase == "recovering", 30)
    seen: list[tuple[int, str | None, str]] = []
    deadline = time.monotonic() + 120
    while env.orch.state.session(s.id).phase == "recovering" and time.monotonic() < deadline:
        assert env.backends() == ["tiny-cluster"], "the router entry stays during a recovery"
        r = requests.post(env.router.url + "/v1/completions", timeout=30,
                          json={"model": MODEL_ID, "prompt": "hi", "max_tokens": 2, "temperature": 0})
        seen.append((r.status_code, r.headers.get("Retry-After"), r.text[:200]))
        time.sleep(0.05)
    s = recovered(env, s.id)
    assert not [x for x in seen if x[0] not in (200, 503)], seen  # no 404, no 5xx but 503
    unavailable = [x for x in seen if x[0] == 503]
    assert unavailable, seen
    assert all(retry and int(retry) > 0 for _, retry, _ in unavailable), unavailable
    print(f"{len(unavailable)} x 503 + Retry-After, {len(seen) - len(unavailable)} x 200 during the recovery")
    wait_router_lists(env, True, timeout=30)
    assert ask(env)


@pytest.fixture
def stage_1_wedges(monkeypatch):
    """stage-1 serves the probe and a little more, then its compute thread blocks forever."""
    monkeypatch.setenv("PIPESERVE_FAULTS", "stage-1:step-hang@25")
    monkeypatch.setenv("PIPESERVE_STALL_TIMEOUT_S", "2")
    monkeypatch.setenv("PIPESERVE_CANARY_INTERVAL_S", "600")
    # its replacement wedges again (the same fault): the answer in flight fails instead of being held
    monkeypatch.setenv("PIPESERVE_RESUME_DEADLINE_S", "0")


def test_a_wedged_stage_is_replaced_with_its_post_mortem(stage_1_wedges, env: Env):
    import openai

    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    wait_router_lists(env, True)
    before = pids(env, s.id)
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as failure:
        client.completions.create(model=MODEL_ID, prompt="hello", max_tokens=200, temperature=0)
    print(f"in-flight request failed after {time.monotonic() - started:.2f} s: {failure.value.message}")
    assert "wedged" in str(failure.value.message)
    s = recovered(env, s.id)
    fault = s.faults[0]
    assert fault.processes == ("stage-1",) and "wedged" in fault.reason, fault
    [mortem] = fault.post_mortems
    assert mortem.ended.startswith("still running") and "wedged" in mortem.ended, mortem
    # busy_s is the last PONG's, read a moment before the verdict (no progress for 2 s)
    assert mortem.progress is not None and mortem.progress.busy_s > 1, mortem
    after = pids(env, s.id)
    assert after["stage-0"] == before["stage-0"] and after["coordinator"] == before["coordinator"]
    assert after["stage-1"] != before["stage-1"]
    env.orch.stop_session(s.id)
    env.orch.wait(lambda st: not st.sessions, 60)
    assert env.engine_processes() == [] and env.backends() == []


def test_a_stage_that_cannot_come_back_is_torn_down_after_its_attempts(env: Env):
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    for f in (env.agents[1].models_dir / MODEL_ID).glob("*.safetensors"):
        f.write_bytes(b"not a safetensors file")  # a restarted stage-1 crashes while loading
    os.kill(pids(env, s.id)["stage-1"], signal.SIGKILL)
    st = env.orch.wait(lambda st: not st.sessions, 120)
    ended = st.history[-1]
    assert ended.health == "Unhealthy" and "recovery failed after 3 attempt(s)" in ended.reason, ended.reason
    assert ended.faults[-1].outcome == "stopped" and ended.faults[-1].attempts == 3
    failed = [x for x in ended.timeline if x.key.startswith("recovery-") and x.state == "failed"]
    assert len(failed) == 3 and all(".stage-1.listen" in x.key for x in failed), failed
    assert env.engine_processes() == [] and env.backends() == []


def test_with_automatic_restarts_off_a_fault_tears_the_session_down(env: Env):
    env.orch.update_settings(env.orch.state.settings.model_copy(update={"auto_restart": False}))
    assert isinstance(env.orch.state.settings, Settings)
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    os.kill(pids(env, s.id)["stage-1"], signal.SIGKILL)
    st = env.orch.wait(lambda st: not st.sessions, 60)
    ended = st.history[-1]
    assert "automatic restarts are off" in ended.reason and ended.faults[-1].outcome == "stopped"
    assert env.engine_processes() == [] and env.backends() == []


def test_a_replayed_move_to_a_dead_address_is_undone_by_the_recovery(env: Env):
    """Issue 20, item 3: a signed stage-address move to a dead address (here sent as an
    attacker replaying a captured move would) made the coordinator dial it; recovery restarted
    the stage in place but never re-sent its address, and the cluster stayed down 6 minutes.
    A recovery now always tells the coordinator where the stage is."""
    import requests

    from orchestrator.engine.stage_address import ROUTE_PATH, SIGNATURE_HEADER, request_body, sign

    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    wait_router_lists(env, True)
    answer = ask(env)
    secret = env.orch.secrets.get(s.id)
    assert secret
    body = request_body(1, "127.0.0.1:9", time.time())
    r = requests.post(s.url + ROUTE_PATH, data=body, timeout=10,
                      headers={SIGNATURE_HEADER: sign(secret.encode(), body)})
    assert r.status_code == 200  # it is signed and fresh: the coordinator takes it
    s = recovered(env, s.id)
    assert s.faults[-1].outcome == "recovered" and "stage-1" in s.faults[-1].processes, s.faults[-1]
    wait_router_lists(env, True, timeout=30)
    assert ask(env) == answer
