"""How `make test` shares the tests between its worker processes (pytest-xdist, `-n 2`).

Whole modules go to one worker (`--dist loadscope`: a module's fixtures are built once), and a
package of ordered steps over one shared stack goes whole to one worker, in its files' order:
`e2e/dashboard/` is one walk through the `make demo` flow split over three files.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

ONE_SCOPE = ("e2e/dashboard/",)  # packages whose files are steps of one walk (their conftest says so)


class PackageScopes(LoadScopeScheduling):
    """loadscope, except that each package of ONE_SCOPE is one scope."""

    def _split_scope(self, nodeid: str) -> str:
        for package in ONE_SCOPE:
            if nodeid.startswith(package):
                return package
        return super()._split_scope(nodeid)


def pytest_xdist_make_scheduler(config: Any, log: Any) -> LoadScopeScheduling | None:
    """Our scheduler when the run asked for `--dist loadscope`; xdist's own otherwise."""
    return PackageScopes(config, log) if config.getoption("dist") == "loadscope" else None
