"""The evented stack (gevent worker) keeps what the threaded one did: zeroconf discovery runs
inside the dashboard process (its asyncio loop must not leak into other greenlets, see
webapp.asyncio_bridge) and the process warns about nothing it patched too late."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests

from orchestrator.proc import wait_until
from orchestrator.proc.wait import WaitTimeout
from tests.support.dashboard_server import ROOT, free_port, start_dashboard


def test_discovery_finds_an_agent_under_the_gevent_worker(tmp_path: Path):
    port = free_port()
    with open(tmp_path / "agent.log", "wb") as log:
        agent = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "agent", "--host", "127.0.0.1", "--port",
                                  str(port), "--name", "gevent-probe", "--models-dir", str(tmp_path / "models"),
                                  "--state-dir", str(tmp_path / "agent")], cwd=ROOT, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    d = None
    try:
        d = start_dashboard(tmp_path, "--discovery", "--discovery-interface", "127.0.0.1")
        def discovered() -> bool:
            state = requests.get(d.url + "/api/state", headers={"Authorization": f"Bearer {d.admin_token}"},
                                 timeout=5).json()
            return "gevent-probe" in [n["name"] for n in state["discovered"]]

        found = True
        try:
            wait_until(discovered, 30, interval=0.3, message="zeroconf to find the agent")
        except WaitTimeout:
            found = False
        log = d.log()
        assert found, log
        assert "Traceback" not in log and "MonkeyPatchWarning" not in log, log
    finally:
        if d is not None:
            d.stop()
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(15)
