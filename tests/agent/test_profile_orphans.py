"""The layer-timing child never competes with serving (issue 38 item 4): it stops with its agent
(one outlived its stopped agent twice, still using CPU beside the stages: a real parent process
runs the agent's `run_profile_process` with a child that would time for ten minutes, and is
killed with SIGKILL), yields to a stage that starts on its node, and never starts beside one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator import logs
from orchestrator.agent.compute import ComputeProfiler, ProfileFailed, run_profile_process
from orchestrator.proc import wait_until
from tests.support.agents import gone

GONE_WITHIN_S = 10.0  # the kernel signals at once; the rest is a loaded machine's scheduling




def test_the_timing_child_ends_when_its_agent_is_killed(tmp_path: Path):
    pid_file = tmp_path / "timing.pid"
    timing = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                                    "time.sleep(600)"]
    agent = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                              "from orchestrator.agent.compute import run_profile_process; "
                              f"run_profile_process(Path('.'), Path({str(tmp_path / 'out.json')!r}), {timing!r})"],
                             cwd=Path(__file__).resolve().parents[2])
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, 0.1, message="the timing child")
        child = int(pid_file.read_text())
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(10)
        wait_until(lambda: gone(child), GONE_WITHIN_S, 0.1, message="the timing child to end with its agent")
    finally:
        agent.kill()
        if pid_file.exists() and not gone(int(pid_file.read_text() or 0)):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_timing_yields_to_a_stage_that_starts_on_its_node(tmp_path: Path):
    """It never competes with serving: a stage starting on the node stops the timing child (one
    that did not yield would end by itself after 30 s, without a timing: the test fails then)."""
    pid_file = tmp_path / "timing.pid"
    timing = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                                    "time.sleep(30)"]
    serving = lambda: pid_file.exists() and bool(pid_file.read_text().strip())  # noqa: E731 (a stage starts then)
    with pytest.raises(ProfileFailed, match="a stage started on this node"):
        run_profile_process(tmp_path, tmp_path / "out.json", timing, stop=serving)
    assert gone(int(pid_file.read_text()))


def test_a_timing_never_starts_beside_a_stage(tmp_path: Path):
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    inventory = SimpleNamespace(model_dir=lambda model_id: model)
    profiler = ComputeProfiler(inventory, tmp_path, logs.get("test"), run=lambda d, o: pytest.fail("timed"),
                               serving=lambda: True)
    status = profiler.start("m")
    assert status.state == "failed" and "serves a stage now" in status.error
