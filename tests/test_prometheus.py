"""The one Prometheus text writer: families, labels escaped, parsed back by the charts' reader."""

from __future__ import annotations

from orchestrator.httpkit.prometheus import escape, exposition, family, one
from orchestrator.router.health import BackendHealth
from orchestrator.router.metrics import RouterMetrics


def test_a_family_is_help_type_and_its_samples():
    lines = family("x_total", "counter", "Things.", [({"a": "1", "b": 'q"\\\n'}, 3), (None, 4)])
    assert lines == ["# HELP x_total Things.", "# TYPE x_total counter",
                     'x_total{a="1",b="q\\"\\\\\\n"} 3', "x_total 4"]
    assert exposition(one("up", "gauge", "Up.", 1)) == "# HELP up Up.\n# TYPE up gauge\nup 1\n"
    assert escape('a"b') == 'a\\"b'


def test_the_router_writes_its_counters_through_it():
    m = RouterMetrics()
    m.count_request('we"ird', 200)
    m.count_failover()
    text = m.render({"b": BackendHealth()})
    assert 'pipeserve_router_requests_total{backend="we\\"ird",status="200"} 1\n' in text
    assert "pipeserve_router_failovers_total 1\n" in text
    assert text.count("# TYPE ") == 5 and text.endswith("\n")
