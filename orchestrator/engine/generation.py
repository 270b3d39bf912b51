"""What the coordinator's scheduler hands out: generation handles, their events, health snapshots."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from .links import now


@dataclass(frozen=True)
class GenerationParams:
    """What a request asks of the sampler and the loop."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int = 0


@dataclass(frozen=True)
class TokenEvent:
    """A generated token, its log-prob, and the top alternatives if asked for."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Finished:
    """The generation ended normally: "stop" (EOS) or "length"."""

    reason: str


@dataclass(frozen=True)
class Failed:
    """The generation ended with an error (HTTP status suggested for the API)."""

    message: str
    status: int = 503


class NotReady(RuntimeError):
    """The pipeline cannot take requests now."""


class Generation:
    """A handle on one submitted request: read `events`, call `cancel()` to abandon it."""

    def __init__(self, prompt: list[int], params: GenerationParams, inbox: queue.Queue) -> None:
        self.prompt = prompt
        self.params = params
        self.events: queue.Queue = queue.Queue()
        self.submitted = now()
        self._inbox = inbox

    def cancel(self) -> None:
        """Stop generating (client gone or a stop string matched); idempotent."""
        self._inbox.put(("cancel", self))


@dataclass(frozen=True)
class StageHealth:
    """How the coordinator sees one stage."""

    node_id: str
    address: str
    connected: bool
    last_seen_s: float | None
    stats: dict = field(default_factory=dict)
    fault: str = ""  # why the watchdog declared it wedged ("" when it is not)


@dataclass(frozen=True)
class Health:
    """An immutable snapshot of the pipeline, replaced by the scheduler on every change."""

    state: str  # starting | warming | ready | unhealthy | stopped
    reason: str
    stages: tuple[StageHealth, ...]
    in_flight: int

    @property
    def ready(self) -> bool:
        """Whether requests are accepted."""
        return self.state == "ready"
