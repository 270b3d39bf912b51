"""Refusal checks that need no split: the node set, the model's format, a manual split's shape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from orchestrator.models.describe import ModelDescription
from orchestrator.planner.facts import NodeFacts
from orchestrator.planner.result import Issue, RefusalCode


def check_nodes(nodes: Sequence[NodeFacts]) -> list[Issue]:
    """Too few nodes, a node selected twice, mixed accelerator families, mlx backends or engine versions
    (the homogeneous-cluster rule: all Apple Silicon or all Linux CUDA, one runtime)."""
    issues: list[Issue] = []
    if len(nodes) < 2:
        issues.append(Issue(code=RefusalCode.TOO_FEW_NODES,
                            message=f"a cluster needs at least 2 nodes; {len(nodes)} selected"))
    seen: set[str] = set()
    for n in nodes:
        if n.id in seen:
            issues.append(Issue(code=RefusalCode.DUPLICATE_NODE, node_id=n.id,
                                message=f"node {n.label} is selected more than once"))
        seen.add(n.id)
    issues += _odd_ones(nodes, "accelerator", RefusalCode.MIXED_ACCELERATORS,
                        "node {node} has accelerator {value}, the other nodes {ref}: "
                        "a cluster's nodes must share one accelerator family")
    # an agent that does not report its runtime is compared by engine version alone
    issues += _odd_ones([n for n in nodes if n.backend], "backend", RefusalCode.MIXED_BACKENDS,
                        "node {node} runs mlx's {value} backend, the other nodes {ref}: a cluster's nodes must run "
                        "one mlx backend (one accelerator family, the same backend wheel), since every stage must "
                        "compute the same bits")
    issues += _odd_ones(nodes, "engine_version", RefusalCode.MIXED_ENGINE_VERSIONS,
                        "node {node} runs {value}, the other nodes {ref}: "
                        "a cluster's nodes must run the same engine version")
    return issues


def _odd_ones(nodes: Sequence[NodeFacts], attr: str, code: RefusalCode, template: str) -> list[Issue]:
    """One issue per node whose `attr` differs from the most common value (ties: the first node's)."""
    values = [getattr(n, attr) for n in nodes]
    if len(set(values)) < 2:
        return []
    # most_common keeps first-seen order among equal counts, so a tie resolves to the first
    # node's value: the node that runs stage 0 and the coordinator sets the standard.
    ref = Counter(values).most_common(1)[0][0]
    return [Issue(code=code, node_id=n.id, message=template.format(node=n.label, value=v, ref=ref))
            for n, v in zip(nodes, values) if v != ref]


def check_model(model: ModelDescription | None, model_name: str, mlx_format: bool, format_reason: str | None,
                num_nodes: int, unsupported_reason: str | None = None) -> list[Issue]:
    """The engine cannot serve the model exactly (the support registry's reason, from the
    agent's report or the description), it is not MLX, or it has fewer layers than there
    are nodes (a stage would be empty)."""
    issues: list[Issue] = []
    unsupported = unsupported_reason or (model.unsupported_reason if model is not None else None)
    if unsupported:
        # The registry's reason says more than any format problem it causes (an unknown
        # family's tensors cannot be described either): one reason, the real one.
        return [Issue(code=RefusalCode.UNSUPPORTED_MODEL, message=f"model {model_name} is unsupported: {unsupported}")]
    if not mlx_format or model is None:
        why = format_reason or "it is not an MLX model directory"
        issues.append(Issue(code=RefusalCode.NOT_MLX_FORMAT, message=f"model {model_name} cannot be served: {why}"))
    if model is not None and 2 <= num_nodes and model.num_layers < num_nodes:
        issues.append(Issue(code=RefusalCode.TOO_MANY_NODES,
                            message=f"model {model_name} has {model.num_layers} layers, fewer than the "
                                    f"{num_nodes} selected nodes; every stage needs at least one layer"))
    return issues


def check_split(split: Sequence[tuple[int, int]], num_layers: int, num_stages: int,
                refused: Sequence[int] = ()) -> list[Issue]:
    """A manual split must give every node, in order, a non-empty inclusive range, the ranges
    following each other from layer 0 to the last layer, no stage starting at a layer in
    `refused` (ModelDescription.refused_boundaries)."""
    issues: list[Issue] = []

    def bad(message: str) -> None:
        issues.append(Issue(code=RefusalCode.INVALID_SPLIT, message=f"manual split: {message}"))

    if len(split) != num_stages:
        bad(f"{len(split)} ranges for {num_stages} selected nodes; give one range per node")
    expected = 0
    for k, (first, last) in enumerate(split):
        if last < first:
            bad(f"stage {k} range {first}-{last} is empty (last layer before first)")
        if first != expected:
            kind = "overlaps the previous one" if first < expected else "leaves a gap"
            bad(f"stage {k} starts at layer {first}, expected {expected}: the range {kind}")
        if k and first in refused:
            bad(f"stage {k} starts at layer {first}, which would separate KV-shared layers from the layers whose "
                f"K/V they reuse (no stage may start at layers {', '.join(map(str, refused))})")
        expected = max(expected, last + 1)
    if split and expected != num_layers:
        bad(f"ranges end at layer {expected - 1} but the model has layers 0-{num_layers - 1}")
    return issues
