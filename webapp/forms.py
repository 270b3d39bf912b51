"""Parsing and validating form input (pure): bad input raises FormError and changes nothing."""

from __future__ import annotations

from orchestrator.control.rules.state import Settings


class FormError(ValueError):
    """A user-facing message about bad input."""


def integer(form: dict, name: str, label: str, low: int, high: int) -> int:
    """An integer field within [low, high]."""
    raw = (form.get(name) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise FormError(f"{label}: enter a whole number") from None
    if not low <= value <= high:
        raise FormError(f"{label}: must be between {low} and {high}")
    return value


def settings_from(form: dict, stages_needed: int = 2) -> Settings:
    """Settings from the Distributed serving form."""
    transport = form.get("transport_backend", "tcp")
    if transport not in ("tcp", "thunderbolt", "rdma"):
        raise FormError(f"Default transport backend: unknown value {transport!r}")
    start = integer(form, "port_start", "Transport port range start", 1024, 65535)
    end = integer(form, "port_end", "Transport port range end", 1024, 65535)
    if start > end:
        raise FormError("Transport port range: the start must not exceed the end")
    # each node needs a port per stage plus the coordinator's two on the first node
    if end - start + 1 < stages_needed + 2:
        raise FormError(f"Transport port range: needs at least {stages_needed + 2} ports for {stages_needed} stages")
    attempts = integer(form, "restart_attempts", "Restart attempts", 1, 10) if form.get("restart_attempts") else 3
    drafts = integer(form, "speculative_tokens", "Speculative decoding", 0, 16) if form.get("speculative_tokens") else 0
    return Settings(distributed_enabled=form.get("distributed_enabled") in ("on", "true", "1"),
                    transport_backend=transport, port_start=start, port_end=end,
                    auto_restart=form.get("auto_restart") in ("on", "true", "1"), restart_attempts=attempts,
                    speculative_tokens=drafts)


def selection(form, max_nodes: int = 16) -> tuple[str, list[str]]:
    """The chosen model and nodes of the Serve as cluster form."""
    model = (form.get("model") or "").strip()
    if not model:
        raise FormError("Model: choose a model")
    nodes = [n for n in form.getlist("nodes") if n]
    if len(nodes) < 2:
        raise FormError("Select at least 2 nodes")
    if len(nodes) > max_nodes:
        raise FormError(f"Select at most {max_nodes} nodes")
    return model, nodes
