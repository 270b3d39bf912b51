"""Routing table and weighted round-robin (pure, no I/O)."""

from __future__ import annotations

from collections import Counter

from orchestrator.router.config import BackendConfig
from orchestrator.router.health import BackendHealth
from orchestrator.router.table import Balancer, Route, build_table

HEALTHY = BackendHealth("healthy", 2)


def _b(name: str, models: tuple[str, ...] = ("m",), weight: int = 1) -> BackendConfig:
    return BackendConfig(name=name, url=f"http://{name}:1", models=models, weight=weight)


def test_only_healthy_backends_are_routes_and_every_named_model_is_known():
    backends = (_b("a", ("m", "x")), _b("b", ("m",)), _b("c", ("y",)), _b("d", ()))
    health = {"a": HEALTHY, "b": BackendHealth("warming"), "c": BackendHealth("unhealthy"),
              "d": BackendHealth("healthy", 2, models=("listed",))}
    t = build_table(backends, health)
    assert t.models() == ["listed", "m", "x"]
    assert [r.name for r in t.candidates("m")] == ["a"]
    assert t.candidates("y") == ()
    assert t.known == {"m", "x", "y", "listed"}  # y is known (503 territory), not unknown (404)


def test_weighted_round_robin_is_exact_and_spread():
    routes = (Route("a", "http://a", 3), Route("b", "http://b", 1))
    bal = Balancer()
    picks = [bal.pick("m", routes).name for _ in range(8)]
    assert Counter(picks) == {"a": 6, "b": 2}
    assert picks[:4] in (["a", "a", "b", "a"], ["a", "b", "a", "a"])  # smooth: b is not starved to the end


def test_equal_weights_alternate_and_rotation_is_per_model():
    routes = (Route("a", "http://a", 1), Route("b", "http://b", 1))
    bal = Balancer()
    assert [bal.pick("m", routes).name for _ in range(4)] == ["a", "b", "a", "b"]
    assert bal.pick("other", routes).name == "a"


def test_exclusion_for_failover_and_empty():
    routes = (Route("a", "http://a", 1), Route("b", "http://b", 1))
    bal = Balancer()
    assert bal.pick("m", routes, frozenset({"a"})).name == "b"
    assert bal.pick("m", routes, frozenset({"a", "b"})) is None
    assert bal.pick("m", ()) is None


def test_a_backend_leaving_and_returning_does_not_break_the_rotation():
    a, b, c = Route("a", "http://a", 1), Route("b", "http://b", 1), Route("c", "http://c", 1)
    bal = Balancer()
    for _ in range(5):
        bal.pick("m", (a, b, c))
    assert Counter(bal.pick("m", (a, b)).name for _ in range(4)) == {"a": 2, "b": 2}
    assert Counter(bal.pick("m", (a, b, c)).name for _ in range(6)) == {"a": 2, "b": 2, "c": 2}
