"""What the plans know of performance: the nodes' measured links and timed layers (pure).

`with_performance` adds each node's timing of the model and its measured links (keyed by the
registry's node ids) to the planner's NodeFacts; `missing` and `lacking` say what a plan over
some nodes still lacks, so `decide` can have it measured (the I/O is `perf.py`'s). Nothing
here does I/O or imports a module that does (tests/control/test_purity.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.control.rules.state import Node, State
from orchestrator.planner import NodeFacts
from orchestrator.planner.perf_inputs import LayerTiming, LinkCost


def timing_of(node: Node, model_id: str) -> LayerTiming | None:
    """The node's cached timing of `model_id`, as the planner takes it."""
    if node.report is None:
        return None
    for p in node.report.compute:
        if p.model_id == model_id:
            fields = p.model_dump(exclude={"model_id", "threads", "at", "load", "cpus", "spread", "doubt", "tries"})
            return LayerTiming(node_id=node.id, **fields)
    return None


def links_of(node: Node, known: set[str]) -> dict[str, LinkCost]:
    """The node's measured links to registered peers, at the round trip the link matrix shows too
    (on the transport's path when measured there: LinkSample.plan_rtt_ms)."""
    out: dict[str, LinkCost] = {}
    for s in node.report.links if node.report is not None else []:
        rtt = s.plan_rtt_ms
        if s.node_id in known and not s.error and rtt is not None and s.bandwidth_Bps:
            out[s.node_id] = LinkCost(rtt_ms=rtt, bandwidth_Bps=s.bandwidth_Bps, interface=s.interface)
    return out


def with_performance(facts: Sequence[NodeFacts], nodes: Sequence[Node], model_id: str) -> list[NodeFacts]:
    """The facts with each node's timing and links added (pure)."""
    ids = {n.id for n in nodes}
    by_id = {n.id: n for n in nodes}
    return [f.model_copy(update={"timing": timing_of(by_id[f.id], model_id), "links": links_of(by_id[f.id], ids)})
            if f.id in by_id else f for f in facts]


def missing(nodes: Sequence[Node], model_id: str) -> tuple[bool, bool]:
    """(some pair of nodes has no measured link, no node has timed the model)."""
    ids = {n.id for n in nodes}
    no_links = any(set(links_of(n, ids)) != ids - {n.id} for n in nodes)
    no_timing = all(timing_of(n, model_id) is None for n in nodes)
    return no_links, no_timing


def holds(node: Node, model_id: str) -> bool:
    """Whether the node's last report lists the model."""
    return node.report is not None and any(m.id == model_id for m in node.report.models)


def timing_node(state: State, nodes: Sequence[Node], model_id: str) -> tuple[Node | None, str]:
    """Which node times the model's layers, or why none does (pure): one that holds the model and
    runs no engine process of a live session — timed beside a serving stage, the layers compete
    with it (the stage slows, the timing is doubtful) and the prediction costs more than it tells."""
    holders = [n for n in nodes if holds(n, model_id)]
    serving = {nid for s in state.sessions for nid in s.node_ids}
    idle = [n for n in holders if n.id not in serving]
    if idle:
        return idle[0], ""
    if holders:
        names = ", ".join(n.name for n in holders)
        return None, (f"not timing {model_id}'s layers: {names} serve{'s' if len(holders) == 1 else ''} a stage now, "
                      "and timing beside it would compete with serving")
    return None, f"no selected node holds {model_id} yet to time its layers: prepare it, then preview again"


def lacking(state: State, model_id: str, node_ids: Sequence[str]) -> tuple[bool, bool]:
    """(links, timing): what a plan over these nodes would gain from measuring (pure); nothing
    when a node is not registered or has not reported."""
    nodes = [n for nid in node_ids if (n := state.node(nid)) is not None and n.report is not None]
    return missing(nodes, model_id) if len(nodes) == len(node_ids) else (False, False)
