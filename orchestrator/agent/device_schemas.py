"""The report's device sections: the memory a plan may use on the node, and the mlx runtime it runs.

Kept apart from schemas.py (which re-exports them) so the agent's device facts read in one place;
agent/device_memory.py fills them, the planner and the dashboard read them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# Which quantity a report's memory figures are (agent/device_memory.py):
# - host: what the OS calls available (a CPU node: /proc/meminfo, vm_stat);
# - metal: Apple Silicon's GPU, capped by Metal's recommended working set (mlx's device_info);
# - cuda: the GPU's own memory, capped by mlx's CUDA allocator limit.
MemoryKind = Literal["host", "metal", "cuda"]

# How a kind is named where people read it: the node picker, the plan's bars and refusals.
MEMORY_WORDS: dict[str, str] = {"host": "memory", "metal": "GPU working-set memory", "cuda": "GPU memory"}


class Memory(BaseModel):
    """What a plan may use on the node, in bytes, and which quantity that is (`kind`)."""

    total_bytes: int  # the most the accelerator can use (its kind), capped by the budget
    available_bytes: int  # what it has available now
    budget_bytes: int | None  # --memory-budget, when set
    processes_rss_bytes: int  # what this agent's engine processes hold (on cuda: on the GPU)
    free_bytes: int  # what a plan may still use: min(available, budget - processes_rss)
    # Agents from before device memory leave these out: their figures were the OS's (host).
    kind: MemoryKind = "host"
    source: str = "the OS's available memory"  # in words: where total and free come from
    host_total_bytes: int | None = None  # RAM as the OS reports it, beside an accelerator's figures
    device_total_bytes: int | None = None  # the GPU's memory (cuda), the unified memory's size (metal)
    limit_bytes: int | None = None  # mlx's cap: the recommended working set (metal), the allocator's limit (cuda)
    wired_bytes: int | None = None  # metal: memory wired now, by every process (vm_stat)


class Runtime(BaseModel):
    """The mlx the node's engine processes run (the homogeneous-cluster rule compares it)."""

    backend: Literal["metal", "cuda", "cpu"] | None  # mlx's backend; None: mlx does not load
    package: str | None = None  # the backend's wheel and version: "mlx-cuda-13 0.32.4", "mlx-metal 0.32.4"
    mlx: str | None = None
    mlx_lm: str | None = None
    device: str = ""  # mlx's device_name
    error: str | None = None  # why mlx did not load (backend None)

    @property
    def label(self) -> str:
        """'mlx 0.32.4 (cuda: mlx-cuda-13 0.32.4), mlx-lm 0.32.2': what a refusal compares."""
        backend = self.backend or "no backend"
        return f"mlx {self.mlx or '?'} ({backend}{': ' + self.package if self.package else ''}), " \
               f"mlx-lm {self.mlx_lm or '?'}"
