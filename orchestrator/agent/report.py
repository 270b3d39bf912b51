"""Facts about the node: accelerator family, memory, free transport ports, versions.

Detected, never configured (the planner refuses mixed clusters on these facts), except the
memory budget, which lets one machine model several small nodes. Nothing here imports mlx:
versions come from package metadata, and mlx's device information from a child process run
once at agent start (agent/device_probe.py), so a report stays cheap.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from orchestrator import __version__
from orchestrator.agent.device_memory import (
    HostMemory,
    cuda_memory,
    host_memory,
    metal_memory,
    parse_compute_apps,
    parse_meminfo,
    parse_nvidia_smi,
    parse_vm_stat,
)
from orchestrator.agent.device_probe import DeviceProbe
from orchestrator.agent.device_schemas import Memory, Runtime
from orchestrator.agent.schemas import Accelerator, Ports

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from "300M", "2G", "1.5GiB", "4096" (binary units: 1K = 1024)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"size {text!r}: expected a number with an optional K/M/G/T suffix, e.g. 300M or 2G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_port_range(text: str) -> tuple[int, int]:
    """(start, end) inclusive from "39600-39629", validated 1024-65535 and start <= end."""
    m = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", text)
    if not m:
        raise ValueError(f"port range {text!r}: expected START-END, e.g. 39600-39629")
    start, end = int(m.group(1)), int(m.group(2))
    if not (1024 <= start <= end <= 65535):
        raise ValueError(f"port range {text!r}: need 1024 <= START <= END <= 65535")
    return start, end


def detect_accelerator() -> Accelerator:
    """apple-silicon (macOS on arm64), linux-cuda (an NVIDIA driver answers), or linux-cpu."""
    system, machine = platform.system(), platform.machine().lower()
    if system == "Darwin" and machine in ("arm64", "aarch64"):
        chip = command_output(["sysctl", "-n", "machdep.cpu.brand_string"]) or "Apple Silicon"
        return Accelerator(family="apple-silicon", detail=chip)
    if system == "Linux":
        gpus = _nvidia_gpus()
        if gpus:
            return Accelerator(family="linux-cuda", detail="; ".join(gpus))
        return Accelerator(family="linux-cpu", detail=f"{_cpu_model()} ({os.cpu_count()} cores)")
    return Accelerator(family="other", detail=f"{system} {machine}")


def _nvidia_gpus() -> list[str]:
    # The driver's /proc entry is the cheap proof; nvidia-smi names the devices.
    if not Path("/proc/driver/nvidia/version").exists() and not shutil.which("nvidia-smi"):
        return []
    out = command_output(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    return [line.strip() for line in out.splitlines() if line.strip()] if out else []


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def command_output(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def host_figures() -> HostMemory:
    """RAM as the OS reports it: /proc/meminfo on Linux, vm_stat on macOS (with its wired pages)."""
    if platform.system() == "Linux":
        return parse_meminfo(Path("/proc/meminfo").read_text())
    if platform.system() == "Darwin":
        total = int(command_output(["sysctl", "-n", "hw.memsize"]) or 0)
        page = int(command_output(["sysctl", "-n", "hw.pagesize"]) or 4096)
        return parse_vm_stat(command_output(["vm_stat"]), total, page)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return HostMemory(total=pages, available=pages)


def os_memory() -> tuple[int, int]:
    """(total, available) bytes as the OS reports them."""
    host = host_figures()
    return host.total, host.available


def process_rss(pid: int) -> int:
    """Resident bytes of one process (0 when it is gone or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0
    except OSError:
        pass
    out = command_output(["ps", "-o", "rss=", "-p", str(pid)])
    return int(out) * 1024 if out.isdigit() else 0


def memory(budget: int | None, processes_rss: int, device: DeviceProbe | None = None,
           engine_pids: Sequence[int] = ()) -> Memory:
    """The memory section of the report: what the node's mlx backend can use (agent/device_memory.py).

    free = min(available, budget - what our engine processes already hold): a budget models a
    smaller node, and a stage started on it uses up its budget as it would on a real one. On
    CUDA what they hold is their GPU memory (nvidia-smi), not their resident host memory.
    """
    host = host_figures()
    backend = device.backend if device is not None else None
    if device is None or backend not in ("metal", "cuda"):
        return host_memory(host, budget, processes_rss)
    if backend == "metal":
        return metal_memory(device.device_info, host, budget, processes_rss)
    gpus = parse_nvidia_smi(command_output(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,memory.free",
                                            "--format=csv,noheader,nounits"]))
    held = parse_compute_apps(command_output(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                              "--format=csv,noheader,nounits"]), set(engine_pids)) \
        if engine_pids else 0
    # mlx runs on device 0 of those it sees: nvidia-smi's first row (CUDA_VISIBLE_DEVICES is not followed)
    return cuda_memory(device.device_info, device.memory_limit, gpus[0] if gpus else None, host, budget, held)


# The wheel that carries each mlx backend (mlx itself is the Python front end on every platform).
BACKEND_PACKAGES = ("mlx-metal", "mlx-cuda-13", "mlx-cuda-12", "mlx-cuda", "mlx-cpu")


def runtime(device: DeviceProbe) -> Runtime:
    """mlx's backend (from the probe), its wheel and the mlx and mlx-lm versions (package metadata)."""
    v = versions()
    package = None
    for dist in BACKEND_PACKAGES:
        try:
            package = f"{dist} {metadata.version(dist)}"
            break
        except metadata.PackageNotFoundError:
            continue
    return Runtime(backend=device.backend, package=package, mlx=v["mlx"], mlx_lm=v["mlx_lm"],  # type: ignore[arg-type]
                   device=str(device.device_info.get("device_name", "")), error=device.error)


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind (host, port) now (with SO_REUSEADDR, as the stage does)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str, start: int, end: int) -> Ports:
    """The ports of [start, end] that are free on `host` right now."""
    return Ports(start=start, end=end, free=[p for p in range(start, end + 1) if port_is_free(host, p)])


def versions() -> dict[str, str | None]:
    """pipeserve, mlx, mlx-lm and Python versions (None when a package is missing)."""
    out: dict[str, str | None] = {"pipeserve": __version__}
    for key, dist in (("mlx", "mlx"), ("mlx_lm", "mlx-lm")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    out["python"] = sys.version.split()[0]
    return out


def platform_facts() -> dict[str, str]:
    """Operating system and machine, as platform reports them, and which physical machine this
    is (`machine_id`): agents that share one share its cores, and the prediction says so."""
    return {"system": platform.system(), "machine": platform.machine(), "release": platform.release(),
            "machine_id": machine_id()}


def machine_id() -> str:
    """A short, stable id of this physical machine, the same for every agent on it (network
    namespaces included): a hash of the OS's machine id, else of the host name. Hashed, because
    the OS's id is meant to stay on the machine."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            raw = Path(path).read_text().strip()
        except OSError:
            continue
        if raw:
            break
    else:
        raw = platform.node()
    return hashlib.sha256(f"pipeserve-machine:{raw}".encode()).hexdigest()[:16]
