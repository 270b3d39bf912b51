"""The watcher's verdict on a session (pure): what is a fault, and whom to replace."""

from __future__ import annotations

from orchestrator.agent.schemas import ProcessInfo
from orchestrator.control.state import Session, StagePlacement
from orchestrator.control.watcher import judge


def _session() -> Session:
    stages = tuple(StagePlacement(index=k, node_id=f"n{k}", node_name=f"node-{k}", first_layer=2 * k,
                                  last_layer=2 * k + 1, host="127.0.0.1", port=40000 + k) for k in range(2))
    return Session(id="s1", name="c", model_id="m", model_name="m", cluster=True, stages=stages,
                   coordinator_node="n0", coordinator_host="127.0.0.1", coordinator_port=40010)


def _alive(name: str, port: int) -> ProcessInfo:
    return ProcessInfo(cluster_id="s1", node_id=name, kind="stage", model_id="m", pid=1, alive=True, port=port,
                       port_listening=True, started_at=0, uptime_s=1, lease_remaining_s=10)


def _processes() -> dict:
    return {"stage-0": _alive("stage-0", 40000), "stage-1": _alive("stage-1", 40001),
            "coordinator": _alive("coordinator", 40010)}


def _health(status: str, reason: str = "", state: str = "up") -> dict:
    return {"status": status, "reason": reason, "stages": [{"id": "stage-0", "state": "up"},
                                                          {"id": "stage-1", "state": state}]}


def test_a_coordinator_re_probing_by_itself_is_not_a_fault():
    _, problem, culprits = judge(_session(), _processes(), _health("warming", "probing the pipeline"), "")
    assert problem == "" and culprits == ()


def test_a_failed_probe_names_its_stage_and_a_lost_stage_is_its_own_culprit():
    _, problem, culprits = judge(_session(), _processes(),
                                 _health("unhealthy", "probe generation failed: stage-1: cannot compute"), "")
    assert "unhealthy" in problem and culprits == ("stage-1",)
    _, problem, culprits = judge(_session(), _processes(), _health("unhealthy", "stage-1 lost", state="down"), "")
    assert culprits == ("stage-1",), (problem, culprits)
