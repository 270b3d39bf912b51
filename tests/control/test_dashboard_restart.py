"""A dashboard restart never loses a cluster (issue 38 item 1), with real agents, stage
processes, coordinator and router.

The control plane stops for longer than the engines' lease: the agents stop every process.
The returning control plane renews what it can first, counts what it could not renew as gone,
and relaunches the whole session in the launch's order under the same plan — the timeline
says so — instead of replacing the coordinator alone (which once waited for stages that no
longer existed, three attempts, then a teardown).
"""

from __future__ import annotations

import logging

import pytest

from orchestrator.agent.schemas import ProcessInfo
from orchestrator.control.rules.process_ends import LAPSED, ended, lapsed
from orchestrator.proc import wait_until
from tests.control.conftest import MODEL_ID, Env
from tests.support.sessions import ask, healthy, pids

GONE_S = 60.0  # a 6 s lease lapses and the agents stop every process (SIGTERM grace included): a bound


def test_a_session_whose_leases_ran_out_while_the_dashboard_was_away_is_relaunched_and_answers_the_same(
        env: Env, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="pipeserve")
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    before = ask(env, "What is the capital of France?")
    first = pids(env, s.id)
    env.orch.stop()  # the dashboard goes away for longer than the lease
    wait_until(lambda: not pids(env, s.id), GONE_S, 0.2, message="the agents stopping every process at the lease's end")
    orch2 = env.make_orchestrator()
    st = orch2.wait(lambda st: (x := st.session(s.id)) is not None and x.faults
                    and x.faults[-1].outcome in ("recovered", "stopped"), 120)
    x = st.session(s.id)
    assert x.faults[-1].outcome == "recovered" and x.health == "Healthy", (x.reason, x.timeline)
    assert x.faults[-1].relaunch and x.faults[-1].processes == ("stage-0", "stage-1", "coordinator")
    assert x.reason.startswith("relaunched after a dashboard restart"), x.reason
    steps = [t for t in x.timeline if t.key.startswith("recovery-1.1.")]
    assert steps and all(t.state == "done" and t.label.startswith("Relaunch after the dashboard's restart")
                         for t in steps), [(t.label, t.state, t.detail) for t in steps]
    after = pids(env, s.id)
    assert set(after) == {"stage-0", "stage-1", "coordinator"} and not set(after.values()) & set(first.values())
    assert env.backends() == ["tiny-cluster"]  # the entry stayed: never registered twice
    assert ask(env, "What is the capital of France?") == before  # the same plan answers the same, greedy
    # The log tells an admin the whole story, greppable by session (issue 38 item 6)
    lines = [(r.getMessage(), r.fields) for r in caplog.records if getattr(r, "fields", {}).get("session") == s.id]
    names = [name for name, _ in lines]
    for name in ("session.created", "launch.step", "session.found_after_restart", "session.seen_after_restart",
                 "session.faulted", "session.post_mortem", "recovery.step", "session.recovered"):
        assert name in names, (name, names)
    assert ("command.accepted", "LaunchSession") in [(n, f.get("command")) for n, f in lines]
    assert ("command.accepted", "ResumeSession") in [(n, f.get("command")) for n, f in lines]
    started = [(f["step"], f["node"]) for n, f in lines if n == "recovery.step" and f["state"] == "done"
               and f["step"].endswith(".start")]
    assert started == [("stage-0.start", "node-a"), ("stage-1.start", "node-b"), ("coordinator.start", "node-a")]


def _info(name: str, alive: bool = True, **kw) -> ProcessInfo:
    return ProcessInfo(cluster_id="s1", node_id=name, kind="stage", model_id="m", pid=1, alive=alive, port=1,
                       port_listening=alive, started_at=0, uptime_s=1, lease_remaining_s=1 if alive else None, **kw)


@pytest.mark.parametrize("renewed, gone", [
    ({"n0": {"stage-0", "coordinator"}, "n1": {"stage-1"}}, []),  # every lease extended: all alive
    ({"n0": {"coordinator"}, "n1": {"stage-1"}}, ["stage-0"]),  # still listed, not renewable: being stopped
    ({"n0": set(), "n1": set()}, ["stage-0", "stage-1", "coordinator"]),  # the agents answered 404: none runs
    ({"n0": None, "n1": set()}, ["stage-1"]),  # n0's agent did not answer: nothing known, nothing assumed
])
def test_a_process_whose_lease_could_not_be_renewed_counts_as_gone(renewed, gone):
    processes = {"stage-0": _info("stage-0"), "stage-1": _info("stage-1"), "coordinator": _info("coordinator")}
    node_of = {"stage-0": "n0", "stage-1": "n1", "coordinator": "n0"}
    seen = lapsed(processes, renewed, node_of)
    assert [k for k, v in seen.items() if not v.alive] == gone
    assert all(seen[k].stop_reason == LAPSED for k in gone)


@pytest.mark.parametrize("kw, words", [
    ({"signal": "SIGKILL"}, "killed by SIGKILL"),
    ({"exit_code": 3}, "exit status 3"),
    ({"stop_reason": "lease expired", "exit_code": 0}, "lease expired, exit status 0"),
    ({"stop_reason": "requested", "signal": "SIGTERM"}, "stopped, killed by SIGTERM"),
    ({}, "ended, status unknown"),
])
def test_how_a_process_ended_is_said_in_words_never_none(kw, words):
    assert ended(_info("stage-0", alive=False, **kw)) == words
