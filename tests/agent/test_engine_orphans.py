"""An agent killed with SIGKILL cannot stop its engine processes: they must stop by themselves.

Real agent, real stage and coordinator (the tiny test model), `kill -9` of the agent; the
engine processes and their ports must be gone well within their lease.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from orchestrator.agent.probes import process_identity
from orchestrator.proc import WaitTimeout, port_free, wait_until
from tests.agent.conftest import copy_model
from tests.support.engine_jobs import MODEL, cluster_toml, stage_request

LEASE_S = 60.0
# The engine checks its parent every 0.25 s and exits gracefully: seconds, not the lease's
# minute, so waiting at most the lease proves the parent watch (not the lease) stopped it.


def process_gone(pid: int) -> bool:
    """No such process, or a zombie (exited; waiting for its new parent to reap it)."""
    return process_identity(pid) is None


def test_engine_processes_stop_by_themselves_when_their_agent_is_killed(spawn_agent, test_model_dir, tmp_path):
    a = spawn_agent("a")
    copy_model(test_model_dir, a.models_dir, MODEL)
    stage_port, http_port = a.port_at(1), a.port_at(2)
    config = cluster_toml(tmp_path, [(0, 3)], [a.port_at(0), stage_port])
    secret = secrets.token_hex(16)
    stage = a.client.start_process(stage_request(config, "stage-0", secret, lease_s=LEASE_S))
    wait_until(lambda: a.client.process("c1", "stage-0").port_listening, 60, message="the stage listening")
    coord = a.client.start_process({"kind": "coordinator", "cluster_id": "c1", "node_id": "coordinator",
                                    "model_id": MODEL, "config": config, "secret": secret, "lease_s": LEASE_S,
                                    "http_port": http_port})

    def healthy() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{http_port}/health", timeout=2).json().get("ready", False)
        except requests.RequestException:
            return False

    wait_until(healthy, 60, message="the coordinator to be ready")

    a.stop(signal.SIGKILL)  # a crash: the agent enforces nothing any more
    t0 = time.monotonic()
    gone: dict[str, float] = {}
    watched = {"stage": (stage.pid, stage_port), "coordinator": (coord.pid, http_port)}

    def all_gone() -> bool:
        for name, (pid, port) in watched.items():
            if name not in gone and process_gone(pid) and port_free(port):
                gone[name] = time.monotonic() - t0
        return len(gone) == len(watched)

    try:
        wait_until(all_gone, LEASE_S, message="both engine processes gone and their ports free")
    except WaitTimeout:
        pass  # the assertions below say which one stayed
    print(f"after kill -9 of the agent (lease {LEASE_S:.0f} s): "
          + ", ".join(f"{n} gone and port free in {s:.2f} s" for n, s in gone.items()))
    for name in watched:
        assert name in gone, (name, gone, a.output())  # gone by itself, before its lease would have ended

    # A restarted agent finds the records and says what happened.
    a.restart()
    for node_id in ("stage-0", "coordinator"):
        info = a.client.process("c1", node_id)
        assert not info.alive and info.stop_reason == "exited while the agent was down", info
    assert os.path.exists(a.state_dir / "processes" / "c1" / "stage-0" / "output.log")
    assert any("agent.gone" in line for line in a.client.logs("c1", "stage-0", 50))


CHILD = """
import os, signal, sys, time
from orchestrator import logs
from orchestrator.engine.parent_watch import watch_parent
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a child whose graceful stop hangs
watched = watch_parent(logs.setup("child"), poll_s=0.05, grace_s=0.5)
print("watched" if watched else "unwatched", flush=True)
time.sleep(60)
"""

PARENT = """
import os, subprocess, sys, time
env = dict(os.environ)
if sys.argv[1] == "watch":
    env["PIPESERVE_PARENT_PID"] = str(os.getpid())
child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], env=env, start_new_session=True)
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("mode", ["watch", "unwatched"])
def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(mode):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode, CHILD], stdout=subprocess.PIPE,
                              cwd=Path(__file__).resolve().parents[2])
    child_pid = int(parent.stdout.readline())
    try:
        # The child shares the parent's stdout: its first line says it is up, and whether it watches.
        assert parent.stdout.readline().strip() == (b"watched" if mode == "watch" else b"unwatched")
        parent.kill()
        parent.wait()
        t0 = time.monotonic()
        if mode == "watch":
            wait_until(lambda: process_gone(child_pid), 15, message="the orphaned child to stop")
            print(f"orphan gone {time.monotonic() - t0:.2f} s after its parent's SIGKILL (grace 0.5 s)")
        else:
            time.sleep(1.5)  # an absence needs a window: three times the grace period a watch would use
            assert not process_gone(child_pid)  # started by hand: nobody asked for a watch
    finally:
        parent.stdout.close()
        try:
            os.kill(child_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
