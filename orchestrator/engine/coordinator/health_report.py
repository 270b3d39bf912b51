"""The coordinator's health report: the one typed document behind `GET /health`.

The coordinator produces it (`engine/coordinator/api.py`), the control plane parses it in one client
(`control/coordinator_client.py`). Only a document that validates as a `HealthReport`, on a
200 or a 503 without an `error` member, is the coordinator's verdict on its pipeline: a
429 or any other JSON (a full server's refusal, a stranger on the port) never is.

A request carrying `CONTROL_HEADER` with the cluster's control token (`control_token`, an
HMAC of the cluster secret, so the secret itself never crosses the wire) is the control
plane's: the HTTP server serves it in slots anonymous clients cannot hold
(`httpkit/server.py`), so a flood of idle or slow connections cannot blind the watcher.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, ValidatorFunctionWrapHandler, field_validator

from orchestrator.httpkit.handler import CONTROL_HEADER

_CONTROL_DOMAIN = b"pipeserve control-plane priority v1\n"  # never valid as any other signature

PipelineState = Literal["starting", "warming", "ready", "unhealthy", "stopped"]
StageState = Literal["up", "down", "wedged"]


def control_token(secret: bytes) -> str:
    """The token the control plane sends in `CONTROL_HEADER` (derived from the cluster secret)."""
    return hmac.new(secret, _CONTROL_DOMAIN, hashlib.sha256).hexdigest()


def none_if_odd(value: object, handler: ValidatorFunctionWrapHandler) -> object:
    """An optional part of a report as validated, or None where it is odd: the part is lost, not the report."""
    try:
        return handler(value)
    except ValidationError:
        return None


class StageProgressReport(BaseModel):
    """What a stage's last PONG said about the step it is computing."""

    model_config = ConfigDict(extra="ignore")

    steps: int = 0
    busy_s: float = 0.0
    request: int | None = None
    chunk: tuple[int, int] | None = None
    batch: int = 0
    queued: int = 0
    pid: int | None = None


class StageCacheReport(BaseModel):
    """What a stage's last PONG said about its prompt-cache entries (engine/stage/prompt_cache.py)."""

    model_config = ConfigDict(extra="ignore")

    entries: int = 0
    bytes: int = 0
    hits: int = 0
    tokens_reused: int = 0


class SpeculationReport(BaseModel):
    """Speculative decoding so far (engine/coordinator/speculation.py): the cluster's draft limit,
    verification passes, drafted tokens and the drafts the last stage accepted."""

    model_config = ConfigDict(extra="ignore")

    max_drafts: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    refused: bool = False  # a stage said it cannot verify drafts exactly: the coordinator never drafts
    refusal: str | None = None  # the first such stage's reason (StageModel.speculation_refusal)


class PauseReport(BaseModel):
    """The coordinator's last pause (engine/coordinator/pauses.py): the answers it held when a stage was
    lost, how many resumed and how many were lost, and how long from the hold (its seconds)."""

    model_config = ConfigDict(extra="ignore")

    id: str  # random per pause: one pause is never reported for two faults
    age_s: float  # since the first hold
    held: int = 0
    resumed: int = 0
    lost: int = 0  # a token that differed, the deadline, the client gone, the coordinator stopping
    settled: bool = False  # every held answer resumed or lost
    ready_s: float | None = None  # hold -> the pipeline ready again (the resume began)
    seconds: float | None = None  # hold -> settled


class StageReport(BaseModel):
    """How the coordinator sees one stage; the stage's own statistics ride along as extra fields."""

    model_config = ConfigDict(extra="allow")

    id: str
    address: str
    state: StageState
    fault: str = ""
    last_seen_s: float | None = None
    step_ms: float | None = None
    progress: StageProgressReport | None = None
    prompt_cache: StageCacheReport | None = None

    @field_validator("progress", "prompt_cache", mode="wrap")
    @classmethod
    def _odd_progress_is_none(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        # A stage's PONG is its own words: an odd progress part loses that part, not the verdict.
        return none_if_odd(value, handler)


class HealthReport(BaseModel):
    """`GET /health`: the pipeline's state (200 when ready, 503 otherwise)."""

    model_config = ConfigDict(extra="ignore")

    status: PipelineState
    ready: bool
    reason: str = ""
    model: str = ""
    in_flight: int = 0
    stages: tuple[StageReport, ...] = ()
    speculation: SpeculationReport | None = None  # None: the cluster does not speculate
    pause: PauseReport | None = None  # None: no answer was ever held

    @field_validator("pause", mode="wrap")
    @classmethod
    def _odd_pause_is_none(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        # An odd pause record (another version's) loses the record, never the health verdict.
        return none_if_odd(value, handler)

    def stage(self, stage_id: str) -> StageReport | None:
        """The report of stage `stage_id` ("stage-1"), None if the coordinator does not list it."""
        return next((s for s in self.stages if s.id == stage_id), None)


__all__ = ["CONTROL_HEADER", "HealthReport", "PauseReport", "PipelineState", "SpeculationReport",
           "StageCacheReport", "StageProgressReport", "StageReport", "StageState", "control_token"]
