"""Sessions: one row per serving session; a cluster is one row with a Cluster badge (pure)."""

from __future__ import annotations

from typing import Any

from orchestrator.control.state import Session, State

from .charts import step_chart, throughput_chart
from .context import ViewContext


def stage_rows(s: Session) -> list[dict[str, Any]]:
    """Per-stage breakdown shared by the live monitor and the Cluster stages tab."""
    rows = []
    ended = s.phase in ("stopped", "failed")  # what was last seen is history: the processes are gone
    for st in s.stages:
        status = s.stage_status[st.index] if st.index < len(s.stage_status) else None
        rows.append({
            "index": st.index, "node": st.node_name, "layers": f"{st.first_layer}–{st.last_layer}",
            "port": st.port,
            "alive": None if status is None else status.alive,
            "listening": None if status is None else status.port_listening,
            "step_ms": None if status is None or status.step_ms is None or ended else round(status.step_ms, 2),
            "detail": "" if status is None else status.detail,
            "chart": step_chart(s, st.index), "ended": ended,
        })
    return rows


def session_row(s: Session) -> dict[str, Any]:
    """One Sessions row."""
    return {"id": s.id, "name": s.name, "model": s.model_name, "cluster": s.cluster, "health": s.health,
            "phase": s.phase, "reason": s.reason, "url": s.url, "stages": stage_rows(s),
            "throughput": throughput_chart(s), "config": s.config_toml,
            "nodes": ", ".join(dict.fromkeys(st.node_name for st in s.stages))}


def sessions_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """Live sessions (launching, running, stopping)."""
    return {"sessions": [session_row(s) for s in state.sessions]}
