"""What the coordinator's scheduler hands out: generation handles, their events, health snapshots."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from orchestrator.engine.coordinator.links import now


@dataclass(frozen=True)
class GenerationParams:
    """What a request asks of the sampler and the loop.

    The sampling fields are mlx-lm's (`make_sampler`, `make_logits_processors`) with mlx_lm.server's
    defaults; the last stage computes them (engine/stage/sampling.py). `grammar` is an llguidance grammar
    (constrained decoding, engine/stage/constraint.py), `eos_ids` the ids that may end a constrained answer.
    """

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int = 0
    top_k: int = 0
    min_p: float = 0.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    xtc_special_tokens: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    repetition_penalty: float = 0.0
    repetition_context_size: int = 20
    presence_penalty: float = 0.0
    presence_context_size: int = 20
    frequency_penalty: float = 0.0
    frequency_context_size: int = 20
    grammar: str | None = None
    eos_ids: tuple[int, ...] = ()

    def history_size(self) -> int:
        """How many of the latest tokens the logits processors read (the OPEN frame carries that
        tail of the prompt; the last stage appends what it samples)."""
        sizes = [size for penalty, size in ((self.repetition_penalty, self.repetition_context_size),
                                            (self.presence_penalty, self.presence_context_size),
                                            (self.frequency_penalty, self.frequency_context_size)) if penalty]
        return max(sizes, default=0)

    def sampling_json(self, prompt: list[int]) -> dict:
        """The OPEN frame's payload: everything the last stage needs to sample this request."""
        out: dict = {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                     "top_logprobs": self.top_logprobs}
        extras = {"top_k": (self.top_k, 0), "min_p": (self.min_p, 0.0),
                  "xtc_probability": (self.xtc_probability, 0.0), "xtc_threshold": (self.xtc_threshold, 0.1),
                  "repetition_penalty": (self.repetition_penalty, 0.0),
                  "repetition_context_size": (self.repetition_context_size, 20),
                  "presence_penalty": (self.presence_penalty, 0.0),
                  "presence_context_size": (self.presence_context_size, 20),
                  "frequency_penalty": (self.frequency_penalty, 0.0),
                  "frequency_context_size": (self.frequency_context_size, 20)}
        out.update({k: v for k, (v, default) in extras.items() if v != default})  # small frames for plain requests
        if self.xtc_probability:
            out["xtc_special_tokens"] = list(self.xtc_special_tokens)
        if self.logit_bias:
            out["logit_bias"] = [[t, b] for t, b in self.logit_bias]
        history = self.history_size()
        if history:
            out["history"] = prompt[-history:]
        if self.grammar is not None:
            out["grammar"] = self.grammar
            out["eos_ids"] = list(self.eos_ids)
        return out


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


@dataclass(frozen=True)
class Paused:
    """The pipeline lost a stage: the generation waits for it to be replaced, then goes on where the
    client stopped receiving (the events after this one continue the answer)."""

    reason: str


class NotReady(RuntimeError):
    """The pipeline cannot take requests now."""


class Generation:
    """A handle on one submitted request: read `events`, call `cancel()` to abandon it."""

    def __init__(self, prompt: list[int], params: GenerationParams, inbox: queue.SimpleQueue,
                 marks: tuple[int, ...] = (), scope: str = "") -> None:
        self.prompt = prompt
        self.params = params
        self.marks = marks  # prompt positions worth a prompt-cache checkpoint (the end of a system prompt)
        self.scope = scope  # its prompt-cache scope: it reuses and leaves entries of this scope only
        self.cached_tokens = 0  # prompt tokens served from the prompt cache (set before the first token)
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # one token event per step: C put/get
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
