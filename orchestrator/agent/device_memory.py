"""The memory a node's accelerator can use, from mlx's device information and the OS's figures (pure).

What the OS calls free is the wrong quantity on both accelerators a cluster runs on:
- Apple Silicon: the GPU wires at most Metal's recommended working set (mlx's device_info
  `max_recommended_working_set_size`, about two thirds to three quarters of RAM), however much
  vm_stat shows free; a plan past it pages or fails at load.
- Linux CUDA: weights and KV cache live in the GPU's memory, which mlx's allocator caps at its
  memory limit (a share of the device's memory); the host's RAM does not hold them.
On a CPU node it is the OS's available memory, as before. The kind follows mlx's backend, not
the hardware: a machine with an NVIDIA card running mlx's CPU backend plans with its RAM.

Every function here reads recorded inputs (device_info dicts, /proc/meminfo, vm_stat and
nvidia-smi text); agent/report.py runs the commands and the device probe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.agent.device_schemas import Memory

_PAGE_SIZE = re.compile(r"page size of (\d+) bytes")
# vm_stat's pages a new allocation can take without paging anything out
_VM_AVAILABLE = ("Pages free", "Pages inactive", "Pages speculative", "Pages purgeable")


@dataclass(frozen=True)
class HostMemory:
    """RAM as the OS reports it."""

    total: int
    available: int
    wired: int | None = None  # macOS: pages wired down (the GPU's resident buffers among them)


@dataclass(frozen=True)
class GpuMemory:
    """One NVIDIA GPU's memory, from nvidia-smi."""

    name: str
    total: int
    used: int
    free: int


def parse_meminfo(text: str) -> HostMemory:
    """/proc/meminfo: MemTotal and MemAvailable (MemFree on kernels before 3.14)."""
    info: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            info[key.strip()] = int(fields[0]) * 1024  # kB
    return HostMemory(total=info["MemTotal"], available=info.get("MemAvailable", info.get("MemFree", 0)))


def parse_vm_stat(text: str, total: int, page_size: int = 4096) -> HostMemory:
    """macOS vm_stat: free + inactive + speculative + purgeable pages, and the wired ones. The page size
    comes from vm_stat's own first line when it states one (16 KiB on Apple Silicon)."""
    m = _PAGE_SIZE.search(text)
    page = int(m.group(1)) if m else page_size
    pages: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        value = rest.strip().rstrip(".")
        if value.isdigit():
            pages[key.strip()] = int(value)
    available = sum(pages.get(k, 0) for k in _VM_AVAILABLE) * page
    wired = pages.get("Pages wired down")
    return HostMemory(total=total, available=available, wired=wired * page if wired is not None else None)


def parse_nvidia_smi(text: str) -> list[GpuMemory]:
    """Rows of `nvidia-smi --query-gpu=name,memory.total,memory.used,memory.free --format=csv,noheader,nounits`
    (MiB). Rows that do not parse ([N/A] on some virtual GPUs) are left out."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 3)]
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            total, used, free = (int(p) << 20 for p in parts[1:])
            gpus.append(GpuMemory(name=parts[0], total=total, used=used, free=free))
    return gpus


def parse_compute_apps(text: str, pids: set[int]) -> int:
    """Bytes of GPU memory the processes `pids` hold, from
    `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits` (MiB)."""
    held = 0
    for line in text.splitlines():
        pid, _, used = (p.strip() for p in line.partition(","))
        if pid.isdigit() and used.isdigit() and int(pid) in pids:
            held += int(used) << 20
    return held


def _budgeted(kind: str, source: str, limit: int, available: int, budget: int | None, held: int,
              **extra: int | None) -> Memory:
    """The report's section: free = min(available, budget - held); total = the limit, capped by the budget."""
    free = available if budget is None else max(0, min(available, budget - held))
    return Memory(kind=kind, source=source, total_bytes=limit if budget is None else min(limit, budget),  # type: ignore[arg-type]
                  available_bytes=available, budget_bytes=budget, processes_rss_bytes=held, free_bytes=free, **extra)


def host_memory(host: HostMemory, budget: int | None, held: int) -> Memory:
    """A CPU node: the OS's available memory."""
    return _budgeted("host", "the OS's available memory", host.total, host.available, budget, held,
                     host_total_bytes=host.total, wired_bytes=host.wired)


def metal_memory(info: Mapping[str, str | int], host: HostMemory, budget: int | None, held: int) -> Memory:
    """Apple Silicon: at most Metal's recommended working set, less what this agent's stages hold, and
    never more than vm_stat has available (other programs share the unified memory)."""
    working_set = int(info.get("max_recommended_working_set_size") or 0)
    size = int(info.get("memory_size") or host.total)
    if working_set <= 0:  # an mlx that does not say: the OS's figure is all there is
        return host_memory(host, budget, held)
    available = max(0, min(host.available, working_set - held))
    return _budgeted("metal", "Metal's recommended working set (mlx device_info)", working_set, available, budget,
                     held, host_total_bytes=host.total, device_total_bytes=size, limit_bytes=working_set,
                     wired_bytes=host.wired)


def cuda_memory(info: Mapping[str, str | int], mlx_limit: int | None, gpu: GpuMemory | None, host: HostMemory,
                budget: int | None, held: int) -> Memory:
    """Linux CUDA: the GPU's memory up to mlx's allocator limit, less what every process uses on it now
    (nvidia-smi's fresh figures, else mlx's device_info from the probe)."""
    total = gpu.total if gpu is not None else int(info.get("total_memory") or 0)
    if total <= 0:
        return host_memory(host, budget, held)
    free_now = gpu.free if gpu is not None else int(info.get("free_memory") or total)
    used = gpu.used if gpu is not None else total - free_now
    limit = min(mlx_limit, total) if mlx_limit else total
    available = max(0, min(free_now, limit - used))
    return _budgeted("cuda", "the GPU's memory under mlx's allocator limit (mlx device_info, nvidia-smi)", limit,
                     available, budget, held, host_total_bytes=host.total, device_total_bytes=total,
                     limit_bytes=limit)
