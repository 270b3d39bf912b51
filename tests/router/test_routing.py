"""Asking a router whether it routes to a backend yet (orchestrator/registrar/routing.py).

The pure reading of a router's answers, and `ask_router` against a real `pipeserve router`
process: a backend it has not probed into rotation is not routable, whatever the YAML says.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path

from orchestrator.proc import free_port, wait_until
from orchestrator.registrar import ConfigFileRegistrar, RouteState
from orchestrator.registrar.routing import ask_router, model_listed, route_state
from tests.support.router import write_yaml
from tests.support.stub_http import StubServer


def health(*backends: dict) -> dict:
    return {"status": "ok", "backends": list(backends)}


def entry(state: str, url: str = "http://10.0.0.5:39600", **extra: object) -> dict:
    return {"name": "c", "url": url, "state": state, "routable": state == "healthy", **extra}


def test_a_backend_is_routable_only_when_the_router_says_so():
    assert route_state(health(entry("healthy")), "c", "http://10.0.0.5:39600/v1") == RouteState(True, "healthy")
    starting = route_state(health(entry("starting")), "c", "http://10.0.0.5:39600/v1")
    assert starting == RouteState(False, "starting")
    warming = route_state(health(entry("warming", last_error="HTTP 503: not ready")), "c", "http://10.0.0.5:39600")
    assert not warming.routable and warming.describe() == "warming (HTTP 503: not ready)"


def test_an_entry_the_router_has_not_reloaded_yet_is_not_routable():
    absent = route_state(health(), "c", "http://10.0.0.5:39600/v1")
    assert not absent.routable and absent.state == "absent"
    # the same name at its old address, still healthy there: not this backend
    moved = route_state(health(entry("healthy", url="http://10.0.0.5:40000")), "c", "http://10.0.0.5:39600/v1")
    assert not moved.routable and "http://10.0.0.5:40000" in moved.detail


def test_a_health_answer_without_backends_leaves_the_question_to_the_model_list():
    assert route_state({"status": "ok"}, "c", "http://10.0.0.5:39600") is None
    assert route_state("not json", "c", "http://10.0.0.5:39600") is None
    assert model_listed({"data": [{"id": "m"}]}, "m").routable
    assert not model_listed({"data": []}, "m").routable
    assert not model_listed(None, "m").routable


def test_no_router_answering_is_a_state_with_its_reason():
    look = ask_router(f"http://127.0.0.1:{free_port()}", "c", "http://10.0.0.5:39600", "m", timeout=2)
    assert not look.routable and look.state == "no answer" and "Connection" in look.detail


class _Backend(BaseHTTPRequestHandler):
    """A backend whose /v1/models answers as `self.server.status` says."""

    def do_GET(self) -> None:
        body = b'{"object": "list", "data": [{"id": "m"}]}'
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_real_router_routes_to_a_written_entry_only_after_its_probes(tmp_path: Path, start_router):
    cfg = write_yaml(tmp_path / "router.yaml", {"backends": [], "health_checks": {
        "enabled": True, "interval": "0.5s", "timeout": "1s", "healthy_threshold": 2}})
    router = start_router(cfg)
    reg = ConfigFileRegistrar(cfg, router.url)
    with StubServer(_Backend) as backend:
        backend.status = 503  # up, not ready: the router keeps it out of rotation
        reg.register("c", backend.url + "/v1", ["m"])
        warming = wait_until(lambda: (s := reg.route_state("c", backend.url + "/v1", "m")).state == "warming" and s,
                             30, 0.1, message="the router to see the backend warming")
        assert not warming.routable and "503" in warming.detail
        backend.status = 200
        wait_until(lambda: reg.route_state("c", backend.url + "/v1", "m").routable, 30, 0.1,
                   message="the router to route to the backend")
