"""Nodes: registered peers with status, and discovered ones waiting for registration (pure)."""

from __future__ import annotations

from typing import Any

from orchestrator.agent.device_schemas import MEMORY_WORDS
from orchestrator.control.rules.state import State
from orchestrator.control.rules.transitions import serving_node_ids
from webapp.views.context import ViewContext
from webapp.views.format import size, unsupported_text
from webapp.views.sessions import session_state


def nodes_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """Rows for the node table and the discovered list."""
    busy = serving_node_ids(state)
    # what the node's sessions do there: Serving only once healthy, Stopping as soon as stopped
    doing = {nid: session_state(s) for s in state.sessions for nid in s.node_ids}
    rows = []
    for n in state.nodes:
        r = n.report
        rows.append({
            "id": n.id, "name": n.name, "url": n.url, "status": n.status, "error": n.error,
            # the family, and mlx's backend where the agent reports it (the homogeneous-cluster rule compares both)
            "accelerator": (r.accelerator.family + (f" · mlx {r.runtime.backend or 'does not load'}" if r.runtime
                                                    else "")) if r else "–",
            "free_memory": size(r.memory.free_bytes) if r else "–",
            "memory_words": MEMORY_WORDS.get(r.memory.kind, "memory") if r else "memory",
            "models": [{"id": m.id, "supported": m.supported, "reason": unsupported_text(m)} for m in r.models]
                      if r else [],
            "version": r.version if r else "–",
            "serving": n.id in busy, "session_state": doing.get(n.id, ""),
        })
    discovered = [{"fingerprint": d.fingerprint, "name": d.name, "url": d.url, "accelerator": d.accelerator,
                   "address": d.url.split("://", 1)[-1]} for d in state.discovered]
    return {"nodes": rows, "discovered": discovered}
