"""The memory each platform's report gives a plan, from recorded inputs.

No Mac and no NVIDIA GPU runs this suite: the device information, vm_stat and nvidia-smi
outputs below are recorded (fakes at the one true external seam: the machine itself), shaped
as mlx 0.32's `mx.device_info()` and the tools print them. /proc/meminfo is recorded too, and
read live once (test_the_probe_and_the_report_agree_on_this_machine).
"""

from __future__ import annotations

import platform

import pytest

from orchestrator.agent import device_probe, report
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

GiB = 1 << 30

# mx.device_info() on an M2 Ultra with 192 GB (Metal): the GPU may wire about 3/4 of it.
METAL_INFO = {"architecture": "applegpu_g14d", "device_name": "Apple M2 Ultra", "max_buffer_size": 154618822656,
              "max_recommended_working_set_size": 154618822656, "memory_size": 206158430208, "resource_limit": 499000}
VM_STAT = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                              9876543.
Pages active:                            1234567.
Pages inactive:                           654321.
Pages speculative:                         12345.
Pages throttled:                               0.
Pages wired down:                         456789.
Pages purgeable:                            1000.
"Translation faults":                  123456789.
"""
# mx.device_info() with mlx's CUDA backend on one H100 80GB (NVML's figures), and nvidia-smi's rows.
CUDA_INFO = {"device_name": "NVIDIA H100 80GB HBM3", "architecture": "sm_90", "uuid": "GPU-0a1b",
             "pci_bus_id": "0000:1b:00.0", "compute_capability_major": 9, "compute_capability_minor": 0,
             "free_memory": 84_500_000_000, "total_memory": 85_520_809_984}
NVIDIA_SMI = "NVIDIA H100 80GB HBM3, 81559, 2048, 79511\n"
COMPUTE_APPS = "4242, 1500\n5151, 300\n"
MEMINFO = """MemTotal:       131900000 kB
MemFree:         2000000 kB
MemAvailable:   120000000 kB
Buffers:          100000 kB
"""
HOST_128G = HostMemory(total=128 * GiB, available=120 * GiB)


def test_proc_meminfo_gives_total_and_available():
    host = parse_meminfo(MEMINFO)
    assert (host.total, host.available) == (131_900_000 * 1024, 120_000_000 * 1024)
    # a kernel without MemAvailable: MemFree
    assert parse_meminfo("MemTotal: 1000 kB\nMemFree: 300 kB\n").available == 300 * 1024


def test_vm_stat_counts_reclaimable_pages_at_its_own_page_size():
    host = parse_vm_stat(VM_STAT, total=192 * GiB, page_size=4096)
    assert host.available == (9876543 + 654321 + 12345 + 1000) * 16384  # the page size vm_stat states
    assert host.wired == 456789 * 16384
    assert parse_vm_stat("Pages free: 10.\n", total=1, page_size=4096).available == 10 * 4096


def test_cpu_node_reports_the_os_figure_and_the_budget_caps_it():
    m = host_memory(parse_meminfo(MEMINFO), None, 0)
    assert m.kind == "host" and m.free_bytes == m.available_bytes == 120_000_000 * 1024
    capped = host_memory(parse_meminfo(MEMINFO), 2 * GiB, GiB // 2)
    assert capped.total_bytes == 2 * GiB and capped.free_bytes == GiB + GiB // 2


def test_metal_node_plans_with_the_recommended_working_set_not_vm_stats_free():
    host = parse_vm_stat(VM_STAT, total=METAL_INFO["memory_size"])
    assert host.available > METAL_INFO["max_recommended_working_set_size"]  # vm_stat shows more free
    m = metal_memory(METAL_INFO, host, None, 0)
    assert m.kind == "metal" and "working set" in m.source
    assert m.total_bytes == m.limit_bytes == m.free_bytes == 154618822656
    assert m.device_total_bytes == 206158430208 and m.wired_bytes == 456789 * 16384
    # what this agent's stages already hold comes off the working set; the budget still caps
    assert metal_memory(METAL_INFO, host, None, 50 * GiB).free_bytes == 154618822656 - 50 * GiB
    assert metal_memory(METAL_INFO, host, 64 * GiB, 10 * GiB).free_bytes == 54 * GiB
    # little free in vm_stat (other programs): that is the bound
    busy = HostMemory(total=host.total, available=20 * GiB)
    assert metal_memory(METAL_INFO, busy, None, 0).free_bytes == 20 * GiB


def test_metal_without_a_working_set_falls_back_to_the_os_figure():
    assert metal_memory({"device_name": "Apple M1"}, HOST_128G, None, 0).kind == "host"


def test_nvidia_smi_rows_parse_in_mib():
    (gpu,) = parse_nvidia_smi(NVIDIA_SMI + "NVIDIA A10G, [N/A], [N/A], [N/A]\n")
    assert (gpu.name, gpu.total, gpu.used, gpu.free) == ("NVIDIA H100 80GB HBM3", 81559 << 20, 2048 << 20, 79511 << 20)
    assert parse_compute_apps(COMPUTE_APPS, {4242}) == 1500 << 20
    assert parse_compute_apps(COMPUTE_APPS, set()) == 0


def test_cuda_node_plans_with_gpu_memory_under_mlxs_limit_not_host_ram():
    (gpu,) = parse_nvidia_smi(NVIDIA_SMI)
    limit = int(0.95 * CUDA_INFO["total_memory"])
    m = cuda_memory(CUDA_INFO, limit, gpu, HOST_128G, None, 0)
    assert m.kind == "cuda" and m.host_total_bytes == 128 * GiB
    assert m.device_total_bytes == 81559 << 20 and m.total_bytes == m.limit_bytes == min(limit, 81559 << 20)
    assert m.free_bytes == min(79511 << 20, m.limit_bytes - (2048 << 20)) < 80 * GiB < HOST_128G.available
    # the engines' GPU memory counts against the budget
    held = parse_compute_apps(COMPUTE_APPS, {4242, 5151})
    assert cuda_memory(CUDA_INFO, limit, gpu, HOST_128G, 10 * GiB, held).free_bytes == 10 * GiB - (1800 << 20)


def test_cuda_without_nvidia_smi_uses_mlxs_device_info():
    m = cuda_memory(CUDA_INFO, None, None, HOST_128G, None, 0)
    assert m.kind == "cuda" and m.device_total_bytes == CUDA_INFO["total_memory"]
    assert m.free_bytes == CUDA_INFO["free_memory"]


def test_a_gpu_machine_running_mlxs_cpu_backend_plans_with_its_ram(monkeypatch):
    monkeypatch.setattr(report, "host_figures", lambda: HOST_128G)
    cpu = device_probe.DeviceProbe(backend="cpu", device_info={"device_name": "AMD EPYC"})
    assert report.memory(None, 0, cpu).kind == "host"
    cuda = device_probe.DeviceProbe(backend="cuda", device_info=CUDA_INFO, memory_limit=70 * GiB)
    outputs = {"--query-gpu=name,memory.total,memory.used,memory.free": NVIDIA_SMI,
               "--query-compute-apps=pid,used_memory": COMPUTE_APPS}
    monkeypatch.setattr(report, "command_output", lambda cmd: outputs[cmd[1]])
    m = report.memory(None, 0, cuda, [4242])
    assert m.kind == "cuda" and m.processes_rss_bytes == 1500 << 20 and m.total_bytes == 70 * GiB


def test_the_probe_and_the_report_agree_on_this_machine():
    probed = device_probe.probe()
    assert probed.error is None and probed.backend in ("cpu", "cuda", "metal")
    assert probed.memory_limit and probed.memory_limit > 0
    rt = report.runtime(probed)
    assert rt.mlx == report.versions()["mlx"] and rt.package and rt.backend == probed.backend
    if platform.system() == "Linux" and probed.backend == "cpu":
        m = report.memory(None, 0, probed)
        assert m.kind == "host" and m.free_bytes > 0


@pytest.mark.parametrize("answer, error", [("", "mlx does not load"), ("not json", "device probe answered")])
def test_a_probe_that_fails_says_why(monkeypatch, answer, error):
    class Done:
        returncode, stdout, stderr = (0 if answer else 1), answer, "ImportError: libcudart.so.13"

    monkeypatch.setattr(device_probe.subprocess, "run", lambda *a, **k: Done)
    probed = device_probe.probe()
    assert probed.backend is None and error in (probed.error or "")
