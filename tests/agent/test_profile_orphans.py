"""The layer-timing child stops with its agent (issue 38 item 4): one outlived its stopped agent
twice, still using CPU beside the stages. A real parent process runs the agent's
`run_profile_process` with a child that would time for ten minutes, and is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from orchestrator.proc import wait_until

GONE_WITHIN_S = 10.0  # the kernel signals at once; the rest is a loaded machine's scheduling


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


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
        wait_until(lambda: _gone(child), GONE_WITHIN_S, 0.1, message="the timing child to end with its agent")
    finally:
        agent.kill()
        if pid_file.exists() and not _gone(int(pid_file.read_text() or 0)):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
