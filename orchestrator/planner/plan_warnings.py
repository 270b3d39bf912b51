"""Warnings: what a plan allows but a user should weigh before launching (docs/architecture.md, "Lifecycle")."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.planner.facts import NodeFacts
from orchestrator.planner.memory import StageCosts
from orchestrator.planner.plan_settings import PlanSettings
from orchestrator.planner.result import Issue, StagePlan, WarningCode
from orchestrator.units import format_bytes


def plan_warnings(model_name: str, nodes: Sequence[NodeFacts],
                  stages: Sequence[StagePlan], costs: StageCosts, settings: PlanSettings) -> list[Issue]:
    """Every warning that applies, in a fixed order."""
    issues: list[Issue] = []
    if len(stages) > 2:
        issues.append(Issue(code=WarningCode.MANY_STAGES,
                            message=f"{len(stages)} stages: pipelines are best validated on 2; each extra stage "
                                    "adds a network hop per token"))
    whole = costs.single_node_bytes()
    for n in nodes:
        if whole <= n.free_bytes:
            issues.append(Issue(code=WarningCode.FITS_ON_ONE_NODE, node_id=n.id,
                                message=f"model {model_name} fits on node {n.name} alone ({format_bytes(whole)} "
                                        f"of {format_bytes(n.free_bytes)} free): a pipeline gives capacity, not "
                                        "speed; one node serves a single request at least as fast"))
    issues += _imbalance(stages, settings)
    for s in stages:
        if s.fits and s.fit_fraction > settings.tight_fit_fraction:
            issues.append(Issue(code=WarningCode.TIGHT_FIT, node_id=s.node_id,
                                message=f"stage {s.stage} uses {s.fit_fraction:.0%} of node {s.node_name}'s free "
                                        f"memory ({format_bytes(s.total_bytes)} of {format_bytes(s.free_bytes)}); "
                                        "long prompts need transient buffers beyond the estimate"))
    return issues


def _imbalance(stages: Sequence[StagePlan], settings: PlanSettings) -> list[Issue]:
    """Per-token bytes per byte of free memory: the busiest stage against the lightest."""
    if len(stages) < 2:
        return []
    load = [s.token_bytes / max(1, s.free_bytes) for s in stages]
    heavy = max(range(len(stages)), key=load.__getitem__)
    light = min(range(len(stages)), key=load.__getitem__)
    ratio = load[heavy] / load[light] if load[light] > 0 else float("inf")
    if ratio <= settings.imbalance_threshold:
        return []
    h, lt = stages[heavy], stages[light]
    return [Issue(code=WarningCode.IMBALANCED, node_id=h.node_id,
                  message=f"stages are imbalanced: stage {h.stage} on {h.node_name} (layers {h.layers}) does "
                          f"{ratio:.2f}x the work per token of stage {lt.stage} on {lt.node_name} (layers "
                          f"{lt.layers}), relative to their free memory; the busiest stage sets the pace")]

