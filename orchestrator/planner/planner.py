"""`plan_cluster`: a model and the selected nodes in, a Plan or a Refusal out. No I/O.

Order of work: refusals that need no split (node set, format, ports, a manual split's
shape), then the split (manual, or balanced by `balance.balanced_split`: per-token bytes in
proportion to free memory, preferring splits that keep every node under the tight-fit
fraction), then memory fit, then warnings. All refusal reasons found are returned together, so a user fixes them in one
go rather than one per preview.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.models.describe import ModelDescription
from orchestrator.planner.balance import Split, balanced_split, fullest_split
from orchestrator.planner.checks import check_model, check_nodes, check_split
from orchestrator.planner.facts import NodeFacts, free_words
from orchestrator.planner.memory import StageCosts, plan_wire_bytes, prompt_cache_budget
from orchestrator.planner.placement import best_order, plan_performance, timed_split, timings_for
from orchestrator.planner.plan_settings import PlanSettings
from orchestrator.planner.plan_warnings import plan_warnings
from orchestrator.planner.ports import PortAllocation, allocate_ports
from orchestrator.planner.result import CoordinatorPlan, Issue, Plan, Refusal, RefusalCode, StagePlan
from orchestrator.planner.transport import plan_transport
from orchestrator.units import format_bytes


def plan_cluster(model: ModelDescription | None, nodes: Sequence[NodeFacts], settings: PlanSettings | None = None,
                 *, model_name: str | None = None, mlx_format: bool = True,
                 format_reason: str | None = None, unsupported_reason: str | None = None) -> Plan | Refusal:
    """Plan `model` across `nodes` (in order: stage k on nodes[k], the coordinator on nodes[0]).

    `mlx_format` / `format_reason` / `unsupported_reason` come from the node agent's
    ModelInfo; `model` may be None only when the model could not be described (then
    `mlx_format` should be False, or `unsupported_reason` say why). A model the engine
    cannot serve exactly is refused with the support registry's reason.
    """
    settings = settings or PlanSettings()
    if settings.manual_split is None:
        nodes = best_order(nodes)  # measured links decide the order after the first node
    name = model_name or (model.name if model is not None else "?")
    reasons = check_model(model, name, mlx_format, format_reason, len(nodes), unsupported_reason) + check_nodes(nodes)
    unique = len({n.id for n in nodes}) == len(nodes)
    ports, port_issues = allocate_ports(nodes, settings) if unique else (None, [])
    reasons += port_issues
    transport, unreachable = plan_transport(nodes, settings.transport_backend)
    reasons += [Issue(code=RefusalCode.NO_THUNDERBOLT, node_id=nid, message=msg) for nid, msg in unreachable]
    if model is None or not model.supported or len(nodes) < 2 or not unique or model.num_layers < len(nodes):
        return Refusal(model=name, reasons=tuple(reasons))

    costs = StageCosts(model, settings)
    free = [n.free_bytes for n in nodes]
    split: Split | None
    if settings.manual_split is not None:
        split_issues = check_split(settings.manual_split, model.num_layers, len(nodes), model.refused_boundaries)
        reasons += split_issues
        split = None if split_issues else tuple(settings.manual_split)
    else:
        # Prefer headroom to perfect balance: the overheads are estimates and long prompts
        # need transient buffers. Only when no split leaves it everywhere may a node fill up
        # (then with a tight-fit warning); when nothing fits, show the closest attempt.
        # With every node's layers timed, even out predicted step time (a slow node takes
        # fewer layers); else per-token bytes against free memory.
        timings, _ = timings_for(nodes)
        timed = (timed_split(costs, free, timings, fill=settings.tight_fit_fraction)
                 or timed_split(costs, free, timings)) if timings else None
        split = (timed or balanced_split(costs, free, fill=settings.tight_fit_fraction) or balanced_split(costs, free)
                 or fullest_split(costs, free))
    stages = build_stages(costs, nodes, split, ports) if split is not None else ()
    if stages:
        reasons += memory_reasons(costs, nodes, stages, name)
    if reasons or ports is None:
        return Refusal(model=name, reasons=tuple(reasons), stages=tuple(s.model_copy(update={"transport_port": None})
                                                                        for s in stages))
    return Plan(
        model=name,
        num_layers=model.num_layers,
        manual=settings.manual_split is not None,
        stages=stages,
        coordinator=CoordinatorPlan(node_id=nodes[0].id, host=nodes[0].host, transport_port=ports.coordinator_port,
                                    http_port=ports.http_port),
        ports={n.id: ((ports.coordinator_port, ports.stage_ports[0], ports.http_port) if k == 0
                      else (ports.stage_ports[k],)) for k, n in enumerate(nodes)},
        warnings=tuple(plan_warnings(name, nodes, stages, costs, settings)),
        settings=settings,
        performance=plan_performance(costs, nodes, split, plan_wire_bytes(model, split),
                                     settings.manual_split is not None, transport),
        transport=transport,
    )


def build_stages(costs: StageCosts, nodes: Sequence[NodeFacts], split: Split,
                 ports: PortAllocation | None) -> tuple[StagePlan, ...]:
    """The memory-fit rows of a split: one per stage, stage k on nodes[k]."""
    rows = []
    for k, ((first, last), node) in enumerate(zip(split, nodes)):
        start, end = first, last + 1
        weights, kv = costs.weight_bytes(start, end), costs.kv_bytes(start, end)
        overhead = costs.overhead_bytes(runs_coordinator=k == 0)
        total = weights + kv + overhead
        rows.append(StagePlan(
            stage=k, node_id=node.id, node_name=node.name, host=node.host, first_layer=first, last_layer=last,
            holds_embedding=costs.holds_embedding(start, end), holds_head=end == costs.num_layers,
            runs_coordinator=k == 0, weight_bytes=weights, kv_cache_bytes=kv, overhead_bytes=overhead,
            total_bytes=total, free_bytes=node.free_bytes, memory_kind=node.memory_kind,
            fit_fraction=total / node.free_bytes if node.free_bytes else float("inf"),
            token_bytes=costs.token_bytes(start, end),
            prompt_cache_bytes=prompt_cache_budget(node.free_bytes, total),
            transport_port=ports.stage_ports[k] if ports is not None else None,
        ))
    return tuple(rows)


def memory_reasons(costs: StageCosts, nodes: Sequence[NodeFacts], stages: Sequence[StagePlan],
                   model_name: str) -> list[Issue]:
    """Too large for all nodes together (how much is missing), else each stage that does not fit."""
    need = costs.cluster_bytes(len(nodes))
    have = sum(n.free_bytes for n in nodes)
    s = costs.settings
    if need > have:
        return [Issue(code=RefusalCode.MODEL_TOO_LARGE, missing_bytes=need - have,
                      message=f"model {model_name} does not fit even across all {len(nodes)} selected nodes: it "
                              f"needs {format_bytes(need)} (weights, KV cache for {s.max_concurrent_sequences} x "
                              f"{s.context_length} tokens, process overhead), they have {format_bytes(have)}"
                              f"{free_words(nodes[0].memory_kind)}; "
                              f"{format_bytes(need - have)} missing")]  # the exact count: missing_bytes
    label = {n.id: n.label for n in nodes}
    return [Issue(code=RefusalCode.STAGE_DOES_NOT_FIT, node_id=st.node_id, missing_bytes=st.total_bytes - st.free_bytes,
                  message=f"stage {st.stage} (layers {st.layers}) needs {format_bytes(st.total_bytes)} on node "
                          f"{label[st.node_id]}, which has {format_bytes(st.free_bytes)}{free_words(st.memory_kind)}; "
                          f"{format_bytes(st.total_bytes - st.free_bytes)} missing")
            for st in stages if not st.fits]
