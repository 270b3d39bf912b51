"""Node facts: sizes, port ranges, memory budget, free ports, accelerator, versions."""

from __future__ import annotations

import platform
import socket
from importlib import metadata

import pytest

import orchestrator
from orchestrator.agent import report


@pytest.mark.parametrize("text, expected", [("300M", 300 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29),
                                            ("4096", 4096), ("512k", 512 << 10), ("1T", 1 << 40)])
def test_parse_size(text, expected):
    assert report.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "G", "-1G", "1.2.3M", "2X", "two"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        report.parse_size(bad)


def test_parse_port_range():
    assert report.parse_port_range("39600-39629") == (39600, 39629)
    for bad in ("39629-39600", "80-90", "1000-70000", "39600", "a-b"):
        with pytest.raises(ValueError):
            report.parse_port_range(bad)


def test_memory_budget_caps_what_is_reported():
    total, available = report.os_memory()
    assert 0 < available <= total
    plain = report.memory(None, 0)
    assert plain.total_bytes == total and plain.budget_bytes is None and plain.free_bytes > 0
    small = report.memory(300 << 20, 100 << 20)
    assert small.total_bytes == 300 << 20 and small.free_bytes == 200 << 20
    assert report.memory(300 << 20, 400 << 20).free_bytes == 0


def test_free_ports_excludes_a_listening_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        ports = report.free_ports("127.0.0.1", taken, min(taken + 2, 65535))
        assert taken not in ports.free and ports.start == taken
    assert report.port_is_free("127.0.0.1", taken)


def test_accelerator_is_detected(monkeypatch):
    detected = report.detect_accelerator()
    if platform.system() == "Linux":
        assert detected.family in ("linux-cpu", "linux-cuda") and detected.detail
    monkeypatch.setattr(report.platform, "system", lambda: "Linux")
    monkeypatch.setattr(report, "_nvidia_gpus", lambda: ["NVIDIA H100, 81559 MiB"])
    assert report.detect_accelerator().family == "linux-cuda"
    monkeypatch.setattr(report, "_nvidia_gpus", lambda: [])
    assert report.detect_accelerator().family == "linux-cpu"
    monkeypatch.setattr(report.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(report.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(report, "command_output", lambda cmd: "Apple M2 Max")
    assert report.detect_accelerator().model_dump() == {"family": "apple-silicon", "detail": "Apple M2 Max"}


def test_versions_come_from_metadata():
    v = report.versions()
    assert v["pipeserve"] == orchestrator.__version__
    assert v["mlx"] == metadata.version("mlx") and v["mlx_lm"] == metadata.version("mlx-lm")
    assert v["python"] == platform.python_version()
