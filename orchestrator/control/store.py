"""Persistence of what must survive a dashboard restart: settings, nodes, live sessions.

One JSON file, written atomically (temp file, fsync, rename) with owner-only permissions,
because it holds the nodes' credentials.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ValidationError

from orchestrator.atomic_write import write_atomically
from orchestrator.control.rules.state import Node, Session, Settings, State, VerifiedCopy

FILENAME = "control.json"


class Persisted(BaseModel):
    """The file's shape."""

    settings: Settings = Settings()
    nodes: list[Node] = []
    sessions: list[Session] = []
    verified: list[VerifiedCopy] = []  # copies the dashboard checked (they stay Verified while their files do)


def load(state_dir: Path) -> State:
    """The persisted state (empty if none); a corrupt file raises ValueError naming it."""
    path = Path(state_dir) / FILENAME
    if not path.exists():
        return State()
    try:
        data = Persisted.model_validate_json(path.read_text())
    except (ValidationError, OSError) as exc:
        raise ValueError(f"{path}: unreadable control-plane state ({exc})") from None
    nodes = tuple(n.model_copy(update={"report": None, "status": "unreachable", "error": "not seen since restart"})
                  for n in data.nodes)
    return State(settings=data.settings, nodes=nodes, sessions=tuple(data.sessions), verified=tuple(data.verified))


def save(state_dir: Path, state: State) -> None:
    """Write the persistent part of `state` atomically, mode 0600."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    doc = Persisted(settings=state.settings, nodes=[n.model_copy(update={"report": None}) for n in state.nodes],
                    sessions=[s.model_copy(update={"samples": ()}) for s in state.sessions],  # charts: live only
                    verified=list(state.verified))
    data = doc.model_dump_json(indent=1).encode()
    # model_dump_json excludes nothing by repr=False, so the credential is in the file: owner-only.
    write_atomically(state_dir / FILENAME, data)


__all__ = ["load", "save"]
