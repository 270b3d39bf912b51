"""orchestrator.proc: wait_until, the fake clock, and child processes (spawn, ready, stop)."""

from __future__ import annotations

import signal
import socket
import sys
import time

import pytest

from orchestrator.proc import ChildError, ChildProcess, FakeClock, ProcState, WaitTimeout, stop_all, wait_until

PY = sys.executable


def test_wait_until_returns_the_value_and_names_what_it_waited_for():
    calls = iter([0, None, "", 7])
    assert wait_until(lambda: next(calls), 5, 0.001) == 7
    clock = FakeClock()
    with pytest.raises(WaitTimeout, match="waiting for the moon"):
        wait_until(lambda: False, 30, 1, message="the moon", clock=clock)
    assert 30 <= clock.monotonic() <= 31  # on the fake clock: no real 30 s


def test_wait_until_ignores_only_the_named_errors():
    attempts = []

    def flaky() -> bool:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("not up yet")
        return True

    assert wait_until(flaky, 5, 0.001, ignore=(ConnectionError,))
    with pytest.raises(WaitTimeout, match="last error: ConnectionError"):
        wait_until(lambda: (_ for _ in ()).throw(ConnectionError("down")), 1, 0.5, ignore=(ConnectionError,),
                   clock=FakeClock())
    with pytest.raises(KeyError):  # anything else ends the wait at once
        wait_until(lambda: {}["x"], 5, 0.001, ignore=(ConnectionError,))


def test_fake_clock_moves_only_when_told(monkeypatch: pytest.MonkeyPatch):
    clock = FakeClock(start=100.0)
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)  # what the fake clock asks of the real one
    clock.sleep(3600)
    clock.advance(1)
    assert clock.time() == 3701.0 + 0 and clock.monotonic() == 3601.0
    assert sum(slept) < 3600  # an hour on the fake clock is not an hour of real sleep (a yield at most)
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_a_child_that_exits_before_ready_fails_with_its_output(tmp_path):
    child = ChildProcess.spawn("broken", [PY, "-c", "print('no config file'); raise SystemExit(3)"],
                               tmp_path / "broken.log")
    with pytest.raises(ChildError) as err:
        child.wait_ready(lambda: False, "a listener", 20)
    assert "broken exited with status 3 before a listener" in str(err.value) and "no config file" in str(err.value)
    assert child.state is ProcState.EXITED and child.exit_code == 3


def test_a_child_that_never_gets_ready_fails_with_its_output_and_stops(tmp_path):
    child = ChildProcess.spawn("slow", [PY, "-c", "print('loading', flush=True); import time; time.sleep(60)"],
                               tmp_path / "slow.log")
    wait_until(lambda: child.printed(r"(loading)"), 20, message="the child's first line")
    with pytest.raises(ChildError, match="slow: timed out after 0.2 s waiting for an answer:\nloading"):
        child.wait_ready(lambda: None, "an answer", 0.2)
    child.stop(5)
    assert child.state is ProcState.EXITED and child.signal == "SIGTERM" and not child.alive()


def test_stop_kills_the_whole_group_and_escalates_to_sigkill(tmp_path):
    script = ("import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "print(p.pid, flush=True)\ntime.sleep(60)")
    child = ChildProcess.spawn("stubborn", [PY, "-c", script], tmp_path / "stubborn.log", clock=FakeClock())
    grandchild = int(wait_until(lambda: child.printed(r"(\d+)"), 20,
                                message="the grandchild's pid"))
    killing = []
    child.stop(2, on_kill=lambda: killing.append(True))
    assert killing and child.signal == "SIGKILL" and child.state is ProcState.EXITED
    wait_until(lambda: not _running(grandchild), 10, message="the grandchild to go with its group")


def test_stop_all_sends_sigterm_to_every_child_first(tmp_path):
    children = [ChildProcess.spawn(f"c{i}", [PY, "-c", "import time; time.sleep(60)"], tmp_path / f"c{i}.log")
                for i in range(3)]
    stop_all(children, timeout=10)
    assert all(c.state is ProcState.EXITED and c.signal == "SIGTERM" for c in children)
    children[0].stop()  # stopping a stopped child does nothing
    assert children[0].signal == "SIGTERM"


def test_an_attached_child_is_judged_by_its_identity(tmp_path):
    real = ChildProcess.spawn("real", [PY, "-c", "import time; time.sleep(60)"], tmp_path / "real.log")
    same = ChildProcess.attach("same", real.pid, "start-1", lambda pid: "start-1")
    other = ChildProcess.attach("recycled", real.pid, "start-1", lambda pid: "start-2")
    assert same.alive() and same.attached
    assert not other.alive() and other.state is ProcState.VANISHED  # a recycled pid is not ours
    real.send(signal.SIGKILL)
    assert real.wait_exit(10) and real.signal == "SIGKILL"
    assert not same.alive() and same.state is ProcState.VANISHED and same.exit_code is None


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_free_ports_lie_below_the_ephemeral_range_where_no_outgoing_connection_takes_them():
    from orchestrator.proc import ports

    top = ports._ephemeral_start()
    port = ports.free_port()
    assert ports.LOWEST <= port < top and ports.port_free(port)
    first, last = ports.free_port_block(5)
    assert last == first + 4 and last < top and all(ports.port_free(p) for p in range(first, last + 1))
    with socket.socket() as held:  # a port taken is never offered
        held.bind(("127.0.0.1", first))
        held.listen()
        assert ports.free_port_block(5, prefer=first)[0] != first
