"""One walk through the `make demo` flow, split over this package's files in the order the
flow has them: set up (log in, settings, nodes, plan, prepare), serve (launch, chat,
sessions, a killed stage), guard rails (a viewer cannot act, a failed launch leaves nothing).

The files share one stack and one browser (e2e.conftest.walk_fixtures of package scope,
overriding e2e's module-scoped ones) and are ordered steps of one walk: after a failed step
every later step of the package is skipped (`incremental(package=True)`). Run the package
as a whole: a later file on its own lacks the state the earlier ones leave.
"""

from __future__ import annotations

from e2e.conftest import walk_fixtures

stack, browser, admin, viewer = walk_fixtures("package")
