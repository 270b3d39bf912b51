"""Test-only fault hooks for stage processes: off unless `PIPESERVE_FAULTS` names one.

`PIPESERVE_FAULTS="stage-1:step-error"` makes stage-1 fail every compute step (a stage that
loads but cannot serve); `stage-1:step-hang` makes its compute thread block forever while
its reader threads keep answering pings (a wedged stage). Several entries are separated by
commas. Tests set the variable in the environment of the agent that starts the stage.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

ENV = "PIPESERVE_FAULTS"
KINDS = ("step-error", "step-hang")


@dataclass(frozen=True)
class Faults:
    """The faults enabled for one stage."""

    kinds: frozenset[str] = frozenset()

    @classmethod
    def for_node(cls, node_id: str, spec: str | None = None) -> "Faults":
        """Parse `PIPESERVE_FAULTS` (or `spec`) and keep the entries naming `node_id`."""
        spec = os.environ.get(ENV, "") if spec is None else spec
        kinds = set()
        for entry in filter(None, (e.strip() for e in spec.split(","))):
            node, _, kind = entry.partition(":")
            if kind not in KINDS:
                raise ValueError(f"{ENV}: unknown fault {entry!r} (known: {', '.join(KINDS)})")
            if node == node_id:
                kinds.add(kind)
        return cls(frozenset(kinds))

    def before_step(self) -> None:
        """Called by the stage's compute thread before each step."""
        if "step-error" in self.kinds:
            raise RuntimeError("fault injected: this stage cannot compute")
        if "step-hang" in self.kinds:
            threading.Event().wait()  # never set: the compute thread stops making progress
