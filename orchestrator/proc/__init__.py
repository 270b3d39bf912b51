"""Child processes, the one way: spawn, wait until ready, stop, and wait for conditions.

Every process pipeserve starts on its own machine — an agent's stages and coordinators, a
local pipeline, the demo's agents, router and dashboard, the tests' helpers — goes through
`ChildProcess`; every "poll until true or give up" goes through `wait_until`. Time comes
from an injectable `Clock`, so lease and TTL logic is testable without sleeping.
"""

from .child import ChildError, ChildProcess, ProcState, stop_all
from .clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock
from .ports import free_port, free_port_block, port_free
from .scan import kill_marked, marked_processes
from .wait import WaitTimeout, wait_until

__all__ = ["ChildError", "ChildProcess", "Clock", "FakeClock", "ProcState", "SYSTEM_CLOCK", "SystemClock",
           "WaitTimeout", "free_port", "free_port_block", "kill_marked", "marked_processes", "port_free",
           "stop_all", "wait_until"]
