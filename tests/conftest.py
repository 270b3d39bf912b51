"""Shared fixtures: a tiny random test model and the SmolLM2 demo model."""

from __future__ import annotations

# The stage processes load OpenBLAS when it is installed; the in-test reference must run
# on the same BLAS for bit-exact comparisons, so load it before anything imports mlx. And with
# the same thread count as the stages the tests start (one: LocalPipeline's threads=1): Debian's
# OpenBLAS 0.3.21 computes a GEMM's last bits differently on 1 and 2 threads (log-probs differed
# by 1e-6), where the cmeel wheel's did not. Only this process: children pick their own.
from orchestrator.engine import blas

blas.preload()
blas.set_threads(1)

import os

# The suite keeps this machine busy on purpose: every layer timing would look doubtful and be taken
# three times with pauses between. One timing each (shown flagged); tests/agent/test_compute_retry.py
# checks the retries themselves with an injected load.
os.environ.setdefault("PIPESERVE_TIMING_TRIES", "1")

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.proc import ChildError, free_port, free_port_block
from tests.support.agents import AgentProc
from tests.support.router import RouterProc

ROUTER_STARTUP_TIMEOUT = 15.0


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`model_factory(layers=6, tied=False, ...)` builds a test model once per option set."""
    from orchestrator.testmodels.llama import make_test_model

    made: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("models")

    def make(**options: object) -> Path:
        key = tuple(sorted(options.items()))
        if key not in made:
            name = "-".join(f"{k}{v}" for k, v in key) or "default"
            made[key] = make_test_model(root / name, **options)
        return made[key]

    return make


@pytest.fixture(scope="session")
def test_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default random test model (4 layers, 64 wide, vocab 512, float32, tied, seed 0)."""
    from orchestrator.testmodels.llama import make_test_model

    return make_test_model(tmp_path_factory.mktemp("test-model") / "model")


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """SmolLM2-135M-Instruct in float32, imported once and kept in the pipeserve cache
    (~540 MB) so later test runs (and `make demo`) reuse it."""
    from orchestrator.models.demo import cached_demo_model

    return cached_demo_model("float32")


# --- real agent and router processes, for every test package --------------------------

@pytest.fixture
def spawn_agent(tmp_path: Path) -> Iterator[Callable[..., AgentProc]]:
    """`spawn_agent("a", *extra_args, advertise=False, env={}, wait=True)` → a started, paired AgentProc."""
    agents: list[AgentProc] = []
    # Ports handed to this test's agents: nothing binds a transport range until a launch, so two
    # draws could overlap (two agents' stages on one ip:port failed a launch in make test).
    taken: set[int] = set()

    def unused(n: int) -> tuple[int, int]:
        for _ in range(100):
            first, last = free_port_block(n)
            if taken.isdisjoint(range(first, last + 1)):
                taken.update(range(first, last + 1))
                return first, last
        raise RuntimeError(f"no free ports apart from this test's agents' {sorted(taken)}")

    def spawn(name: str = "a", *args: str, advertise: bool = False, env: dict[str, str] | None = None,
              wait: bool = True, ports: int = 4) -> AgentProc:
        a = AgentProc(name, tmp_path / name, unused(1)[0], unused(ports),
                      [*args, *([] if advertise else ["--no-advertise"])], env or {})
        a.models_dir.mkdir(parents=True, exist_ok=True)
        agents.append(a)
        a.launch()
        return a.wait_ready() if wait else a

    yield spawn
    for a in agents:
        a.stop()
        a.kill_engine_leftovers()
        # Shown by pytest only when the test failed ("Captured stdout teardown").
        print(f"----- agent {a.name} (run {a.starts}) -----\n{a.output(40)}")


@pytest.fixture
def start_router(tmp_path: Path) -> Iterator[Callable[..., RouterProc]]:
    """`start_router(config_path)` runs a router until the test ends."""
    started: list[RouterProc] = []

    def start(config_path: Path, reload_interval: float = 0.2) -> RouterProc:
        try:
            router = RouterProc(config_path, free_port(), tmp_path / f"router{len(started)}.log",
                                reload_interval).start(ROUTER_STARTUP_TIMEOUT)
        except ChildError as exc:
            pytest.fail(str(exc), pytrace=False)
        started.append(router)
        return router

    yield start
    for r in started:
        r.stop(5)
