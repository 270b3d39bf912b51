"""A session's cluster TOML, for sessions without a plan's own (pure).

Single-node sessions and recoveries of them have no plan's TOML: this builds one from the
session's placements, validated as the engine's ClusterConfig and written by the planner's
one TOML writer, so a bug fails before anything starts.
"""

from __future__ import annotations

from orchestrator.control.rules.state import Session
from orchestrator.engine.config import ClusterConfig
from orchestrator.planner.cluster_toml import engine_address, render_cluster_toml


def cluster_toml(session: Session, transport: str = "tcp", **limits: int) -> str:
    """The engine's cluster TOML (docs/architecture.md, "Contracts"; `engine/config.py`) for a
    session without a plan's TOML (single-node sessions); validated as a ClusterConfig and
    written by the planner's one TOML writer. `limits`: context_length and max_requests, the
    bounds a single-node session's memory check used (planning.single_session), and the
    dashboard's speculative_tokens."""
    nodes: list[dict[str, object]] = [{"id": "coordinator", "role": "hybrid",
                                       "address": engine_address(session.coordinator_host, session.coordinator_port)}]
    nodes += [{"id": f"stage-{st.index}", "role": "pipeline_stage", "address": engine_address(st.host, st.port),
               "stage": st.index, "layers": f"{st.first_layer}-{st.last_layer}"} for st in session.stages]
    config = ClusterConfig.model_validate({"cluster": {
        "name": session.name, "pipeline_parallel_size": len(session.stages), "tensor_parallel_size": 1,
        "transport_backend": transport, **limits}, "nodes": nodes})  # a bug here fails before anything starts
    return render_cluster_toml(config)
