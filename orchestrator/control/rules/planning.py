"""From the registry's view of nodes to the planner's inputs, and from a plan to a Session (pure)."""

from __future__ import annotations

import re

from orchestrator.agent.schemas import ModelInfo
from orchestrator.control.rules.measured import with_performance
from orchestrator.control.rules.session_toml import cluster_toml
from orchestrator.control.rules.state import Node, Session, Settings, StagePlacement, State
from orchestrator.planner import (
    NodeFacts,
    Plan,
    PlanSettings,
    Refusal,
    SingleFit,
    kv_cache_bytes,
    node_facts_from_report,
    plan_cluster,
    single_node_fit,
)


class PlanningError(ValueError):
    """The request cannot be planned (unknown node, node not reporting, unknown model)."""


def selected_nodes(state: State, node_ids: list[str]) -> list[Node]:
    """The registered nodes, in the given order, each with a report."""
    nodes = []
    for nid in node_ids:
        node = state.node(nid)
        if node is None:
            raise PlanningError(f"node {nid!r} is not registered")
        if node.report is None:
            raise PlanningError(f"node {node.name} has not reported yet ({node.error or 'unreachable'})")
        nodes.append(node)
    return nodes


def model_info(state: State, model_id: str, prefer: list[Node]) -> ModelInfo:
    """The model as a node that holds it reports it (selected nodes first)."""
    others = [n for n in state.nodes if n not in prefer]
    for node in prefer + others:
        if node.report is not None:
            for m in node.report.models:
                if m.id == model_id:
                    return m
    raise PlanningError(f"no registered node has a model {model_id!r}")


def own_memory(state: State, model_id: str, node: Node, free: int) -> int:
    """What a plan of `model_id` may count as free on `node` (pure). A live session of the same
    model there holds memory the plan itself describes: shown for the running cluster (a preview
    refreshed once its prediction arrived), it turned "Refused — does not fit" right above the
    Healthy cluster. When every engine process the node's agent lists alive belongs to such a
    session, what they hold counts as free again, within the node's budget; any other process
    keeps the node's figure as it is (its agent reports their memory together)."""
    r = node.report
    if r is None:
        return free
    live = {s.id for s in state.sessions if s.model_id == model_id and node.id in s.node_ids}
    alive = [p for p in r.processes if p.alive]
    if not live or not alive or any(p.cluster_id not in live for p in alive):
        return free
    m = r.memory
    back = min(m.available_bytes + m.processes_rss_bytes, m.total_bytes)
    if m.budget_bytes is not None:
        back = min(back, m.budget_bytes)
    return max(free, back)


def plan_settings(settings: Settings, context_length: int = 4096, concurrency: int = 4,
                  manual_split: list[tuple[int, int]] | None = None) -> PlanSettings:
    """PlanSettings from the dashboard's settings and the plan form."""
    return PlanSettings(context_length=context_length, max_concurrent_sequences=concurrency,
                        port_start=settings.port_start, port_end=settings.port_end,
                        transport_backend=settings.transport_backend, manual_split=manual_split,
                        speculative_tokens=settings.speculative_tokens)


def plan_for(state: State, model_id: str, node_ids: list[str], settings: PlanSettings,
             draft_model: str | None = None) -> Plan | Refusal:
    """Run the planner on the registry's latest reports; with `draft_model` (a model id), the
    coordinator's node also holds that draft model (PlanningError when it cannot draft)."""
    nodes = selected_nodes(state, node_ids)
    info = model_info(state, model_id, nodes)
    if draft_model is not None:
        settings = settings.model_copy(update={"draft_model": draft_model, "draft_model_bytes": draft_bytes(
            state, draft_model, info, nodes, settings)})
    facts: list[NodeFacts] = [node_facts_from_report(n.report, node_id=n.id, host=n.host) for n in nodes]
    facts = [f.model_copy(update={"free_bytes": own_memory(state, model_id, n, f.free_bytes)})
             for f, n in zip(facts, nodes)]
    facts = with_performance(facts, nodes, model_id)  # measured links and timed layers (perf.py)
    plan = plan_cluster(info.description, facts, settings, model_name=model_id, mlx_format=info.mlx_format,
                        format_reason=info.reason, unsupported_reason=info.unsupported_reason)
    if draft_model is not None and isinstance(plan, Plan):
        host = state.node(plan.coordinator.node_id)
        if host is None or host.report is None or all(m.id != draft_model for m in host.report.models):
            name = host.name if host is not None else plan.coordinator.node_id
            raise PlanningError(f"the draft model {draft_model!r} is not on {name}, where the coordinator runs: "
                                "copy it there (Prepare it on that node) or choose no draft model")
    return plan


