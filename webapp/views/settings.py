"""Settings → Advanced → Distributed serving (pure view model)."""

from __future__ import annotations

from typing import Any

from orchestrator.control.rules.state import State
from webapp.views.context import ViewContext

TRANSPORTS = (
    ("tcp", "tcp — works everywhere"),
    ("thunderbolt", "thunderbolt — all-Apple-Silicon local clusters"),
    ("rdma", "rdma — optional fast path (falls back to tcp)"),
)


def settings_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """The form's current values and choices."""
    s = state.settings
    return {"settings": s, "transports": TRANSPORTS, "port_count": s.port_end - s.port_start + 1}
