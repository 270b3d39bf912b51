"""An engine process started by a node agent stops by itself when that agent is gone.

The agent enforces leases, but an agent killed with SIGKILL (or crashed) enforces nothing:
its stages and coordinator would keep running, holding their ports and memory, for as long
as nobody notices. So the agent puts its pid in the child's environment
(`PIPESERVE_PARENT_PID`) and the child watches `os.getppid()`: when it is no longer the
agent's pid (the child was re-parented to init or a subreaper), the child sends itself
SIGTERM — the same graceful stop the agent would have asked for — and, should that not end
it, kills itself after a grace period.

Why polling rather than Linux's `prctl(PR_SET_PDEATHSIG)`: the death signal fires when the
*thread* that forked the child exits, not the process. The agent starts engine processes
from its HTTP request threads, which end right after answering, so PDEATHSIG would kill
every stage within moments of its start; it would tie correctness to which thread happens to
call `Popen`. The parent pid changes only when the parent process is gone, and polling it
works the same on macOS. A check every 0.25 s costs nothing measurable.

A `LocalPipeline` (tests, benchmarks) names itself the same way, so a killed test leaves no stage
behind. A process started by hand (no such variable) is not watched.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping

from orchestrator import settings
from orchestrator.logs import EventLogger

PARENT_PID_ENV = settings.PARENT_PID.name
POLL_S = 0.25
GRACE_S = 10.0  # as long as the agent's own stop waits between SIGTERM and SIGKILL


def watch_parent(log: EventLogger, env: Mapping[str, str] | None = None, poll_s: float = POLL_S,
                 grace_s: float = GRACE_S) -> threading.Thread | None:
    """Stop this process when the agent named in `PIPESERVE_PARENT_PID` is no longer its parent.

    Call first thing in an engine entry point. Returns the watching (daemon) thread, or None
    when the variable is absent (not started by an agent) or malformed.
    """
    try:
        parent = settings.PARENT_PID.read(env)
    except settings.SettingError as exc:  # the entry point's check exits first; a caller's own env may not
        log.warning("parent_watch.invalid", reason=str(exc))
        return None
    if parent is None:
        return None
    thread = threading.Thread(target=_watch, args=(parent, log, poll_s, grace_s), daemon=True,
                              name="parent-watch")
    thread.start()  # its first check is immediate: the agent may have died before we got here
    return thread


def _watch(parent: int, log: EventLogger, poll_s: float, grace_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(poll_s)
    log.warning("agent.gone", agent_pid=parent, parent_now=os.getppid(), action="stopping")
    os.kill(os.getpid(), signal.SIGTERM)  # the entry point's own graceful stop (or the default: exit)
    time.sleep(grace_s)
    log.error("agent.gone", agent_pid=parent, action=f"still running {grace_s:.0f} s after SIGTERM: killing")
    # Our own group when we lead it (the agent starts each child in a new session), else just us.
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
