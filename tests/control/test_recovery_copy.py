"""A stage whose node vanished moves to a node that first copies the model over the LAN.

Real agents (three), stage processes, coordinator and router, as in test_recovery_move.py: a
2-stage cluster runs on node-a (stage 0, coordinator) and node-b (stage 1); only node-a and
node-b hold the model, and node-a has no memory to spare (a 1 MiB budget), so when node-b
goes away the only node with room, node-c, must get the model first — copied from node-a,
every file verified — before stage 1 starts there. Timing is printed, never asserted beyond
generous bounds (a loaded 2-core machine).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.control.rules.state import Session
from orchestrator.proc import wait_until
from tests.control.conftest import MODEL_ID, Env
from tests.support.recovery_rig import ended, pids, three_agents, vanish
from tests.support.sessions import ask, healthy, wait_router_lists

# node-a serves node-c's copy slowly in the stop test: the copy of the small test model
# (a few MB) then takes well over a minute, long enough to stop the session during it.
SLOW_UPLOAD = "24K"


@pytest.fixture
def env_copy(spawn_agent, start_router, test_model_dir: Path, tmp_path: Path) -> Iterator[Env]:
    """node-a holds the model but has no memory to spare; node-c has room but not the model."""
    yield from three_agents(spawn_agent, start_router, test_model_dir, tmp_path,
                            {"node-a": ("--memory-budget", "1M")}, ("node-a", "node-b"))


@pytest.fixture
def env_slow_copy(spawn_agent, start_router, test_model_dir: Path, tmp_path: Path) -> Iterator[Env]:
    """As env_copy, and node-a serves model files to peers at SLOW_UPLOAD bytes per second."""
    yield from three_agents(spawn_agent, start_router, test_model_dir, tmp_path,
                            {"node-a": ("--memory-budget", "1M", "--upload-limit", SLOW_UPLOAD)},
                            ("node-a", "node-b"))


def steps(s: Session) -> list[tuple[str, str, str]]:
    """(key, state, detail) of the session's timeline, for assertion messages."""
    return [(x.key, x.state, x.detail) for x in s.timeline]


def live(env: Env) -> list[str]:
    """Live engine processes on the nodes still there (node-a, node-c)."""
    return [f"{a.name}:{p.node_id}" for a in (env.agents[0], env.agents[2]) for p in a.client.processes() if p.alive]


def leftovers(env: Env, i: int) -> list[str]:
    """Anything of the model on node i's disk: its directory or partial files of a copy."""
    root = env.agents[i].models_dir
    return [str(p.relative_to(root)) for p in (root / MODEL_ID, root / ".partial" / MODEL_ID) if p.exists()]


def test_a_stage_moves_to_a_node_that_copies_the_model_first(env_copy: Env):
    env = env_copy
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    wait_router_lists(env, True)
    answer = ask(env)
    before = pids(env, s.id, [0, 1])
    assert before["stage-1"][0] == "node-b" and leftovers(env, 2) == []
    killed = time.monotonic()
    vanish(env, 1)
    s = ended(env, s.id)
    took = time.monotonic() - killed
    assert s.phase == "running" and s.health == "Healthy", (s.reason, steps(s))
    assert s.stages[1].node_name == "node-c" and s.stages[1].node_id == env.node_id(2)
    after = pids(env, s.id, [0, 2])
    assert after["stage-0"] == before["stage-0"] and after["coordinator"] == before["coordinator"]
    assert after["stage-1"][0] == "node-c"

    # The copy is a step of the attempt, done before the move, with its bytes.
    timeline = {x.key: x for x in s.timeline if x.key.startswith("recovery-1.")}
    copy = next(x for k, x in timeline.items() if k.endswith("stage-1.copy"))
    assert copy.state == "done" and "copied to node-c over the LAN from node-a" in copy.label, steps(s)
    assert "verified by the node" in copy.detail, copy
    keys = list(timeline)
    assert keys.index(copy.key) < keys.index(copy.key.replace(".copy", ".move")) < \
        keys.index(copy.key.replace(".copy", ".start"))
    assert all(x.state == "done" for x in timeline.values()), steps(s)

    # node-c's copy is the reference, byte for byte (its agent checks it against node-a's manifest).
    reference = env.agents[0].client.model(MODEL_ID).manifest
    assert reference is not None
    check = env.agents[2].client.check(MODEL_ID, reference, rehash=True)
    assert check.status == "present", check
    assert not (env.agents[2].models_dir / ".partial" / MODEL_ID).exists()

    wait_router_lists(env, True, timeout=30)
    assert ask(env) == answer  # the same greedy completion as before the fault
    print(f"node-b lost -> model copied to node-c, stage 1 Healthy there in {took:.2f} s "
          f"(copy: {copy.detail}; fault seen -> Healthy: {s.faults[-1].recovery_s} s)")
    env.orch.stop_session(s.id)
    env.orch.wait(lambda st: not st.sessions, 60)
    assert live(env) == [] and env.backends() == []


def test_stopping_the_session_during_the_copy_leaves_nothing_behind(env_slow_copy: Env):
    env = env_slow_copy
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    vanish(env, 1)

    def copying(st) -> bool:
        x = st.session(s.id)
        return x is not None and any(k.key.endswith("stage-1.copy") and k.state == "running" for k in x.timeline)

    env.orch.wait(copying, 180)

    def shown_progress(st) -> str:
        x = st.session(s.id)
        step = next((k for k in x.timeline if k.key.endswith("stage-1.copy")), None) if x is not None else None
        return step.detail if step is not None and not step.detail.startswith("0 B of") else ""

    # The timeline shows the copy's progress while it runs: bytes of the total, per cent and rate.
    detail = shown_progress(env.orch.wait(shown_progress, 60))
    assert re.fullmatch(r"[\d.]+ (B|KiB|MiB) of [\d.]+ (KiB|MiB) \(\d+ %\)(, [\d.]+ (B|KiB|MiB)/s)?", detail), detail
    print(f"copy progress shown while it ran: {detail}")
    # Some bytes have arrived on node-c (partial files), none of them visible as the model.
    wait_until(lambda: (env.agents[2].models_dir / ".partial" / MODEL_ID).exists(), 60,
               message="node-c's copy never started")
    assert not (env.agents[2].models_dir / MODEL_ID).exists()
    progress = env.agents[2].client.progress(MODEL_ID)
    assert progress.state == "running", progress
    env.orch.stop_session(s.id)
    st = env.orch.wait(lambda st: not st.sessions, 120)
    gone = st.history[-1]
    assert gone.phase == "stopped", gone.reason
    wait_until(lambda: leftovers(env, 2) == [], 60, message=f"node-c kept {leftovers(env, 2)}")
    assert env.agents[2].client.progress(MODEL_ID).state == "cancelled"
    assert live(env) == [] and env.backends() == []
