"""The only programs the agent ever runs: its own `pipeserve` sub-commands.

Requests name a kind (stage, coordinator, the demo import) and validated parameters; the
command line is built here and nowhere else, so no request can make the agent execute
anything of its choosing. Each of them is told the agent's pid (`child_env`) and stops by
itself when the agent is gone (`orchestrator.engine.parent_watch`), so an agent killed with
SIGKILL leaves nothing running behind it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orchestrator
from orchestrator import settings
from orchestrator.engine.parent_watch import PARENT_PID_ENV

ALLOWED = ("stage", "coordinator", "import-demo-model")
SECRET_ENV = settings.CLUSTER_SECRET.name  # read by the engine (orchestrator.engine.config)


def pipeserve_command(sub_command: str, *args: str) -> list[str]:
    """`python -m orchestrator.cli SUB ARGS` with this interpreter; only the sub-commands in ALLOWED."""
    if sub_command not in ALLOWED:
        raise ValueError(f"the agent does not run {sub_command!r}")
    return [sys.executable, "-m", "orchestrator.cli", sub_command, *args]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The agent's environment, minus any inherited cluster secret, plus this agent's pid for
    the child's parent watch, plus `extra`.

    The package's parent directory goes first on PYTHONPATH so the child imports the same
    pipeserve as the agent even when it is not installed (run from a checkout).
    """
    env = {k: v for k, v in settings.process_environment().items() if k != SECRET_ENV}
    env[PARENT_PID_ENV] = str(os.getpid())
    root = str(Path(orchestrator.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env
