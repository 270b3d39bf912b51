"""LocalPipeline, the harness behind tests and benchmarks: a port another process took between picking
it and a child binding it starts the pipeline again on fresh ports; no other failure is retried."""

from __future__ import annotations

import socket

import pytest

from orchestrator.engine.local_pipeline import LaunchError, LocalPipeline


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
