"""LocalPipeline, the harness behind tests and benchmarks: a port another process took between picking
it and a child binding it starts the pipeline again on fresh ports; no other failure is retried."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent.probes import process_identity
from orchestrator.engine.local_pipeline import LaunchError, LocalPipeline
from orchestrator.proc import wait_until


def test_a_port_taken_before_the_coordinator_binds_it_is_picked_again(tmp_path, model_factory):
    """As another suite's server once took a coordinator's HTTP port (Errno 98, the test failed)."""
    model = model_factory()
    p = LocalPipeline(tmp_path / "c", model, [(0, 1), (2, 3)], threads=1)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", p.http_port))
    squatter.listen()
    taken = p.http_port
    try:
        p.start()
        assert p.http_port != taken and p.wait_ready()["ready"]
    finally:
        p.stop()
        squatter.close()


def test_a_port_another_process_listens_on_before_the_stage_binds_it_is_picked_again(tmp_path, model_factory):
    """The squatter answers a connect to the stage's port: only the stage's own word that it listens
    counts, so its bind failure is seen and the pipeline starts again on fresh ports."""
    model = model_factory()
    p = LocalPipeline(tmp_path / "c", model, [(0, 1), (2, 3)], threads=1)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", p.ports[1]))  # stage-0's transport port
    squatter.listen()
    taken = p.ports[1]
    try:
        p.start()
        assert p.ports[1] != taken and p.wait_ready()["ready"]
    finally:
        p.stop()
        squatter.close()


def test_any_other_launch_failure_is_not_retried(tmp_path, model_factory):
    p = LocalPipeline(tmp_path / "c", tmp_path / "no-model-here", [(0, 1), (2, 3)], threads=1, startup_timeout=60)
    ports = list(p.ports)
    with pytest.raises(LaunchError):
        p.start()
    assert p.ports == ports


LAUNCHER = """
import sys, time
from pathlib import Path
from orchestrator.engine.local_pipeline import LocalPipeline
p = LocalPipeline(Path(sys.argv[1]), Path(sys.argv[2]), [(0, 1), (2, 3)], threads=1).start()
print(" ".join(str(c.pid) for c in p.procs.values()), flush=True)
time.sleep(600)
"""


def test_a_launcher_killed_before_stop_leaves_no_engine_process(tmp_path, model_factory):
    """A test or benchmark killed (`kill -9`, no `stop()`) must not leave its stages and coordinator
    running, holding ports and cores beside the next run: they watch their launcher as an agent's do."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path / "c"), str(model_factory())],
                                stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        pids = [int(x) for x in launcher.stdout.readline().split()]
        assert len(pids) == 3, "the launcher did not start its pipeline"
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
    wait_until(lambda: all(process_identity(pid) is None for pid in pids), 30,
               message=f"the orphaned engine processes {pids} to stop")
