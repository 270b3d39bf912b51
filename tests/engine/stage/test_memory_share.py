"""A stage sets mlx's limits to its share of the node's memory and fails fast, with the reason, when the
share cannot be had or its weights overrun it.

The Metal and CUDA limits are computed from recorded device information (no Mac or GPU runs this
suite); on this machine's mlx the limit is set for real, in-process and in a real stage process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from orchestrator.engine.local_pipeline import write_config
from orchestrator.engine.stage import memory_share
from orchestrator.engine.stage.memory_share import MemoryShareError, limits_for
from orchestrator.proc import free_port
from orchestrator.testmodels.families import build_family_model
from tests.agent.test_device_memory import CUDA_INFO, METAL_INFO

GiB = 1 << 30
SHARE_REFUSED = 5  # stage main's exit status


def test_on_metal_a_stage_wires_its_share_and_refuses_more_than_the_working_set():
    limits = limits_for(40 * GiB, "metal", METAL_INFO)
    assert (limits.memory, limits.wired) == (40 * GiB, 40 * GiB)
    with pytest.raises(MemoryShareError, match="recommended working set"):
        limits_for(METAL_INFO["max_recommended_working_set_size"] + 1, "metal", METAL_INFO)


def test_on_cuda_a_stage_limits_itself_to_its_share_of_the_gpu_and_refuses_more_than_the_gpu():
    limits = limits_for(30 * GiB, "cuda", CUDA_INFO)
    assert (limits.memory, limits.wired) == (30 * GiB, None)  # no wired memory on CUDA
    with pytest.raises(MemoryShareError, match="NVIDIA H100"):
        limits_for(CUDA_INFO["total_memory"] + 1, "cuda", CUDA_INFO)
    assert limits_for(8 * GiB, "cpu", {"device_name": "AMD EPYC"}).memory == 8 * GiB


def test_apply_sets_mlxs_memory_limit_in_this_process():
    before = mx.get_memory_limit()
    try:
        assert memory_share.apply(123 << 20).memory == 123 << 20
        assert mx.get_memory_limit() == 123 << 20
    finally:
        mx.set_memory_limit(before)


def test_weights_that_overrun_the_share_are_refused():
    assert memory_share.check_loaded(100, active=100) == 100
    with pytest.raises(MemoryShareError, match="more than its share"):
        memory_share.check_loaded(100, active=101)


def _stage(tmp_path: Path, share: int) -> subprocess.Popen:
    model = build_family_model(tmp_path / "model", "llama")
    config = write_config(tmp_path / "cluster.toml", "share", [(0, 2), (3, 5)], [free_port() for _ in range(3)])
    text = config.read_text().replace('id = "stage-0"\n', f'id = "stage-0"\nmemory_bytes = {share}\n')
    config.write_text(text)
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "stage", "--config", str(config), "--node-id", "stage-0",
         "--model", str(model)],
        env={**os.environ, "PIPESERVE_CLUSTER_SECRET": "s" * 32}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)


def test_a_stage_whose_weights_overrun_its_share_exits_with_the_reason(tmp_path: Path):
    proc = _stage(tmp_path, 4096)
    try:
        _, err = proc.communicate(timeout=120)
    finally:  # a stage that did not refuse serves on: never leave it behind
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == SHARE_REFUSED, err
    assert "memory.share_refused" in err and "more than its share of 4.0 KiB" in err
    assert "transport.listening" not in err


def test_a_stage_sets_its_share_as_mlxs_limit_and_serves(tmp_path: Path):
    proc = _stage(tmp_path, 512 << 20)
    try:
        seen = []
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if "transport.listening" in line or "stage.stopped" in line:
                break
        text = "".join(seen)
        assert "memory.limit_set" in text and f"memory_limit={512 << 20}" in text, text
        assert "transport.listening" in text
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
