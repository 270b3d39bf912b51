"""The watcher is woken the moment a coordinator's state changes (control/watcher_wakeup.py), so a
killed stage is a fault at once, not at the watcher's next look."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from urllib.parse import parse_qs, urlparse

from orchestrator.control.watcher_wakeup import Wakeup
from orchestrator.proc import wait_until
from tests.control.conftest import MODEL_ID, Env
from tests.support.sessions import healthy, pids
from tests.support.stub_http import StubHandler, StubServer


class FakeCoordinator:
    """/health with the long poll of engine/coordinator/api.py: `?wait=S&unless=STATE` waits while STATE."""

    def __init__(self) -> None:
        self.state = "ready"
        self.changed = threading.Condition()
        self.asked = 0
        fake = self

        class Handler(StubHandler):
            def do_GET(self) -> None:
                q = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
                fake.asked += 1
                with fake.changed:
                    if q.get("unless"):
                        fake.changed.wait_for(lambda: fake.state != q["unless"], float(q.get("wait", 0)))
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
    woken: list[float] = []
    pulse = Wakeup(lambda: woken.append(time.monotonic()), long_poll_s=30.0, quiet_s=30.0)
    try:
        pulse.follow({"s1": coordinator.url})
        # Its first answer is followed by the long poll at once (a fault right after a recovery
        # is heard at once too), not after a pause.
        wait_until(lambda: coordinator.asked >= 2, 5, message="the long poll to follow the first answer")
        time.sleep(0.5)
        assert woken == [] and coordinator.asked == 2  # one answer, then one long poll that waits
        changed = time.monotonic()
        coordinator.set("unhealthy")
        wait_until(lambda: woken, 10, message="the pulse to wake the watcher")
        assert woken[0] - changed < 5.0  # at once (generous: loaded 2-core machine), not after its 30 s wait
        pulse.follow({})
        assert pulse.following() == set()
    finally:
        pulse.stop()
        coordinator.close()


def test_a_coordinator_that_stops_answering_wakes_the_watcher_once_not_in_a_loop():
    coordinator = FakeCoordinator()
    woken: list[float] = []
    pulse = Wakeup(lambda: woken.append(time.monotonic()), long_poll_s=30.0, quiet_s=0.2, retry_s=0.05)
    try:
        pulse.follow({"s1": coordinator.url})
        wait_until(lambda: coordinator.asked >= 2, 10, message="the long poll to be waiting")
        coordinator.close()  # its connections drop, as a killed coordinator's do
        wait_until(lambda: woken, 10, message="the pulse to wake the watcher")
        time.sleep(1.0)
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
    wait_until(lambda: s.id in orch.watcher.pulsed(), 30, message="the session to be long-polled")
    time.sleep(1.5)  # its first answer, then the long poll
    killed = time.monotonic()
    os.kill(pids(env, s.id)["stage-1"], signal.SIGKILL)
    orch.wait(lambda st: len(st.session(s.id).faults) >= 1, 30)
    seen = time.monotonic() - killed
    fault = orch.state.session(s.id).faults[-1]
    assert "stage-1" in fault.processes, fault
    assert seen < 10.0, seen  # generous (a loaded machine), and far below the 60 s interval
    print(f"kill -9 of stage-1 -> fault seen in {seen:.2f} s with a 60 s watch interval")
