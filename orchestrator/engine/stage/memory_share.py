"""A stage's share of its node's accelerator memory: set as mlx's limits, checked once its weights are loaded.

The plan gave each stage a share (its weights, its KV cache at the plan's context and
concurrency, its prompt-cache budget and its process overhead: the cluster TOML's
`memory_bytes`). A stage sets mlx's memory limit to it, so mlx frees its buffer cache before it
grows past the share, and on Apple Silicon wires that much (as mlx-lm does for large models:
its weights stay resident instead of being paged out between steps). A share the device cannot
give (more than Metal's recommended working set, more than the GPU's memory) and weights that
alone overrun it fail the stage at start with the reason, instead of a stage that pages or dies
of an allocation failure in the middle of a request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import mlx.core as mx

from orchestrator.units import format_bytes


class MemoryShareError(RuntimeError):
    """The stage's share cannot be had on this device, or its weights overrun it."""


@dataclass(frozen=True)
class Limits:
    """What a stage sets: mlx's memory limit, and on Metal its wired limit."""

    backend: str
    memory: int
    wired: int | None = None


def backend() -> str:
    """mlx's backend in this process: metal, cuda or cpu."""
    return "metal" if mx.metal.is_available() else "cuda" if mx.cuda.is_available() else "cpu"


def limits_for(share: int, which: str, info: Mapping[str, str | int]) -> Limits:
    """The limits of a stage whose plan gave it `share` bytes, on a device mlx describes as `info` (pure)."""
    if which == "metal":
        working_set = int(info.get("max_recommended_working_set_size") or 0)
        if working_set and share > working_set:
            raise MemoryShareError(f"this stage's share of memory, {format_bytes(share)}, is more than Metal's "
                                   f"recommended working set on this Mac, {format_bytes(working_set)}: the GPU "
                                   "would page; plan with more nodes or a shorter context")
        # mlx refuses a wired limit above the system's (iogpu.wired_limit_mb): never ask for more
        return Limits("metal", memory=share, wired=min(share, working_set) if working_set else None)
    if which == "cuda":
        total = int(info.get("total_memory") or 0)
        if total and share > total:
            raise MemoryShareError(f"this stage's share of memory, {format_bytes(share)}, is more than the GPU's "
                                   f"{format_bytes(total)} ({info.get('device_name', 'GPU')})")
        return Limits("cuda", memory=share)
    return Limits(which, memory=share)


def apply(share: int) -> Limits:
    """Set mlx's limits for `share` in this process (before the weights load)."""
    limits = limits_for(share, backend(), mx.device_info())
    mx.set_memory_limit(limits.memory)
    if limits.wired is not None:
        mx.set_wired_limit(limits.wired)
    return limits


def check_loaded(share: int, active: int | None = None) -> int:
    """The bytes mlx holds once the weights are loaded (`active`, default: mlx's count now); raises when
    they alone overrun the share: the KV cache the plan counted would then have no room."""
    held = mx.get_active_memory() if active is None else active
    if held > share:
        raise MemoryShareError(f"the stage's weights take {format_bytes(held)} of mlx's memory, more than its "
                               f"share of {format_bytes(share)}: the plan counted less for these layers than they "
                               "load as")
    return held
