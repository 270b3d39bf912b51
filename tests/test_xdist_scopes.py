"""make test's worker split: the dashboard walk's files are one scope, every other module its own."""

from __future__ import annotations

from tests.support.xdist_scopes import PackageScopes


def test_the_dashboard_walk_goes_whole_to_one_worker():
    scopes = PackageScopes.__new__(PackageScopes)  # _split_scope reads no scheduler state
    walk = {scopes._split_scope(n) for n in ("e2e/dashboard/test_1_set_up.py::test_1_log_in",
                                             "e2e/dashboard/test_2_serve.py::test_4_launch",
                                             "e2e/dashboard/test_3_guard_rails.py::test_1")}
    assert walk == {"e2e/dashboard/"}
    assert scopes._split_scope("tests/webapp/test_live.py::test_a") == "tests/webapp/test_live.py"
    assert scopes._split_scope("e2e/test_recovery.py::test_b[x]") == "e2e/test_recovery.py"


def test_the_scheduler_plugin_is_loaded_by_every_run(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("tests.support.xdist_scopes")
