"""The watcher's verdict on a session (pure): what is a fault, and whom to replace."""

from __future__ import annotations

from orchestrator.agent.schemas import ProcessInfo
from orchestrator.control.coordinator_client import HealthLook, read_health
from orchestrator.control.rules.state import StageProgress, StageStatus
from orchestrator.control.watcher import at_rest, judge
from orchestrator.engine.coordinator.health_report import HealthReport, StageReport
from tests.support.sessions import running_session


def _alive(name: str, port: int) -> ProcessInfo:
    return ProcessInfo(cluster_id="s1", node_id=name, kind="stage", model_id="m", pid=1, alive=True, port=port,
                       port_listening=True, started_at=0, uptime_s=1, lease_remaining_s=10)


def _processes() -> dict:
    return {"stage-0": _alive("stage-0", 40000), "stage-1": _alive("stage-1", 40001),
            "coordinator": _alive("coordinator", 40010)}


def _health(status: str, reason: str = "", state: str = "up") -> HealthLook:
    return HealthLook(report=HealthReport(status=status, ready=status == "ready", reason=reason, stages=(
        StageReport(id="stage-0", address="127.0.0.1:40000", state="up"),
        StageReport(id="stage-1", address="127.0.0.1:40001", state=state))), status=200)


def test_a_coordinator_re_probing_by_itself_is_not_a_fault():
    _, problem, culprits = judge(running_session(), _processes(), _health("warming", "probing the pipeline"))
    assert problem == "" and culprits == ()


def test_a_failed_probe_names_its_stage_and_a_lost_stage_is_its_own_culprit():
    _, problem, culprits = judge(running_session(), _processes(),
                                 _health("unhealthy", "probe generation failed: stage-1: cannot compute"))
    assert "unhealthy" in problem and culprits == ("stage-1",)
    _, problem, culprits = judge(running_session(), _processes(), _health("unhealthy", "stage-1 lost", state="down"))
    assert culprits == ("stage-1",), (problem, culprits)


def test_a_full_server_is_busy_never_a_verdict_and_never_a_fault():
    """A 429 from a coordinator whose connections are full (its body is JSON too) once read as
    "coordinator None: None", with no culprit: the whole cluster was torn down (issue 20)."""
    refusal = (b'{"error": {"message": "this server is at its limit of 480 connections; retry in 1 s", '
               b'"type": "rate_limit_error", "param": null, "code": "too_many_connections"}}')
    look = read_health(429, refusal)
    assert look.busy and look.report is None and look.answered
    _, problem, culprits = judge(running_session(), _processes(), look)
    assert problem == "" and culprits == ()
    # Any other JSON is no verdict either: silence, which the watcher confirms before acting.
    for status, body in ((200, b'{"status": "ready"}'), (503, b'{"error": {"message": "x", "type": "y"}}'),
                         (200, b'{"status": "ready", "ready": false}'), (502, b"<html>"), (200, b"[1, 2]")):
        look = read_health(status, body)
        assert look.report is None and not look.busy, (status, body)
        _, problem, culprits = judge(running_session(), _processes(), look)
        assert "coordinator unreachable" in problem and culprits == ("coordinator",)
    ok = read_health(200, HealthReport(status="ready", ready=True).model_dump_json().encode())
    assert ok.report is not None and ok.report.status == "ready"


def test_a_post_mortem_keeps_the_exit_status_the_stop_observed():
    """A look taken just before the stop saw a `kill -9`ed stage still running (not yet reaped):
    the post-mortem read "still running (faulted): killed" and dropped its SIGKILL (issue 20)."""
    from orchestrator.control.recovery import settled
    from orchestrator.control.rules.state import PostMortem

    before = PostMortem(process="stage-1", node_name="node-1", ended="still running (faulted): killed")
    dead = _alive("stage-1", 40001).model_copy(update={"alive": False, "signal": "SIGKILL"})
    assert settled(before, dead).ended == "killed by SIGKILL"  # it died by itself: the stop found it dead
    stopped = dead.model_copy(update={"signal": "SIGTERM", "stop_reason": "requested"})
    assert settled(before, stopped).ended == "still running (faulted): stopped (killed by SIGTERM)"
    assert settled(before, None) == before  # the stop could not say: the look stands
    exited = PostMortem(process="stage-1", node_name="node-1", ended="killed by SIGKILL")
    assert settled(exited, stopped) == exited  # the look already saw the end


def test_the_coordinators_speculation_counts_go_to_the_last_stage_only():
    """Speculative decoding is verified on the last stage: its card shows the coordinator's counts."""
    look = _health("ready")
    statuses, _, _ = judge(running_session(), _processes(), look)
    assert [s.speculation for s in statuses] == [None, None]  # the cluster does not speculate
    spec = {"max_drafts": 4, "passes": 10, "drafted": 30, "accepted": 12, "refused": False, "refusal": None}
    look = read_health(200, HealthReport(status="ready", ready=True, stages=look.report.stages,
                                         speculation=spec).model_dump_json().encode())
    statuses, problem, _ = judge(running_session(), _processes(), look)
    assert problem == "" and statuses[0].speculation is None
    assert statuses[1].speculation is not None and statuses[1].speculation.model_dump() == spec


def test_a_stage_computing_only_the_coordinators_own_checks_is_shown_idle():
    """Issue 38 item 2: an idle cluster showed "decoding for 2.7 s · 1 queued" — the readiness
    probe and the idle canary as work. With no client's request in flight it is idle."""
    checking = StageProgress(steps=40, busy_s=2.7, request=7, chunk=(12, 1), queued=1)
    statuses = (StageStatus(alive=True, progress=checking), StageStatus(alive=None))
    idle = at_rest(statuses, serving=False)
    assert idle[0].progress == StageProgress(steps=40) and idle[1] == statuses[1]  # the stage cards: "40 steps · idle"
    assert at_rest(statuses, serving=True) == statuses
