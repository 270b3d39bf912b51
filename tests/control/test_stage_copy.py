"""The recovery's model copy against a scripted agent: progress, failure, cancel, timeout, a bad copy."""

from __future__ import annotations

import threading

import pytest

from orchestrator.agent.client import AgentError
from orchestrator.agent.schemas import CheckResult, DownloadInfo, FileEntry, Manifest
from orchestrator.control.rules.timelines import copy_timeout
from orchestrator.control.stage_copy import CopyCancelled, CopyFailed, copy_model

MB = 1 << 20
MANIFEST = Manifest(files={"a.safetensors": FileEntry(size=3 * MB, sha256="a" * 64),
                           "config.json": FileEntry(size=MB, sha256="b" * 64)})


def info(state: str, done: int, error: str | None = None) -> DownloadInfo:
    return DownloadInfo(model_id="tiny", source="peer", state=state, total_bytes=MANIFEST.total_bytes, done_bytes=done,
                        transferred_bytes=done, resumed_bytes=0, reused_bytes=0, rate_bps=MB, current_file=None,
                        files_total=2, files_done=0, error=error, elapsed_s=1.0)


class ScriptedAgent:
    """The target node's agent: each progress call answers the next scripted state (the last repeats)."""

    def __init__(self, script: list[DownloadInfo], check: str = "present", fetch_error: AgentError | None = None):
        self.script, self.check_status, self.fetch_error = script, check, fetch_error
        self.calls: list[str] = []

    def fetch_from_peers(self, model_id: str, peers: list, manifest: Manifest) -> DownloadInfo:
        self.calls.append(f"fetch {len(peers)}")
        if self.fetch_error is not None:
            raise self.fetch_error
        return self.script[0]

    def progress(self, model_id: str) -> DownloadInfo:
        self.calls.append("progress")
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def cancel(self, model_id: str, discard: bool = False) -> DownloadInfo:
        self.calls.append(f"cancel discard={discard}")
        return info("cancelled", 0)

    def check(self, model_id: str, manifest: Manifest, rehash: bool = False) -> CheckResult:
        self.calls.append("check")
        return CheckResult(model_id=model_id, status=self.check_status, message=f"{self.check_status}: 1 file")


def run(agent: ScriptedAgent, cancel: threading.Event | None = None, timeout_s: float | None = None):
    steps: list[tuple[str, str]] = []
    done = copy_model(agent, [object()], "tiny", MANIFEST, lambda s, d: steps.append((s, d)),  # type: ignore[arg-type]
                      cancel or threading.Event(), timeout_s=timeout_s, poll_s=0.001)
    return done, steps


def test_a_copy_reports_its_progress_and_ends_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("orchestrator.control.stage_copy.PROGRESS_EVERY_S", 0.0)
    agent = ScriptedAgent([info("running", 0), info("running", 2 * MB), info("done", 4 * MB)])
    done, steps = run(agent)
    assert "4.0 MiB in 2 file(s)" in done and "verified by the node" in done
    assert ("running", "2.0 MiB of 4.0 MiB (50 %), 1.0 MiB/s") in steps
    assert agent.calls[0] == "fetch 1" and agent.calls[-1] == "check"


def test_a_failed_copy_says_why_and_drops_its_partial_files() -> None:
    agent = ScriptedAgent([info("running", MB), info("failed", MB, "peer_unreachable: connection refused")])
    with pytest.raises(CopyFailed, match="connection refused"):
        run(agent)
    assert "cancel discard=True" in agent.calls


def test_an_agent_that_refuses_the_fetch_fails_the_copy() -> None:
    agent = ScriptedAgent([info("running", 0)], fetch_error=AgentError(507, "not enough disk: 1 MiB free", "disk"))
    with pytest.raises(CopyFailed, match="not enough disk"):
        run(agent)


def test_a_cancel_stops_the_job_and_drops_its_partial_files() -> None:
    cancel = threading.Event()
    cancel.set()
    agent = ScriptedAgent([info("running", MB)])
    with pytest.raises(CopyCancelled):
        run(agent, cancel)
    assert agent.calls[-1] == "cancel discard=True" and "check" not in agent.calls


def test_a_copy_that_takes_too_long_fails_the_attempt() -> None:
    agent = ScriptedAgent([info("running", MB)])
    with pytest.raises(CopyFailed, match="still copying after"):
        run(agent, timeout_s=0.05)
    assert "cancel discard=True" in agent.calls
    assert copy_timeout(0) < copy_timeout(10**11)  # a larger model may take longer


def test_a_copy_that_does_not_match_the_reference_is_not_used() -> None:
    agent = ScriptedAgent([info("done", 4 * MB)], check="mismatch")
    with pytest.raises(CopyFailed, match="does not match the reference"):
        run(agent)
