"""The knobs of a plan: context and concurrency (KV cache), ports, transport, overheads, split."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MIB = 1024 * 1024

# Resident memory of an engine process beyond its weights and KV cache: the Python
# interpreter, mlx, mlx-lm and transformers (imported by mlx-lm), BLAS buffers. Measured on
# Linux x86_64 CPU (mlx 0.32.4, mlx-lm 0.32.2, OpenBLAS) with
# orchestrator.engine.local_pipeline.LocalPipeline, 2 stages, reading each stage's rss_bytes minus
# weight_bytes from the coordinator's GET /health: 91-92 MB idle for the 4-layer 64-wide
# test model, 94-95 MB idle for an 8-layer 576-wide one, ~96 MB after a short generation.
# Long prompts grow it: prefill activations stay in mlx's buffer cache (+40-70 MB after one
# 1,881-token prompt on the 576-wide model). 128 MiB (134 MB) covers the idle process with
# room for ordinary prompts; raise it for long contexts or wide models.
DEFAULT_STAGE_OVERHEAD_BYTES = 128 * MIB
# The coordinator process (tokenizer, HTTP server, no weights): 88-92 MB RSS measured the
# same way (/proc/PID/status VmRSS) before and after a generation.
DEFAULT_COORDINATOR_OVERHEAD_BYTES = 128 * MIB

DEFAULT_PORT_START = 39600
DEFAULT_PORT_END = 39629


class PlanSettings(BaseModel):
    """Settings for one plan. Invalid values raise pydantic's ValidationError (a ValueError)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    context_length: int = Field(default=4096, ge=8)  # tokens per sequence, prompt plus answer
    max_concurrent_sequences: int = Field(default=4, ge=1, le=4096)  # the KV cache is sized for this many
    port_start: int = Field(default=DEFAULT_PORT_START, ge=1024, le=65535)
    port_end: int = Field(default=DEFAULT_PORT_END, ge=1024, le=65535)
    transport_backend: Literal["tcp", "thunderbolt", "rdma"] = "tcp"
    stage_overhead_bytes: int = Field(default=DEFAULT_STAGE_OVERHEAD_BYTES, ge=0)
    coordinator_overhead_bytes: int = Field(default=DEFAULT_COORDINATOR_OVERHEAD_BYTES, ge=0)
    # Warn when the busiest stage carries more than this many times the per-token bytes
    # (per byte of its node's free memory) of the lightest one.
    imbalance_threshold: float = Field(default=1.5, gt=1.0)
    # Warn when a node's plan uses more than this fraction of its free memory: overheads are
    # estimates and long prompts need transient buffers.
    tight_fit_fraction: float = Field(default=0.9, gt=0.0, le=1.0)
    # Speculative decoding (engine/coordinator/drafting.py): the most tokens a request drafts per pass; 0 = off.
    speculative_tokens: int = Field(default=0, ge=0, le=16)
    # A draft model for speculative decoding (engine/coordinator/draft_model.py): its id in the coordinator
    # node's models directory, and what it holds there (weights and KV cache at this context and concurrency).
    draft_model: str | None = None
    draft_model_bytes: int = Field(default=0, ge=0)
    # Inclusive (first, last) layer ranges, one per selected node in order; None = balance.
    manual_split: tuple[tuple[int, int], ...] | None = None

    @model_validator(mode="after")
    def _ports(self) -> "PlanSettings":
        if self.port_start > self.port_end:
            raise ValueError(f"port range {self.port_start}-{self.port_end}: start must not exceed end")
        return self

    @property
    def port_range(self) -> range:
        """The transport ports a plan may hand out."""
        return range(self.port_start, self.port_end + 1)
