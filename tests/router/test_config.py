"""The router YAML: continuum-router's shape, durations, unknown keys kept, clear errors."""

from __future__ import annotations

import pytest

from orchestrator.router.config import ConfigError, load_config, parse_config, parse_duration


def test_full_file_parses_and_keeps_unknown_keys():
    cfg = parse_config("""
server: {bind_address: "0.0.0.0:8080"}
backends:
  - name: cluster-a
    url: http://10.0.0.5:39600/v1/
    weight: 3
    models: [smollm2, other]
    api_key: kept
  - name: cluster-b
    url: https://b.lan:8443
    models: single
health_checks:
  enabled: true
  interval: 500ms
  timeout: 2s
  unhealthy_threshold: 4
  healthy_threshold: 1
  endpoint: /health
""")
    a, b = cfg.backends
    assert (a.name, a.url, a.weight, a.models) == ("cluster-a", "http://10.0.0.5:39600", 3, ("smollm2", "other"))
    assert a.model_extra == {"api_key": "kept"}
    assert (b.url, b.weight, b.models) == ("https://b.lan:8443", 1, ("single",))
    h = cfg.health_checks
    assert (h.interval, h.timeout, h.unhealthy_threshold, h.healthy_threshold) == (0.5, 2.0, 4, 1)
    assert h.endpoint == "/health"
    assert cfg.model_extra == {"server": {"bind_address": "0.0.0.0:8080"}}


def test_defaults_and_empty_documents():
    for text in ("", "backends:\n", "backends: []\nhealth_checks:\n"):
        cfg = parse_config(text)
        assert cfg.backends == ()
        h = cfg.health_checks
        assert (h.enabled, h.unhealthy_threshold, h.healthy_threshold, h.endpoint) == (True, 3, 2, "/v1/models")


@pytest.mark.parametrize("text, needle", [
    ("backends: [ {name: a", "not valid YAML"),
    ("- just a list", "top level must be a mapping"),
    ("backends: [{name: a}]", "backends.0.url"),
    ("backends: [{name: a, url: 'ftp://x'}]", "not an http(s) URL"),
    ("backends: [{name: a, url: 'http://x:99999'}]", "http://x:99999"),
    ("backends: [{name: a, url: 'http://x', weight: 0}]", "backends.0.weight"),
    ("backends: [{name: a, url: 'http://x'}, {name: a, url: 'http://y'}]", "'a' appears twice"),
    ("health_checks: {interval: soon}", "health_checks.interval"),
    ("health_checks: {timeout: -1}", "positive"),
    ("health_checks: {endpoint: v1/models}", "health_checks.endpoint"),
    ("health_checks: {unhealthy_threshold: 0}", "health_checks.unhealthy_threshold"),
])
def test_invalid_files_name_the_problem(text, needle):
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "router.yaml")
    assert needle in str(exc.value)
    assert str(exc.value).startswith("router.yaml: ")


def test_durations():
    assert parse_duration(2) == 2.0
    assert parse_duration("250ms") == 0.25
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("2m") == 120.0
    for bad in ("", "fast", True, 0, "-1s"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
