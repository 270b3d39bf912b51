"""The watcher posts a look only when something changed (no identical renders pushed), with
tokens/s from the coordinator's /metrics; fakes stand in for the agent and the coordinator."""

from __future__ import annotations

import json

import pytest

from orchestrator.agent.schemas import ProcessInfo
from orchestrator.control import coordinator_client as client_module
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.state import Node, State
from orchestrator.control.rules.transitions import apply
from orchestrator.control.watcher import BUSY_LIMIT_S, Watcher
from orchestrator.proc import FakeClock
from tests.support.sessions import running_session as session


class FakeResponse:
    def __init__(self, status: int, body: object) -> None:
        self.status_code, self._body = status, body

    def json(self) -> object:
        return self._body

    @property
    def content(self) -> bytes:
        return json.dumps(self._body).encode()

    @property
    def text(self) -> str:
        return str(self._body)


@pytest.fixture
def coordinator(monkeypatch):
    """What the fake coordinator answers: its token counter and per-stage step_ms."""
    world = {"tokens": 0, "step_ms": [10.0, 20.0], "metrics": True}

    def get(url: str, timeout: float = 0, **_: object) -> FakeResponse:
        if url.endswith("/health") and world.get("silent"):
            raise client_module.requests.Timeout("read timed out")
        if url.endswith("/health"):
            return FakeResponse(200, {"status": "ready", "ready": True, "stages": [
                {"id": f"stage-{i}", "address": f"127.0.0.1:{40000 + i}", "state": "up", "step_ms": ms}
                for i, ms in enumerate(world["step_ms"])]})
        if not world["metrics"]:
            raise client_module.requests.ConnectionError("refused")
        return FakeResponse(200, f"# TYPE pipeserve_generated_tokens_total counter\n"
                                 f"pipeserve_generated_tokens_total {world['tokens']}\n")

    monkeypatch.setattr(client_module.requests, "get", get)
    world["clock"] = FakeClock(start=1000.0)  # this watcher's time only (Watcher(clock=...)), not every thread's
    return world


def processes(s) -> dict:
    def info(node_id: str, port: int) -> ProcessInfo:
        return ProcessInfo(cluster_id=s.id, node_id=node_id, kind="stage", model_id="m", pid=1, alive=True, port=port,
                           port_listening=True, started_at=0, uptime_s=1, lease_remaining_s=10)
    return {"n0": [info("stage-0", 40000), info("coordinator", 40010)], "n1": [info("stage-1", 40001)]}


def test_only_changes_are_posted_and_tokens_per_second_comes_from_the_counter(coordinator):
    posted: list[ev.Event] = []
    state = {"st": State(sessions=(session(),))}
    w = Watcher(lambda: state["st"], lambda n: None, posted.append, clock=coordinator["clock"])

    def look(advance: float = 0.5, tokens: int = 0) -> list[ev.Event]:
        coordinator["clock"].advance(advance)
        coordinator["tokens"] += tokens
        posted.clear()
        w._observe(state["st"].session("s1"), processes(state["st"].session("s1")))
        for e in posted:
            state["st"] = apply(state["st"], e)
        return [e for e in posted if isinstance(e, ev.SessionObserved)]

    first = look()
    assert len(first) == 1 and first[0].sample.tokens_per_s is None and first[0].sample.step_ms == (10.0, 20.0)
    second = look()
    assert second[0].sample.tokens_per_s == 0.0  # idle, now known
    assert look() == [] and look() == []  # nothing changed: nothing pushed
    busy = look(tokens=10)
    assert busy[0].sample.tokens_per_s > 0
    coordinator["step_ms"] = [11.0, 20.0]
    changed = look(tokens=10)
    assert changed[0].sample.step_ms == (11.0, 20.0)
    samples = state["st"].session("s1").samples
    assert [x.tokens_per_s for x in samples][:2] == [None, 0.0] and len(samples) == 4
    coordinator["metrics"] = False  # /metrics unreadable: the rate is unknown again, not a stale number
    assert look()[0].sample.tokens_per_s is None


