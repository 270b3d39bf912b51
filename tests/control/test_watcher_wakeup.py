"""The watcher is woken the moment a coordinator's state changes (control/watcher_wakeup.py), so a
killed stage is a fault at once, not at the watcher's next look."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
from urllib.parse import parse_qs, urlparse

from orchestrator.control.watcher_wakeup import Wakeup
from orchestrator.proc import wait_until
from orchestrator.proc.clock import FakeClock
from tests.control.conftest import MODEL_ID, Env
from tests.support.sessions import healthy, pids
from tests.support.stub_http import StubHandler, StubServer


class FakeCoordinator:
    """/health with the long poll of engine/coordinator/api.py: `?wait=S&unless=STATE` waits while STATE."""

    def __init__(self) -> None:
        self.state = "ready"
        self.changed = threading.Condition()
        self.asked = 0
        self.waiting = 0  # long polls waiting now
        self.released = 0  # long polls answered because the state changed (not at the end of their wait)
        fake = self

        class Handler(StubHandler):
            def do_GET(self) -> None:
                q = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
                fake.asked += 1
                with fake.changed:
                    if q.get("unless"):
                        fake.waiting += 1
                        fake.released += fake.changed.wait_for(lambda: fake.state != q["unless"],
                                                                float(q.get("wait", 0)))
                        fake.waiting -= 1
                    ready = fake.state == "ready"
                    body = json.dumps({"status": fake.state, "ready": ready}).encode()
                self.reply(200 if ready else 503, body)

        self.server = StubServer(Handler).start()
        self.url = self.server.url

    def set(self, state: str) -> None:
        with self.changed:
            self.state = state
            self.changed.notify_all()

    def close(self) -> None:
        self.server.close()
        self.set("gone")  # releases the waiting handlers


def test_a_state_change_wakes_the_watcher_and_a_steady_state_does_not():
    coordinator = FakeCoordinator()
    woken: list[str] = []
    pulse = Wakeup(lambda: woken.append(coordinator.state), long_poll_s=30.0, quiet_s=30.0)
    try:
        pulse.follow({"s1": coordinator.url})
        # Its first answer is followed by the long poll at once (a fault right after a recovery
        # is heard at once too), not after a pause; while it waits nothing else is asked.
        wait_until(lambda: coordinator.waiting == 1, 5, message="the long poll to follow the first answer")
        assert pulse.following() == {"s1"}
        assert woken == [] and coordinator.asked == 2  # one answer, then one long poll that waits
        coordinator.set("unhealthy")
        wait_until(lambda: woken, 10, message="the pulse to wake the watcher")
        # woken by the long poll the change answered, not at the end of its 30 s wait
        assert woken[0] == "unhealthy" and coordinator.released == 1
        pulse.follow({})
        assert pulse.following() == set()
    finally:
        pulse.stop()
        coordinator.close()


def test_a_coordinator_that_stops_answering_wakes_the_watcher_once_not_in_a_loop():
    coordinator = FakeCoordinator()
    clock = FakeClock()
    woken: list[float] = []
    pulse = Wakeup(lambda: woken.append(clock.monotonic()), long_poll_s=30.0, quiet_s=0.2, retry_s=0.05, clock=clock)
    try:
        pulse.follow({"s1": coordinator.url})
        wait_until(lambda: coordinator.waiting == 1, 10, message="the long poll to be waiting")
        coordinator.close()  # its connections drop, as a killed coordinator's do
        wait_until(lambda: woken, 10, message="the pulse to wake the watcher")
        assert pulse.following() == set()  # a coordinator that does not answer is not long-polled
        # two seconds of retries on the pulse's clock: forty refused connections, every 0.05 s
        since = clock.monotonic()
        wait_until(lambda: clock.monotonic() - since >= 2.0, 30, 0.01, message="forty retries")
        assert len(woken) <= 2, woken  # the drop (and perhaps the waiting reply it cut); then quiet
    finally:
        pulse.stop()


def test_a_killed_stage_is_a_fault_at_once_however_long_the_watch_interval(env: Env):
    # A 60 s interval and a lease that outlasts it: without the pulse the fault waits for the next look.
    env.orch.stop()  # one control plane on these agents; the next reads its nodes and settings
    orch = env.make_orchestrator(watch_interval=60.0, lease_s=600.0)
    if len(orch.state.nodes) < len(env.agents):
        for a in env.agents:
            orch.register_node(a.url, a.token)
    env = dataclasses.replace(env, orch=orch)
    s = healthy(env, orch.launch(env.session(), MODEL_ID).id)
    orch.watcher.wake()  # the cycle that starts following the new session (the next one is 60 s away)
    # its first answer, then the long poll that answers when the coordinator's state changes
    wait_until(lambda: s.id in orch.watcher.pulsed(), 30, message="the session to be long-polled")
    os.kill(pids(env, s.id)["stage-1"], signal.SIGKILL)
    # Seen within 30 s, half the 60 s interval: only the pulse can have woken the watcher for it.
    orch.wait(lambda st: len(st.session(s.id).faults) >= 1, 30)
    fault = orch.state.session(s.id).faults[-1]
    assert "stage-1" in fault.processes, fault
