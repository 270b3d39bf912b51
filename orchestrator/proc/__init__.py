"""Child processes, the one way: spawn, wait until ready, stop, and wait for conditions.

Every process pipeserve starts on its own machine — an agent's stages and coordinators, a
local pipeline, the demo's agents, router and dashboard, the tests' helpers — goes through
`ChildProcess`; every "poll until true or give up" goes through `wait_until`. Time comes
from an injectable `Clock`, so lease and TTL logic is testable without sleeping.
"""

from orchestrator.proc.child import ChildError, ChildProcess, ProcState, stop_all
from orchestrator.proc.clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock
from orchestrator.proc.ports import free_port, free_port_block, port_free
from orchestrator.proc.scan import kill_marked, marked_processes
from orchestrator.proc.wait import WaitTimeout, wait_until

__all__ = ["ChildError", "ChildProcess", "Clock", "FakeClock", "ProcState", "SYSTEM_CLOCK", "SystemClock",
           "WaitTimeout", "free_port", "free_port_block", "kill_marked", "marked_processes", "port_free",
           "stop_all", "wait_until"]
