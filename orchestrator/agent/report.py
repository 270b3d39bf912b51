"""Facts about the node: accelerator family, memory, free transport ports, versions.

Detected, never configured (the planner refuses mixed clusters on these facts), except the
memory budget, which lets one machine model several small nodes. Nothing here imports mlx:
versions come from package metadata, so a report stays cheap.
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
from importlib import metadata
from pathlib import Path

from orchestrator import __version__
from orchestrator.agent.schemas import Accelerator, Memory, Ports

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


def os_memory() -> tuple[int, int]:
    """(total, available) bytes as the OS reports them."""
    if platform.system() == "Linux":
        info: dict[str, int] = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields:
                info[key] = int(fields[0]) * 1024
        return info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
    if platform.system() == "Darwin":
        total = int(command_output(["sysctl", "-n", "hw.memsize"]) or 0)
        page = int(command_output(["sysctl", "-n", "hw.pagesize"]) or 4096)
        free_pages = 0
        for line in command_output(["vm_stat"]).splitlines():
            if line.startswith(("Pages free", "Pages inactive", "Pages speculative", "Pages purgeable")):
                free_pages += int(line.split(":")[1].strip().rstrip("."))
        return total, free_pages * page
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return pages, pages


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


def memory(budget: int | None, processes_rss: int) -> Memory:
    """The memory section of the report.

    free = min(OS available, budget - what our engine processes already hold): a budget
    models a smaller node, and a stage started on it uses up its budget as it would on a
    real one.
    """
    total, available = os_memory()
    free = available if budget is None else max(0, min(available, budget - processes_rss))
    return Memory(total_bytes=total if budget is None else min(total, budget), available_bytes=available,
                  budget_bytes=budget, processes_rss_bytes=processes_rss, free_bytes=free)


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
