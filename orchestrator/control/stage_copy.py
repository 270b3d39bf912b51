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

`copy_model` is the I/O; its pure step builders are in `timelines.py`.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.agent.job_follower import JobCancelled, JobTimeout, follow_job
from orchestrator.agent.schemas import DownloadInfo, Manifest
from orchestrator.control.rules.timelines import copy_key, copy_started, copy_timeout, progress_detail
from orchestrator.units import format_bytes

PROGRESS_EVERY_S = 1.0  # each step update is saved with the state: no more than this often
POLL_S = 0.25


Stepper = Callable[[str, str], None]  # (step state, detail) of the copy's timeline step


class CopyFailed(Exception):
    """The copy did not end with a verified model on the node; the message says why."""


class CopyCancelled(Exception):
    """The recovery was cancelled during the copy (its partial files are dropped)."""




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
    limit = copy_timeout(total) if timeout_s is None else timeout_s
    started = time.monotonic()
    shown, last = 0.0, None

    def running(info: DownloadInfo) -> None:
        nonlocal shown, last
        last = info
        if time.monotonic() - shown >= PROGRESS_EVERY_S:  # each step update is saved: not too often
            shown = time.monotonic()
            step("running", progress_detail(info.done_bytes, info.total_bytes or total, info.rate_bps))

    try:
        target.fetch_from_peers(model_id, sources, manifest)
        try:
            info = follow_job(lambda: target.progress(model_id), f"the copy of {model_id}", limit, poll_s,
                              cancel=cancel, on_running=running)
        except JobCancelled:
            _discard(target, model_id)
            raise CopyCancelled from None
        except JobTimeout:
            _discard(target, model_id)
            done = last.done_bytes if last is not None else 0
            raise CopyFailed(f"still copying after {limit:.0f} s ({progress_detail(done, total)})") from None
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