def draft_bytes(state: State, draft_id: str, target: ModelInfo, nodes: list[Node], settings: PlanSettings) -> int:
    """What a draft model holds on the coordinator's node: its weights and its KV cache at the plan's
    context and concurrency. PlanningError when it cannot draft for `target` (engine/coordinator/draft_model.py)."""
    if settings.speculative_tokens == 0:
        raise PlanningError(f"speculative decoding is off: set its tokens drafted per pass under Settings to "
                            f"draft with {draft_id!r}")
    draft = model_info(state, draft_id, nodes)
    if draft_id == target.id:
        raise PlanningError("the draft model must be a smaller model than the one served, not the model itself")
    if not draft.mlx_format or draft.description is None:
        raise PlanningError(f"the draft model {draft_id!r} is not a described MLX model "
                            f"({draft.reason or draft.unsupported_reason or 'no description'})")
    if target.description is not None and draft.description.vocab_size != target.description.vocab_size:
        raise PlanningError(f"the draft model {draft_id!r} has another tokenizer ({draft.description.vocab_size} "
                            f"tokens, the served model {target.description.vocab_size})")
    if any(c.kind in ("sliding", "state") for c in draft.description.layer_caches):
        raise PlanningError(f"the draft model {draft_id!r} keeps a sliding window or a recurrent state, which "
                            "cannot roll back to what verification accepted")
    return draft.description.total_bytes + kv_cache_bytes(draft.description, settings)


def session_name(model_id: str, stages: int) -> str:
    """A router backend name: model and stage count, e.g. "smollm2-135m-instruct-2stage"."""
    slug = re.sub(r"[^a-z0-9]+", "-", model_id.lower()).strip("-")[:48] or "model"
    return f"{slug}-{stages}stage" if stages > 1 else f"{slug}-single"


def session_from_plan(plan: Plan, state: State, session_id: str, model_id: str, toml: str) -> Session:
    """The Session that launching `plan` creates."""
    hosts = {n.id: n.host for n in state.nodes}
    stages = tuple(StagePlacement(index=s.stage, node_id=s.node_id, node_name=s.node_name,
                                  first_layer=s.first_layer, last_layer=s.last_layer,
                                  host=s.host or hosts[s.node_id], port=s.transport_port) for s in plan.stages)
    c = plan.coordinator
    t = plan.transport
    return Session(id=session_id, name=session_name(model_id, len(stages)), model_id=model_id, model_name=model_id,
                   cluster=len(stages) > 1, stages=stages, coordinator_node=c.node_id,
                   coordinator_host=c.host or hosts[c.node_id], coordinator_port=c.http_port, config_toml=toml,
                   transport=t.summary if t else "", transport_fallback=t.reason if t else "")


def single_fit(state: State, model_id: str, node_id: str, context_length: int = 4096,
               concurrency: int = 4) -> SingleFit:
    """The planner's memory check of the whole model on one node (planner/single.py): weights and
    the KV cache at this context length and concurrency, plus overhead, against its free memory.
    PlanningError when it cannot be served there at all."""
    node = selected_nodes(state, [node_id])[0]
    info = model_info(state, model_id, [node])
    if info.unsupported_reason:
        raise PlanningError(f"model {model_id!r} is unsupported: {info.unsupported_reason}")
    if not info.mlx_format or info.num_layers is None:
        raise PlanningError(f"model {model_id!r} cannot be served: {info.reason or 'unknown layout'}")
    if info.description is None:
        raise PlanningError(f"model {model_id!r}: node {node.name} did not describe its layers, so its memory "
                            "cannot be checked (update the node's agent)")
    assert node.report is not None  # selected_nodes checked it
    facts = node_facts_from_report(node.report, node_id=node.id, host=node.host)
    return single_node_fit(info.description, facts, plan_settings(state.settings, context_length, concurrency),
                           model_name=model_id)


def single_session(state: State, session_id: str, model_id: str, node_id: str, context_length: int = 4096,
                   concurrency: int = 4) -> Session:
    """A whole model on one node: one stage plus the coordinator (the baseline), refused when it
    does not fit the node's free memory at this context length and concurrency; its engine
    configuration bounds the KV cache to what the check counted."""
    fit = single_fit(state, model_id, node_id, context_length, concurrency)
    if not fit.fits:
        raise PlanningError(fit.reason)
    node = selected_nodes(state, [node_id])[0]
    info = model_info(state, model_id, [node])
    assert node.report is not None and info.num_layers is not None
    free = [p for p in node.report.transport_ports.free if state.settings.port_start <= p <= state.settings.port_end]
    if len(free) < 2:
        raise PlanningError(f"node {node.name} has fewer than 2 free ports in "
                            f"{state.settings.port_start}–{state.settings.port_end}")
    stage = StagePlacement(index=0, node_id=node.id, node_name=node.name, first_layer=0,
                           last_layer=info.num_layers - 1, host=node.host, port=free[0])
    session = Session(id=session_id, name=session_name(model_id, 1), model_id=model_id, model_name=model_id,
                      cluster=False, stages=(stage,), coordinator_node=node.id, coordinator_host=node.host,
                      coordinator_port=free[1])
    toml = cluster_toml(session, state.settings.transport_backend, context_length=context_length,
                        max_requests=concurrency, speculative_tokens=state.settings.speculative_tokens)
    return session.model_copy(update={"config_toml": toml})
