"""Each effect type through the one effect runner, against fake caps.

The runner gets `Capabilities` (control/capabilities.py), never the Orchestrator, so each effect can be run
here with what it talks to replaced at the true external seams: the node agents' HTTP API
and the router's registrar are stand-ins that record what they were asked (and fail when
told to); the secret store is the real one, in a temporary directory. What is asserted is
what the worker reports back: the events it posts and the commands it submits.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator import logs
from orchestrator.agent.client import AgentError
from orchestrator.control.capabilities import Capabilities
from orchestrator.control.effects import EffectRunner
from orchestrator.control.launcher import Timeouts
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.commands import ResumeSession
from orchestrator.control.rules.decide import (
    CancelWork,
    MeasureAfterPreview,
    Readopt,
    RunPreparation,
    StartLaunch,
    StartRecovery,
    StartTeardown,
)
from orchestrator.control.rules.download_state import HubRef, ModelDownload
from orchestrator.control.rules.model_rules import CancelDownloadWork, DeleteModelFiles, RunDownload
from orchestrator.control.rules.state import Fault, State
from orchestrator.control.secrets import SecretStore
from orchestrator.proc import wait_until
from orchestrator.proc.clock import SYSTEM_CLOCK
from orchestrator.registrar import RegistrarError, RouteState
from tests.support.builders import session

SETTLE_S = 20.0  # a worker thread's time to report, on a loaded machine


class FakeAgent:
    """Stand-in for a node agent's HTTP API (the external seam): records calls, fails on request."""

    def __init__(self, fail: AgentError | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail = fail

    def start_process(self, request: dict[str, Any]) -> None:
        self.calls.append(("start", request["node_id"]))
        if self.fail:
            raise self.fail

    def stop_process(self, cluster_id: str, node_id: str, timeout_s: float) -> None:
        self.calls.append(("stop", node_id))

    def model(self, model_id: str) -> None:
        raise AgentError(404, f"no model {model_id}")


class FakeRegistrar:
    """Stand-in for the router's registrar (the external seam). With `router_url`, the router it
    stands for answers `states` to successive looks (the last one for ever after)."""

    def __init__(self, fail: bool = False, router_url: str | None = None,
                 states: tuple[RouteState, ...] = (RouteState(True, "healthy"),)) -> None:
        self.registered: list[str] = []
        self.deregistered: list[str] = []
        self.fail = fail
        self.router_url = router_url
        self.states = list(states)
        self.looks = 0

    def route_state(self, name: str, url: str, model: str) -> RouteState:
        assert name in self.registered, "asked the router before the entry was written"
        self.looks += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def register(self, name: str, url: str, models: list[str]) -> None:
        if self.fail:
            raise RegistrarError("the router is not there")
        self.registered.append(name)

    def deregister(self, name: str) -> None:
        self.deregistered.append(name)


class FakeModels:
    """Stand-in for the Models tab's worker: the runner only hands it its effects."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def run(self, dl: ModelDownload) -> None:
        self.calls.append(("run", dl.model_id))

    def cancel_work(self, model_id: str) -> None:
        self.calls.append(("cancel", model_id))

    def delete_files(self, model_id: str, node_id: str) -> None:
        self.calls.append(("delete", f"{model_id}@{node_id}"))


class World:
    """The fake caps and what the runner's workers did through them."""

    def __init__(self, tmp_path: Path, agent: FakeAgent | None = None, registrar: FakeRegistrar | None = None) -> None:
        self.agent = agent or FakeAgent()
        self.registrar = registrar or FakeRegistrar()
        self.events: list[ev.Event] = []
        self.submitted: list[Any] = []
        self.secrets = SecretStore(tmp_path)
        self.models = FakeModels()
        self.caps = Capabilities(state=lambda: State(), post=self.events.append, submit=self.submitted.append,
                                  command=self._no_command, agent=lambda node_id: self.agent, registrar=self.registrar,
                                  secrets=self.secrets,
                                  timeouts=Timeouts(listen=5, healthy=5, stop=1, lease=6, routable=1),
                                  clock=SYSTEM_CLOCK, log=logs.get("test-effects"))
        self.runner = EffectRunner(self.caps, self.models, lambda s: (None, None, ()))  # type: ignore[arg-type]

    @staticmethod
    def _no_command(command: Any) -> Any:
        raise AssertionError(f"a worker decided {command!r} synchronously")

    def posted(self, kind: type[ev.Event], **fields: Any) -> ev.Event:
        """The first posted event of this class with these fields, once a worker posted it."""
        def found() -> ev.Event | None:
            return next((e for e in list(self.events) if isinstance(e, kind)
                         and all(getattr(e, k) == v for k, v in fields.items())), None)
        return wait_until(found, SETTLE_S, 0.01, message=f"a {kind.__name__} {fields or ''}")


# a one-stage session on node n0, coordinator beside it
ONE_STAGE = session(phase="launching", name="tiny-s1", model="tiny", splits=((0, 3),), host="127.0.0.1")


def test_start_launch_reports_the_failed_step_and_the_end(tmp_path: Path) -> None:
    w = World(tmp_path, agent=FakeAgent(fail=AgentError(0, "agent unreachable")))
    w.runner.run((StartLaunch(ONE_STAGE, "tiny"),))
    w.posted(ev.LaunchStepped, key="stage-0.start", state="failed")
    assert w.posted(ev.LaunchEnded, session_id="s1").cancelled is False
    assert w.secrets.get("s1")  # kept for a replaced stage to rejoin with
    assert w.registrar.registered == []


def test_cancel_work_cancels_the_sessions_launch(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.runner.run((CancelWork("s1"), StartLaunch(ONE_STAGE, "tiny")))
    assert w.posted(ev.LaunchEnded, session_id="s1").cancelled is True
    assert ("start", "stage-0") not in w.agent.calls


def test_start_teardown_deregisters_first_then_stops_every_process(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.secrets.put("s1", "x" * 32)
    w.runner.run((StartTeardown(ONE_STAGE, "Stopped", "stopped"),))
    w.posted(ev.SessionRemoved, session_id="s1")
    assert w.registrar.deregistered == ["tiny-s1"]
    assert w.agent.calls == [("stop", "coordinator"), ("stop", "stage-0")]  # newest first
    assert w.posted(ev.HealthChanged, session_id="s1").phase == "stopped"
    wait_until(lambda: w.secrets.get("s1") is None, SETTLE_S, message="the secret forgotten")


def test_start_recovery_without_the_secret_fails_for_good(tmp_path: Path) -> None:
    w = World(tmp_path)
    broken = ONE_STAGE.model_copy(update={"recovery_attempt": 1, "phase": "recovering",
                                          "faults": (Fault(at=1.0, processes=("stage-0",), reason="exited"),)})
    w.runner.run((StartRecovery(broken),))
    failed = w.posted(ev.RecoveryFailed, session_id="s1")
    assert failed.final and "secret" in failed.reason


def test_run_preparation_reports_why_it_cannot_start(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.runner.run((RunPreparation("tiny", ("n0",)),))
    finished = w.posted(ev.PreparationFinished, model_id="tiny")
    assert "no registered node has model 'tiny'" in finished.error


def test_measure_after_preview_of_unknown_nodes_measures_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.runner.run((MeasureAfterPreview("tiny", ("n0", "n1"), 2048, 4, None, links=True, timing=True),))
    # the worker returns at once for nodes without a report: nothing posted, no second preview
    wait_until(lambda: not any(t.name == "refresh_after_preview" for t in threading.enumerate()), SETTLE_S,
               message="the measuring worker to end")
    assert w.events == [] and w.submitted == []


@pytest.mark.parametrize("fail", [False, True])
def test_readopt_registers_by_name_or_hands_the_failure_to_decide(tmp_path: Path, fail: bool) -> None:
    w = World(tmp_path, registrar=FakeRegistrar(fail=fail))
    w.runner.run((Readopt(ONE_STAGE),))
    if fail:
        wait_until(lambda: w.submitted, SETTLE_S, message="a ResumeSession")
        [resume] = w.submitted
        assert isinstance(resume, ResumeSession) and "router registration failed" in resume.problem
    else:
        assert w.posted(ev.HealthChanged, session_id="s1").health == "Healthy"
        assert w.registrar.registered == ["tiny-s1"] and w.posted(ev.SessionRegistered, registered=True)


def test_readopt_is_healthy_only_once_the_router_routes_to_it(tmp_path: Path) -> None:
    starting = RouteState(False, "starting")
    w = World(tmp_path, registrar=FakeRegistrar(router_url="http://router", states=(starting, starting,
                                                                                    RouteState(True, "healthy"))))
    w.runner.run((Readopt(ONE_STAGE),))
    assert w.posted(ev.HealthChanged, session_id="s1").health == "Healthy"
    assert w.registrar.looks == 3  # not Healthy while the router still said "starting"


def test_readopt_hands_a_router_that_never_routes_to_decide_with_what_it_said(tmp_path: Path) -> None:
    w = World(tmp_path, registrar=FakeRegistrar(router_url="http://router:8000",
                                                states=(RouteState(False, "unhealthy", "HTTP 404: nope"),)))
    w.runner.run((Readopt(ONE_STAGE),))
    wait_until(lambda: w.submitted, SETTLE_S, message="a ResumeSession")
    [resume] = w.submitted
    assert isinstance(resume, ResumeSession)
    assert "http://router:8000" in resume.problem and "'tiny-s1'" in resume.problem
    assert "unhealthy (HTTP 404: nope)" in resume.problem
    assert not any(isinstance(e, ev.HealthChanged) for e in w.events)


def test_the_model_effects_go_to_the_models_worker(tmp_path: Path) -> None:
    w = World(tmp_path)
    dl = ModelDownload(model_id="m", hub=HubRef(repo_id="org/m"))
    w.runner.run((RunDownload(dl), CancelDownloadWork("m"), DeleteModelFiles("m", "n0")))
    wait_until(lambda: len(w.models.calls) == 3, SETTLE_S, message="the three calls")
    assert sorted(w.models.calls) == [("cancel", "m"), ("delete", "m@n0"), ("run", "m")]


def test_anything_else_is_not_an_effect(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="not an effect"):
        World(tmp_path).runner.run(("launch everything",))  # type: ignore[arg-type]