def test_silence_is_a_fault_only_once_it_lasts_but_a_dead_process_is_one_at_once(coordinator):
    """One slow /health on a loaded machine must not replace a healthy coordinator."""
    posted: list[ev.Event] = []
    s = session()
    w = Watcher(lambda: State(sessions=(s,)), lambda n: None, posted.append, clock=coordinator["clock"], confirm_s=1.5)

    def faults(advance: float, listed: dict | None = None) -> list[ev.SessionFaulted]:
        coordinator["clock"].advance(advance)
        posted.clear()
        w._observe(s, listed or processes(s))
        return [e for e in posted if isinstance(e, ev.SessionFaulted)]

    coordinator["silent"] = True
    assert faults(0.5) == [] and faults(0.5) == []  # silent for 0.5 s, then 1.0 s: not yet
    coordinator["silent"] = False
    assert faults(0.5) == []  # it answered: the suspicion ends
    coordinator["silent"] = True
    assert faults(0.5) == [] and faults(1.0) == []  # a new silence counts from its own start
    (fault,) = faults(0.5)  # 1.5 s of silence
    assert "coordinator unreachable" in fault.reason and fault.processes == ("coordinator",)
    dead = processes(s)
    dead["n1"] = [p.model_copy(update={"alive": False, "exit_code": -9}) for p in dead["n1"]]
    coordinator["silent"] = False
    (fault,) = faults(0.0, dead)  # known dead: no waiting
    assert "stage-1" in fault.processes


def test_a_silent_coordinator_that_burns_cpu_is_busy_one_that_does_not_is_stuck(coordinator):
    """A coordinator holding Python's lock for seconds (llguidance's tokenizer on a loaded machine) is
    silent but computes: it is judged the way a stage is, by its progress (here CPU seconds, from its
    agent), not by the answer time of one /health. Frozen or deadlocked, it burns none: replaced."""
    posted: list[ev.Event] = []
    s = session()
    w = Watcher(lambda: State(sessions=(s,)), lambda n: None, posted.append, clock=coordinator["clock"], confirm_s=1.5)

    def faults(advance: float, cpu: float) -> list[ev.SessionFaulted]:
        coordinator["clock"].advance(advance)
        posted.clear()
        listed = processes(s)
        listed["n0"] = [p.model_copy(update={"cpu_s": cpu}) if p.node_id == "coordinator" else p
                        for p in listed["n0"]]
        w._observe(s, listed)
        return [e for e in posted if isinstance(e, ev.SessionFaulted)]

    coordinator["silent"] = True
    cpu = 10.0
    looks = 0
    while looks * 0.5 < BUSY_LIMIT_S - 1:  # busy: every look finds it used CPU since the last
        cpu += 0.1
        assert faults(0.5, cpu) == [], f"replaced after {looks * 0.5} s of busy silence"
        looks += 1
    (fault,) = faults(1.5, cpu + 0.1)  # silent past the limit all the same: replaced
    assert fault.processes == ("coordinator",)
    coordinator["silent"] = False
    faults(0.5, cpu)
    coordinator["silent"] = True  # now frozen: no CPU between looks
    assert faults(0.5, cpu) == [] and faults(0.5, cpu) == []
    (fault,) = faults(1.0, cpu)  # 1.5 s without progress
    assert "coordinator unreachable" in fault.reason and fault.processes == ("coordinator",)


def test_nodes_of_a_session_that_ended_report_at_once_not_at_the_next_round():
    """After Stop, the nodes' free memory must not show the serving value for report_every s."""
    reported: list[str] = []
    s = session()
    state = {"st": State(nodes=tuple(Node(id=n, name=n, url="http://127.0.0.1:9", credential="c")
                                     for n in s.node_ids), sessions=(s,))}
    clock = FakeClock()
    w = Watcher(lambda: state["st"], lambda n: None, lambda e: None, report_every=3600.0, clock=clock)
    w._pool = _Inline()  # run the submitted work now, on this thread
    w._report = reported.append  # type: ignore[method-assign]
    w._observe = lambda *a: None  # type: ignore[method-assign]
    w.cycle()
    clock.advance(1.0)
    w.cycle()
    assert reported == []  # serving, and no round of reports is due
    state["st"] = state["st"].model_copy(update={"sessions": ()})  # stopped
    w.cycle()
    assert sorted(reported) == sorted(s.node_ids)


class _Inline:
    """A pool that runs work on the calling thread."""

    def submit(self, fn, *args):
        fn(*args)

    def map(self, fn, items):
        return [fn(i) for i in items]
