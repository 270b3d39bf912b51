"""The agent's process records in-process, on a fake clock: leases lapse, restarts re-adopt,
stops escalate — no agent process, and no waiting for a lease in real time."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from orchestrator import logs
from orchestrator.agent.inventory import Inventory
from orchestrator.agent.probes import process_identity
from orchestrator.agent.processes import Managed, ProcessManager
from orchestrator.proc import ChildProcess, FakeClock, wait_until

SLEEPER = "import signal, time\n{ignore}print('ready', flush=True)\ntime.sleep(60)"


def manager(root: Path, clock: FakeClock) -> ProcessManager:
    log = logs.get("test-agent")
    return ProcessManager(root / "processes", Inventory(root / "models", root / "cache.json", log), (40000, 40009),
                          "127.0.0.1", log, clock=clock)


def add(m: ProcessManager, cluster: str, node: str, lease_s: float, ignore_term: bool = False) -> Managed:
    """Start a stand-in engine process and record it as `start()` would (no model, no port)."""
    script = SLEEPER.format(ignore="signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
    child = ChildProcess.spawn(node, [sys.executable, "-c", script], m.root / cluster / node / "output.log",
                               clock=m.clock)
    wait_until(lambda: child.printed(r"(ready)"), 30, message=f"{node} to start")  # real time: a real process
    child.identity = process_identity(child.pid)
    now = m.clock.time()
    record = Managed(cluster, node, "stage", "tm", 40000, "127.0.0.1", "spec", now, now + lease_s, child)
    m._procs[(cluster, node)] = record
    m._persist(record)
    return record


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # already gone
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def run_enforce(m: ProcessManager) -> list[str]:
    """One reaper pass; waits for the stops it started and returns the node ids it stopped."""
    threads = m.enforce(timeout_s=5)
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a lease stop hung"
    return sorted(t.name.removeprefix("stop-") for t in threads)


def test_a_lease_lapses_on_the_agents_clock_and_a_renewal_keeps_the_process(tmp_path):
    clock = FakeClock()
    m = manager(tmp_path, clock)
    held, lapsing = add(m, "held", "stage-0", lease_s=4), add(m, "lapsing", "stage-1", lease_s=1.5)
    assert run_enforce(m) == []
    clock.advance(1.0)
    assert m.renew("held", 4) == ["stage-0"]
    clock.advance(1.0)  # 2 s: "lapsing" is past its 1.5 s lease; "held" was renewed to 5 s
    assert run_enforce(m) == ["stage-1"]
    gone = m.get("lapsing", "stage-1")
    assert not gone.alive and gone.stop_reason == "lease expired" and gone.signal == "SIGTERM", gone
    kept = m.get("held", "stage-0")
    # renewed at 1 s for 4 s: it ends at 5 s (the stop of the other advanced the fake clock a little)
    assert kept.alive and abs(kept.uptime_s + kept.lease_remaining_s - 5.0) < 0.01, kept
    try:
        m.renew("lapsing", 4)
        raise AssertionError("a lapsed cluster was renewed")
    except LookupError:
        pass
    clock.advance(3.0)
    assert run_enforce(m) == ["stage-0"]
    assert not held.alive() and not lapsing.alive()


def test_a_restarted_agent_adopts_what_runs_and_reports_what_ended_meanwhile(tmp_path):
    clock = FakeClock()
    first = manager(tmp_path, clock)
    running = add(first, "c", "stage-0", lease_s=60)
    crashed = add(first, "c", "stage-1", lease_s=60)
    stopped = add(first, "d", "stage-0", lease_s=60)
    first.stop("d", "stage-0")  # ended under the first agent: its exit is known and persisted
    crashed.child.send(signal.SIGKILL)  # ends while "the agent is down" (nobody reaps it: a zombie)
    # SIGKILL is delivered asynchronously: the new agent must find it already ended
    wait_until(lambda: _zombie(crashed.child.pid), 10, message="the killed child to become a zombie")

    second = manager(tmp_path, clock)
    second.adopt()
    adopted = second.get("c", "stage-0")
    assert adopted.alive and adopted.adopted and adopted.pid == running.child.pid, adopted
    lost = second.get("c", "stage-1")
    assert not lost.alive and lost.adopted and lost.stop_reason == "exited while the agent was down", lost
    assert lost.exit_code is None and lost.signal is None  # not its child: how it ended is unknown
    before = second.get("d", "stage-0")
    assert before.pid == stopped.child.pid and not before.alive and not before.adopted, before
    assert before.signal == "SIGTERM" and before.stop_reason == "requested", before

    clock.advance(61)  # the persisted lease is enforced by the new agent too
    assert run_enforce(second) == ["stage-0"]
    ended = second.get("c", "stage-0")
    assert not ended.alive and ended.adopted and ended.stop_reason == "lease expired", ended
    for c in (running.child, crashed.child):
        assert c.wait_exit(10)  # reap (they are this test's children)


def test_stop_escalates_to_sigkill_after_the_grace_period(tmp_path):
    clock = FakeClock()
    m = manager(tmp_path, clock)
    add(m, "c", "n", lease_s=60, ignore_term=True)
    t0 = clock.monotonic()
    info = m.stop("c", "n", timeout_s=5)
    assert not info.alive and info.signal == "SIGKILL", info
    assert clock.monotonic() - t0 >= 5  # the whole grace period passed, on the agent's clock
