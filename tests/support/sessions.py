"""Helpers for tests that run whole sessions through a real control plane (tests/control).

`env` is the control tests' `Env` (tests/control/conftest.py): an orchestrator, real agents
and a real router. These waits and looks were written once per test module before.
"""

from __future__ import annotations

import time
from typing import Any

import openai

from orchestrator.control.rules.state import Session
from orchestrator.proc import wait_until
from tests.support import builders

MODEL_ID = "tiny"  # the control tests' model (tests/control/conftest.py)


def healthy(env: Any, session_id: str, timeout: float = 90.0) -> Session:
    """The session once its launch ended; asserts it serves (the timeline says why when not)."""
    st = env.orch.wait(lambda st: (s := st.session(session_id)) is None or s.phase != "launching", timeout)
    s = st.session(session_id)
    assert s is not None, f"session {session_id} ended: {st.history[-1].reason if st.history else '?'}"
    assert s.phase == "running" and s.health == "Healthy", (s.reason, [(x.key, x.state, x.detail) for x in s.timeline])
    return s


def ask(env: Any, prompt: str = "hello", model: str = MODEL_ID) -> str:
    """One short greedy chat completion through the router, with the official client."""
    client = openai.OpenAI(base_url=env.router.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                          max_tokens=8, temperature=0).choices[0].message.content


def wait_router_lists(env: Any, present: bool, timeout: float = 10.0, model: str = MODEL_ID) -> None:
    """Until the router lists the model (or no longer does)."""
    wait_until(lambda: (model in env.router.models()) == present, timeout, 0.1,
               message=f"the router {'listing' if present else 'dropping'} {model}")


def pids(env: Any, session_id: str) -> dict[str, int]:
    """Process id of each live engine process of the session, by its name."""
    return {p.node_id: p.pid for a in env.agents for p in a.client.processes()
            if p.cluster_id == session_id and p.alive}


def lease_ends(env: Any, session_id: str) -> dict[str, float]:
    """When each live process's lease ends, on this test's monotonic clock (from the agents' remaining time)."""
    now = time.monotonic()
    return {p.node_id: now + p.lease_remaining_s for a in env.agents for p in a.client.processes()
            if p.cluster_id == session_id and p.alive and p.lease_remaining_s is not None}


def running_session(sid: str = "s1") -> Session:
    """A running, healthy 2-stage session on loopback, stages on n0 and n1 (no processes behind it)."""
    return builders.session(sid, name="c", model="m", splits=((0, 1), (2, 3)), host="127.0.0.1", port=40000,
                            coordinator_port=40010, health="Healthy")
