"""What a control-plane worker may use of the orchestrator: one frozen `Capabilities` object.

The effect runner, the Models tab's worker and the performance measurements run in their own
threads and talk to the outside world; they get these capabilities (an argument named `caps`),
never the `Orchestrator` itself, so what each may touch is written down here, a test can hand them
fakes (tests/control/test_effects.py), and no worker module imports `core` (no import cycle).
("Ports" in pipeserve are TCP ports only: `proc/ports.py`, `planner/ports.py`, an agent's
transport range.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.proc.clock import Clock

if TYPE_CHECKING:
    from orchestrator.agent.client import AgentClient
    from orchestrator.control.launcher import Timeouts
    from orchestrator.control.rules.commands import Command
    from orchestrator.control.rules.decide import Decision
    from orchestrator.control.rules.events import Event
    from orchestrator.control.rules.state import State
    from orchestrator.control.secrets import SecretStore
    from orchestrator.registrar import Registrar


@dataclass(frozen=True)
class Capabilities:
    """The orchestrator's side, as workers see it.

    `state()` is the latest snapshot; `post(event)` hands an event to the orchestrator thread;
    `submit(command)` queues a command, `command(command)` decides one and returns the
    decision (CommandRefused when refused); `agent(node_id)` is that node's client (None when
    it is not registered).
    """

    state: Callable[[], State]
    post: Callable[[Event], None]
    submit: Callable[[Command], None]
    command: Callable[[Command], Decision]
    agent: Callable[[str], AgentClient | None]
    registrar: Registrar
    secrets: SecretStore
    timeouts: Timeouts
    clock: Clock
    log: Any  # an orchestrator.logs.EventLogger
