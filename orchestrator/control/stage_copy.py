"""Copying the model to the node that takes a moved stage, during a recovery.

When no node holding the session's model has room for a stage whose node vanished, the
recovery copies the model to a node that has room (`relocation.choose_node` names it and the
nodes to copy from) before it starts the stage there. The copy is the preparer's verified
peer copy: the node's agent fetches every file from the holders over the LAN (each holder
serving a share), writes it under its hidden partial directory and makes it visible only
once its sha256 matches the reference manifest; the node then checks its whole copy against
that manifest once more before the stage may start.

The copy belongs to the recovery attempt: its step in the session's timeline shows its
progress (bytes and per cent), a failure fails the attempt with its reason, and a cancel
(the session is stopped) ends the agent's job and drops its partial files.

`copy_started` and `progress_detail` are pure; `copy_model` is the I/O.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..agent.client import AgentClient, AgentError
from ..agent.schemas import Manifest
from ..units import format_bytes, format_rate
from . import events as ev
from .recovery import _head, step_prefix
from .state import Session, Step

PROGRESS_EVERY_S = 1.0  # each step update is saved with the state: no more than this often
POLL_S = 0.25
# Bounded by the slowest LAN the copy should still finish over (10 MB/s), plus a floor for
# the start and the final check: a copy that takes longer fails the attempt instead of
# holding the session in recovery for ever.
COPY_FLOOR_S = 600.0
SLOWEST_BPS = 10e6

Stepper = Callable[[str, str], None]  # (step state, detail) of the copy's timeline step


class CopyFailed(Exception):
    """The copy did not end with a verified model on the node; the message says why."""


class CopyCancelled(Exception):
    """The recovery was cancelled during the copy (its partial files are dropped)."""


def copy_timeout(total_bytes: int) -> float:
    """Seconds a copy of `total_bytes` may take before the attempt gives up on it."""
    return COPY_FLOOR_S + total_bytes / SLOWEST_BPS


def progress_detail(done: int, total: int, rate_bps: float = 0.0) -> str:
    """A copy's progress as the timeline shows it: bytes, per cent and rate (pure)."""
    percent = 100 * done // total if total > 0 else 0
    rate = f", {format_rate(rate_bps)}" if rate_bps > 0 else ""
    return f"{format_bytes(done)} of {format_bytes(total)} ({percent} %){rate}"


def copy_key(index: int) -> str:
    """The copy step's key within a recovery attempt (after the attempt's prefix)."""
    return f"stage-{index}.copy"


def copy_started(session: Session, e: ev.StageCopyStarted) -> Session:
    """The session with the copy's step in its current recovery attempt, right after the
    stage's stop step (pure)."""
    p = step_prefix(len(session.faults), session.recovery_attempt)
    key = p + copy_key(e.index)
    if not any(st.key == p + f"stage-{e.index}.stop" for st in session.timeline) or \
            any(st.key == key for st in session.timeline):
        return session
    head = _head(len(session.faults), session.recovery_attempt)
    step = Step(key=key, state="running", detail=progress_detail(0, e.total_bytes),
                label=head + f"{e.model_id} copied to {e.node_name} over the LAN from {', '.join(e.sources)} "
                             "(no node holding it had room; every file verified)")
    steps: list[Step] = []
    for st in session.timeline:
        steps.append(st)
        if st.key == p + f"stage-{e.index}.stop":
            steps.append(step)
    return session.model_copy(update={"timeline": tuple(steps)})


def _discard(target: AgentClient, model_id: str) -> None:
    """End the node's job and drop its partial files (best effort: an agent that is gone
    replaces them at its next fetch of the model)."""
    try:
        target.cancel(model_id, discard=True)
    except AgentError:
        pass


def copy_model(target: AgentClient, sources: list[AgentClient], model_id: str, manifest: Manifest, step: Stepper,
               cancel: threading.Event, timeout_s: float | None = None, poll_s: float = POLL_S) -> str:
    """Copy the model to `target` from `sources` and have the target verify it against
    `manifest`; returns the step's closing detail. CopyFailed or CopyCancelled otherwise."""
    total = manifest.total_bytes
    deadline = time.monotonic() + (copy_timeout(total) if timeout_s is None else timeout_s)
    started = time.monotonic()
    shown = 0.0
    try:
        target.fetch_from_peers(model_id, sources, manifest)
        while True:
            if cancel.wait(poll_s):
                _discard(target, model_id)
                raise CopyCancelled
            info = target.progress(model_id)
            if info.state != "running":
                break
            if time.monotonic() > deadline:
                _discard(target, model_id)
                raise CopyFailed(f"still copying after {deadline - started:.0f} s "
                                 f"({progress_detail(info.done_bytes, total)})")
            if time.monotonic() - shown >= PROGRESS_EVERY_S:
                shown = time.monotonic()
                step("running", progress_detail(info.done_bytes, info.total_bytes or total, info.rate_bps))
        if info.state != "done":
            _discard(target, model_id)  # a failed job may keep partial files for a resume: none will come
            raise CopyFailed(info.error or f"the copy was {info.state}")
        # Verified again by the node itself, against the reference manifest, as a prepared node is.
        check = target.check(model_id, manifest)
    except AgentError as exc:
        _discard(target, model_id)
        raise CopyFailed(exc.message) from None
    if check.status != "present":
        raise CopyFailed(f"the copy does not match the reference: {check.message}")
    return (f"{format_bytes(total)} in {len(manifest.files)} file(s) in {time.monotonic() - started:.1f} s, "
            "verified by the node")


__all__ = ["CopyCancelled", "CopyFailed", "copy_key", "copy_model", "copy_started", "copy_timeout",
           "progress_detail"]
