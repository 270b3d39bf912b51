"""Test-only fault hooks for stage processes: off unless `PIPESERVE_FAULTS` names one.

`PIPESERVE_FAULTS="stage-1:step-error"` makes stage-1 fail every compute step (a stage that
loads but cannot serve); `stage-1:step-hang` makes its compute thread block forever while
its reader threads keep answering pings (a wedged stage); `stage-1:step-stall` holds it for
STEP_STALL_S once and then lets it go on (a stage judged wedged that comes back). A kind may end in `@N`: the fault
starts at the stage's N-th step (`stage-1:step-hang@12` serves the readiness probe, then
wedges). `cache-stale` makes the stage start a cached request from the oldest prompt-cache entry it
holds instead of the one named, `cache-skip-trim` from the named one without trimming it (stages that
must fail the exactness comparison), `cache-forget` acknowledges entries it does not keep,
`spec-skip-trim` rolls a request back after a verification chunk without trimming its caches,
`layer-pause` pauses after each layer of a long step (a slow prefill a RESET must be able to stop).
`coordinator:start-hold` keeps a coordinator between binding its port and starting its pipeline
for START_HOLD_S (what a client sees of a coordinator still starting); `coordinator:resume-repeat`,
`resume-drop` and `resume-reseed` make its resumes inexact (a token sent twice, one never sent, the
sampler started over: tests that must fail the comparison with an undisturbed answer). Several
entries are separated by commas. Tests set the variable in the environment
of the agent that starts the stage.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from orchestrator import settings

ENV = settings.FAULTS.name
KINDS = ("step-error", "step-hang", "step-stall", "cache-stale", "cache-skip-trim", "cache-forget", "spec-skip-trim",
         "start-hold", "layer-pause", "resume-repeat", "resume-drop", "resume-reseed")
STEP_STALL_S = 12.0  # `step-stall`: how long the compute thread is held, once
START_HOLD_S = 30.0  # `coordinator:start-hold`: bound and serving, it waits this long before starting its pipeline


@dataclass
class Faults:
    """The faults enabled for one stage (kind -> the step they start at, 1-based)."""

    kinds: dict[str, int] = field(default_factory=dict)
    steps: int = 0  # steps begun so far (the compute thread's own counter)

    @classmethod
    def for_node(cls, node_id: str, spec: str | None = None) -> "Faults":
        """Parse `PIPESERVE_FAULTS` (or `spec`) and keep the entries naming `node_id`."""
        spec = settings.FAULTS.read() if spec is None else spec
        kinds: dict[str, int] = {}
        for entry in filter(None, (e.strip() for e in spec.split(","))):
            node, _, kind = entry.partition(":")
            kind, _, at = kind.partition("@")
            if kind not in KINDS or (at and not at.isdigit()):
                raise ValueError(f"{ENV}: unknown fault {entry!r} (known: {', '.join(KINDS)}, optionally @STEP)")
            if node == node_id:
                kinds[kind] = int(at or 1)
        return cls(kinds)

    def before_step(self) -> None:
        """Called by the stage's compute thread before each step."""
        if not self.kinds:
            return
        self.steps += 1
        if self.steps >= self.kinds.get("step-error", self.steps + 1):
            raise RuntimeError("fault injected: this stage cannot compute")
        if self.steps >= self.kinds.get("step-hang", self.steps + 1):
            threading.Event().wait()  # never set: the compute thread stops making progress
        if self.steps == self.kinds.get("step-stall"):
            threading.Event().wait(STEP_STALL_S)  # then it goes on: stuck for a while, not for good

    def before_start(self) -> None:
        """Called by the coordinator once its port is bound, before its pipeline starts."""
        if "start-hold" in self.kinds:
            threading.Event().wait(START_HOLD_S)
