"""A hand-made control-plane State with every kind of content, for rendering tests (pure)."""

from __future__ import annotations

from orchestrator.control.rules.state import (
    DiscoveredNode,
    NodePreparation,
    Preparation,
    PreviewedPlan,
    Sample,
    Session,
    Settings,
    StageStatus,
    State,
)
from orchestrator.control.rules.timelines import timeline
from orchestrator.units import format_bytes
from tests.support.builders import node, session

MB = 1 << 20  # MiB: the dashboard shows binary units (orchestrator.units)


def plan(kind: str = "plan") -> PreviewedPlan:
    """A previewed 2-stage plan (or the refused attempt), built from the planner's JSON."""
    def stage(i: int, first: int, last: int, free: int) -> dict:
        return {"stage": i, "node_id": f"n{i}", "node_name": f"node-{'ab'[i]}", "host": "10.0.0.1",
                "first_layer": first, "last_layer": last, "holds_embedding": True, "holds_head": i == 1,
                "runs_coordinator": i == 0, "weight_bytes": 350 * MB, "kv_cache_bytes": 200 * MB,
                "overhead_bytes": 250 * MB, "total_bytes": 800 * MB, "free_bytes": free,
                "fit_fraction": 800 * MB / free, "token_bytes": 1, "transport_port": 39601 + i}
    doc = {"model_id": "smol", "node_ids": ["n0", "n1"], "context_length": 2048, "kind": kind, "model": "smol",
           "stages": [stage(0, 0, 16, 900 * MB), stage(1, 17, 29, 600 * MB if kind != "plan" else 900 * MB)]}
    if kind == "plan":
        doc.update(num_layers=30, manual=False, ports={"n0": [39601, 39610, 39611], "n1": [39602]},
                   coordinator={"node_id": "n0", "host": "10.0.0.1", "transport_port": 39610, "http_port": 39611},
                   settings={"context_length": 2048})
        doc["warnings"] = [{"code": "imbalanced", "message": "stage 1 does most of the work"}]
    else:
        message = f"stage 1 needs {format_bytes(800 * MB)}, node-b has {format_bytes(600 * MB)} free"
        doc["reasons"] = [{"code": "stage_does_not_fit", "message": message}]
    return PreviewedPlan.model_validate(doc)


def cluster(sid: str = "s1", phase: str = "running", health: str = "Healthy") -> Session:
    """A 2-stage cluster session with a launch timeline and ~20 s of samples."""
    s = session(sid, phase, f"smol-2stage-{sid}", splits=((0, 16), (17, 29)), host="10.0.0.1", health=health,
                reason="serving", config_toml="[cluster]\nname = \"smol-2stage\"\n")
    steps = tuple(st.model_copy(update={"state": "done"}) for st in timeline(s))
    samples = tuple(Sample(at=1000.0 + k / 2, tokens_per_s=float(k % 7), step_ms=(20.0 + k % 3, 30.0))
                    for k in range(40))
    status = (StageStatus(alive=True, port_listening=True, step_ms=21.0),
              StageStatus(alive=True, port_listening=True, step_ms=30.0))
    return s.model_copy(update={"timeline": steps, "samples": samples, "stage_status": status})


def failed_cluster() -> Session:
    """A launch that failed at stage 1's transport and rolled back stage 0."""
    s = cluster("s0", phase="failed", health="Stopped")
    states = ["rolled_back", "rolled_back", "rolled_back", "failed", "skipped", "skipped", "skipped"]
    steps = tuple(st.model_copy(update={"state": state,
                                        "detail": "Address already in use" if state == "failed" else ""})
                  for st, state in zip(s.timeline, states))
    return s.model_copy(update={"timeline": steps, "samples": (), "stage_status": (),
                                "reason": "launch failed at “Stage 1 transport listening on port 39602”"})


def rich_state() -> State:
    """Every component has something to show."""
    nodes = (node("node-a", 900 * MB, models=["smol", "big.gguf"]), node("node-b", 900 * MB),
             node("node-c", 900 * MB, reachable=False))
    prep = Preparation(model_id="smol", finished=False, nodes=(
        NodePreparation(node_id="n0", status="present", verdict="present", done_bytes=540 * MB, total_bytes=540 * MB),
        NodePreparation(node_id="n1", status="downloading", verdict="needs_download", done_bytes=200 * MB,
                        total_bytes=540 * MB, rate_bps=100 * MB, source="node-a")))
    return State(settings=Settings(distributed_enabled=True), nodes=nodes,
                 discovered=(DiscoveredNode(fingerprint="d1", name="node-d", url="http://10.0.0.9:39500",
                                            accelerator="linux-cpu"),),
                 sessions=(cluster(),), history=(failed_cluster(),), preparation=prep, plan=plan(), version=7)
