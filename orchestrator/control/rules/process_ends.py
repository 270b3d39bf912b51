"""How engine processes ended, as the control plane words and counts them (pure).

The stage cards, the session's reason and the timeline say how a process ended in words
("killed by SIGKILL", "lease expired, exit status 0"), never an internal value such as
"exited (None)". After a restart, a process whose lease could not be renewed is counted as
gone even while its agent still lists it running (it is being stopped).
"""

from __future__ import annotations

from orchestrator.agent.schemas import ProcessInfo

LAPSED = "its lease ran out while the control plane was away"


def ended(info: ProcessInfo) -> str:
    """How a process that is no longer running ended, in words (pure): why it was stopped when
    its agent knows, and the signal or exit status — never a bare "None"."""
    how = f"killed by {info.signal}" if info.signal else \
        (f"exit status {info.exit_code}" if info.exit_code is not None else "")
    why = {"requested": "stopped", None: ""}.get(info.stop_reason, info.stop_reason or "")
    return ", ".join(w for w in (why, how) if w) or "ended, status unknown"


def lapsed(processes: dict[str, ProcessInfo | None], renewed: dict[str, set[str] | None],
           node_of: dict[str, str]) -> dict[str, ProcessInfo | None]:
    """The processes as a returning control plane must count them (pure): one its agent still
    lists as running but whose lease could not be renewed is being stopped for its lapsed lease
    (or about to be), so it is gone, not alive — counted alive, it was left out of the repair and
    the coordinator restarted alone waited for stages that had ended. `renewed`: per node, the
    processes whose lease was just extended (None: the agent did not answer)."""
    out: dict[str, ProcessInfo | None] = {}
    for name, info in processes.items():
        done = renewed.get(node_of.get(name, ""))
        if info is not None and info.alive and done is not None and name not in done:
            info = info.model_copy(update={"alive": False, "port_listening": False,
                                           "stop_reason": LAPSED})
        out[name] = info
    return out


__all__ = ["LAPSED", "ended", "lapsed"]
