"""Speculative decoding's figures in the coordinator's /metrics text."""

from __future__ import annotations

from orchestrator.engine.coordinator.metrics import Metrics


def _values(text: str) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("pipeserve_spec")}


def test_passes_drafts_acceptance_and_tokens_per_pass():
    metrics = Metrics(["stage-0", "stage-1"])
    assert _values(metrics.render()) == {
        "pipeserve_spec_passes_total": 0, "pipeserve_spec_drafted_tokens_total": 0,
        "pipeserve_spec_accepted_tokens_total": 0, "pipeserve_spec_acceptance_rate": 0.0,
        "pipeserve_spec_tokens_per_pass": 0.0}
    metrics.observe_pass(4, 4)  # 5 tokens
    metrics.observe_pass(4, 0)  # 1 token
    metrics.observe_pass(2, 1)  # 2 tokens
    assert _values(metrics.render()) == {
        "pipeserve_spec_passes_total": 3, "pipeserve_spec_drafted_tokens_total": 10,
        "pipeserve_spec_accepted_tokens_total": 5, "pipeserve_spec_acceptance_rate": 0.5,
        "pipeserve_spec_tokens_per_pass": round(8 / 3, 4)}
    assert "# TYPE pipeserve_spec_passes_total counter" in metrics.render()


def test_the_counts_behind_the_health_reports_speculation():
    metrics = Metrics(["stage-0"])
    assert metrics.speculation() == {"passes": 0, "drafted": 0, "accepted": 0}
    metrics.observe_pass(4, 3)
    metrics.observe_pass(2, 0)
    assert metrics.speculation() == {"passes": 2, "drafted": 6, "accepted": 3}


def test_health_says_when_a_stage_refuses_to_speculate():
    """A stand-in pipeline (only its health snapshot and draft limit are read): a stage whose PONG said it
    cannot verify drafts makes the report say the cluster never drafts, and why; off, there is no report."""
    from types import SimpleNamespace

    from orchestrator.engine.coordinator.api import Coordinator
    from orchestrator.engine.coordinator.generation import Health, StageHealth
    from orchestrator.engine.coordinator.pauses import Pauses
    from orchestrator.logs import EventLogger

    def shown(k: int, *can: bool) -> dict | None:
        stages = tuple(StageHealth(f"stage-{i}", "127.0.0.1:1", True, 0.1,
                                   {"speculation": c, **({} if c else {"speculation_refused": f"stage {i}'s reason"})})
                       for i, c in enumerate(can))
        pipeline = SimpleNamespace(health=Health("ready", "", stages, 0), speculative_tokens=k, pauses=Pauses())
        return Coordinator(pipeline, None, "m", Metrics(["stage-0"]), EventLogger("t")).health()[1]["speculation"]

    assert shown(4, True, True) == {"max_drafts": 4, "passes": 0, "drafted": 0, "accepted": 0, "refused": False,
                            "refusal": None}
    refused = shown(4, True, False)
    assert refused["refused"] and refused["refusal"] == "stage 1's reason"
    assert shown(0, True, True) is None
