"""A frozen agent must not cost a healthy node its lease: its calls wait out their timeouts, and
meanwhile every other node's leases are still renewed on time. Fakes stand in for the agents (the
real partition, an agent under SIGSTOP, is tests/control/test_recovery_move.py)."""

from __future__ import annotations

import threading

from orchestrator.control.rules.state import State
from orchestrator.control.watcher import Watcher
from orchestrator.proc import wait_until
from tests.support.sessions import running_session as session


class FrozenAgent:
    """Every call waits until the test ends (an agent stopped with SIGSTOP, its timeouts long)."""

    def __init__(self, thawed: threading.Event) -> None:
        self.thawed, self.calls = thawed, 0

    def renew_lease(self, session_id: str, lease_s: float) -> None:
        self.calls += 1
        self.thawed.wait()

    def processes(self) -> list:
        self.calls += 1
        self.thawed.wait()
        return []


class LiveAgent:
    def __init__(self) -> None:
        self.renewals = 0

    def renew_lease(self, session_id: str, lease_s: float) -> None:
        self.renewals += 1

    def processes(self) -> list:
        return []


def test_a_frozen_agent_holds_neither_the_other_nodes_leases_nor_more_than_one_worker():
    s = session()
    frozen_node, *live_nodes = s.node_ids
    assert live_nodes, "the session must run on more than one node"
    thawed = threading.Event()
    frozen = FrozenAgent(thawed)
    live = {n: LiveAgent() for n in live_nodes}
    agents = {frozen_node: frozen, **live}
    w = Watcher(lambda: State(sessions=(s,)), agents.get, lambda e: None, interval=0.05, lease_s=0.6)
    w._observe = lambda *a: None  # the sessions' judging is not what this test is about
    w.start()
    try:
        # the watch cycle is stuck on the frozen agent's process listing from its first round on;
        # the leases' own thread goes on renewing the live nodes, round after round
        wait_until(lambda: all(a.renewals >= 10 for a in live.values()), 60,
                   message="the live nodes' leases renewed while another node's agent is frozen")
        # one renewal at a time waits on the frozen agent, not one more per round (the queue stays free)
        assert frozen.calls <= 2, f"renewals piled up on the frozen agent: {frozen.calls} calls"
    finally:
        thawed.set()
        w.stop()
