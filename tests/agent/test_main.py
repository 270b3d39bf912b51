"""`pipeserve agent` on the command line, and what the agent package may import."""

from __future__ import annotations

import socket
import subprocess
import sys


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "agent", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_the_agent_imports_neither_flask_nor_the_control_plane_nor_mlx():
    code = ("import sys, orchestrator.agent.main, orchestrator.agent.agent, orchestrator.agent.client, "
            "orchestrator.agent.discovery\n"
            "bad = sorted(m for m in sys.modules\n"
            "             if m.split('.')[0] in ('flask', 'webapp', 'mlx', 'mlx_lm', 'werkzeug'))\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_help_and_bad_arguments(tmp_path):
    shown = _run("--help")
    assert shown.returncode == 0 and "--memory-budget" in shown.stdout and "--transport-ports" in shown.stdout
    for bad in (["--memory-budget", "lots"], ["--transport-ports", "9-1"], ["--name", "../x"]):
        out = _run("--models-dir", str(tmp_path / "m"), *bad)
        assert out.returncode == 2 and bad[0] in out.stderr, out.stderr


def test_a_taken_port_fails_clearly_after_printing_the_token(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = _run("--port", str(port), "--name", "n", "--models-dir", str(tmp_path / "m"), "--state-dir",
                   str(tmp_path / "s"), "--no-advertise")
    assert out.returncode == 3 and "agent.start_failed" in out.stderr
    assert "pairing token: " in out.stdout  # shown even so: it is stored only as a digest
