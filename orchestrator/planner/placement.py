"""Placement by predicted time (pure): which node order and which cut points.

When every selected node has timed the model's layers, the split minimizes the slowest
stage's decode step (a slow node gets fewer layers) instead of balancing bytes, still
within each node's memory; when every pair of nodes has a measured link, the nodes after
the first (which runs stage 0 and the coordinator) are ordered so the ring of hops that
every token travels (stage 0 → … → last → coordinator) is as short as possible.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from orchestrator.families import support
from orchestrator.planner.balance import Split, min_max_split
from orchestrator.planner.facts import NodeFacts
from orchestrator.planner.memory import StageCosts
from orchestrator.planner.perf_inputs import ASSUMED_LINK, LOCAL_LINK, LayerTiming, LinkCost
from orchestrator.planner.predict import (
    Performance,
    StageSpec,
    predict,
    shared_machines,
    single_node_stages,
    single_node_verdict,
)
from orchestrator.planner.transport import TransportPlan

MAX_PERMUTED = 6  # nodes after the first; 720 orders at most


def layer_weight(costs: StageCosts, start: int, end: int) -> float:
    """Layers [start, end) in units of an average layer, by bytes (an MoE layer costs more)."""
    mean = costs.layer_bytes(0, costs.num_layers) / max(1, costs.num_layers)
    return costs.layer_bytes(start, end) / mean if mean else float(end - start)


def decode_rows(costs: StageCosts, stages: int) -> int:
    """The micro-batch a stage sees when the plan's concurrency is in flight."""
    return max(1, math.ceil(costs.settings.max_concurrent_sequences / stages))


def timed_split(costs: StageCosts, free_bytes: Sequence[int], timings: Sequence[LayerTiming],
                fill: float = 1.0) -> Split | None:
    """The split whose slowest stage (decode step at the plan's concurrency) is fastest, every
    stage within `fill` of its node's free memory; None when none fits."""
    rows = decode_rows(costs, len(free_bytes))

    def cost(k: int, start: int, end: int) -> float:
        if costs.total_bytes(start, end, runs_coordinator=k == 0) > fill * free_bytes[k]:
            return math.inf
        t = timings[k]
        head = t.head_ms(rows) if end == costs.num_layers else 0.0
        return layer_weight(costs, start, end) * t.layer_ms(rows) + head

    return min_max_split(costs.num_layers, len(free_bytes), cost, frozenset(costs.model.refused_boundaries))


def link_between(a: NodeFacts, b: NodeFacts) -> LinkCost:
    """The measured link from a to b (either direction), loopback on one host, else assumed."""
    if a.id == b.id:
        return LOCAL_LINK
    return a.links.get(b.id) or b.links.get(a.id) or (LOCAL_LINK if a.host and a.host == b.host else ASSUMED_LINK)


def ring_ms(order: Sequence[NodeFacts]) -> float:
    """Latency of one token's ring: every boundary plus the way back to the coordinator."""
    return sum(link_between(order[k], order[(k + 1) % len(order)]).rtt_ms for k in range(len(order)))


def best_order(nodes: Sequence[NodeFacts]) -> list[NodeFacts]:
    """The first node stays first; the others follow the fastest ring of links. The given
    order is kept unless another is more than 5 % faster, or when links are not all measured."""
    nodes = list(nodes)
    if len(nodes) < 3 or len(nodes) - 1 > MAX_PERMUTED:
        return nodes
    if not all(link_between(a, b).measured for a, b in itertools.combinations(nodes, 2)):
        return nodes
    best, best_ms = nodes, ring_ms(nodes)
    for rest in itertools.permutations(nodes[1:]):
        order = [nodes[0], *rest]
        ms = ring_ms(order)
        if ms < best_ms * 0.95:
            best, best_ms = order, ms
    return best


def timings_for(nodes: Sequence[NodeFacts]) -> tuple[list[LayerTiming] | None, str]:
    """Each node's timing; a node without one borrows that of a node with the same accelerator
    (said in the note). None when some node has none to borrow."""
    out: list[LayerTiming] = []
    borrowed: list[str] = []
    for n in nodes:
        t = n.timing or next((m.timing for m in nodes if m.timing and m.accelerator == n.accelerator), None)
        if t is None:
            return None, f"compute not timed on {n.label} (nor on a node with the same accelerator)"
        if n.timing is None:
            borrowed.append(n.name)
        out.append(t)
    timed = sorted({n.name for n in nodes if n.timing})
    note = f"layers timed on {', '.join(timed)}"
    if borrowed:
        note += f"; {', '.join(borrowed)} assumed alike (same accelerator)"
    return out, note


def on_transport(link: LinkCost, a: NodeFacts, b: NodeFacts, transport: TransportPlan | None) -> LinkCost:
    """The link as the boundary a → b uses it: with a backend that binds elsewhere than the
    registry's address (thunderbolt), the interfaces it runs on — and that the probe measured
    another path when it did (an older peer without the echo on the stages' path, agent/linkecho.py)."""
    if transport is None or transport.used == "tcp" or a.id == b.id:
        return link
    ia, ib = transport.interface_of(a.id), transport.interface_of(b.id)
    used = f"{ia.split(' ')[0]} → {ib.split(' ')[0]} ({transport.used})"
    if link.measured and link.interface and link.interface.split(" ")[0] != ia.split(" ")[0]:
        used += f"; measured over {link.interface.split(' ')[0]}"
    return link.model_copy(update={"interface": used})


def performance(costs: StageCosts, nodes: Sequence[NodeFacts], split: Split, hidden_bytes: int,
                timings: Sequence[LayerTiming], note: str = "", transport: TransportPlan | None = None) -> Performance:
    """The prediction for `split` on `nodes` (stage k on nodes[k])."""
    stages = [StageSpec(label=f"stage {k} ({n.name}, layers {a}–{b})", node_name=n.name,
                        layer_weight=layer_weight(costs, a, b + 1), last=b + 1 == costs.num_layers,
                        timing=timings[k], machine=n.machine or "")
              for k, ((a, b), n) in enumerate(zip(split, nodes))]
    pairs = [(nodes[k], nodes[k + 1]) for k in range(len(nodes) - 1)] + [(nodes[-1], nodes[0])]
    links = [on_transport(link_between(a, b), a, b, transport) for a, b in pairs]
    s = costs.settings
    requests = sorted({4, 8, 16, s.max_concurrent_sequences})
    shared = _sharing_a_machine(stages)
    if shared:
        note = f"{note}; {shared} share one machine's cores (a prompt's chunks overlap less)".lstrip("; ")
    m = costs.model
    family = support.family_of({"model_type": m.model_type, "architectures": [m.architecture or ""]}) or ""
    refusal = support.speculation_refusal(family)
    drafts = s.speculative_tokens
    if drafts and refusal:
        note, drafts = f"{note}; no speculative decoding: {refusal}".lstrip("; "), 0
    stepwise = support.verifies_stepwise(family)
    if drafts and stepwise:
        note = (f"{note}; speculative decoding step by step: {support.STEPWISE[family]}; a pass of d drafts costs "
                f"every stage d + 1 one-row steps and crosses each boundary once").lstrip("; ")
    # caches other than plain KV roll a partly accepted pass back by replaying it (engine/stage/rewind.py)
    replays = any(c.kind in ("sliding", "state") for c in m.layer_caches)
    return predict(stages, links, hidden_bytes, requests=requests, timing_note=note,
                   speculative_tokens=drafts, replays=replays, stepwise=stepwise)


def _sharing_a_machine(stages: Sequence[StageSpec]) -> str:
    """'node-a and node-b' when the stages' nodes run on one physical machine ('' when none do)."""
    groups = [list(dict.fromkeys(stages[k].node_name for k in ks)) for ks in shared_machines(stages)]
    return "; ".join(", ".join(g[:-1]) + " and " + g[-1] for g in groups if len(g) > 1)


def with_single_node_verdict(perf: Performance, costs: StageCosts, nodes: Sequence[NodeFacts],
                             timings: Sequence[LayerTiming], hidden_bytes: int) -> Performance:
    """Add the verdict against the fastest node that could hold the whole model alone."""
    whole = costs.single_node_bytes()
    best: tuple[float, Performance, str] | None = None
    for n, t in zip(nodes, timings):
        if whole > n.free_bytes:
            continue
        st, links = single_node_stages(t, layer_weight(costs, 0, costs.num_layers), n.name)
        alone = predict(st, links, hidden_bytes, requests=[p.x for p in perf.aggregate_tps])
        if best is None or alone.decode_tps_1 > best[0]:
            best = (alone.decode_tps_1, alone, n.name)
    if best is None:
        return perf
    return perf.model_copy(update={"single_node": single_node_verdict(perf, best[1], best[2])})


def plan_performance(costs: StageCosts, nodes: Sequence[NodeFacts], split: Split, hidden_bytes: int,
                     manual: bool, transport: TransportPlan | None = None) -> Performance | None:
    """The plan's prediction with its single-node verdict (and, for a manual split, the
    automatic split's numbers beside it); None when some node's compute is unknown."""
    timings, note = timings_for(nodes)
    if timings is None:
        return None
    perf = performance(costs, nodes, split, hidden_bytes, timings, note, transport)
    perf = with_single_node_verdict(perf, costs, nodes, timings, hidden_bytes)
    if manual:
        free = [n.free_bytes for n in nodes]
        auto = timed_split(costs, free, timings, costs.settings.tight_fit_fraction) or timed_split(costs, free, timings)
        if auto is not None:
            a = performance(costs, nodes, auto, hidden_bytes, timings, transport=transport)
            n = max(p.x for p in a.aggregate_tps)
            ranges = " / ".join(f"{x}–{y}" for x, y in auto)
            perf = perf.model_copy(update={"automatic": f"automatic split {ranges}: {a.decode_tps_1:.1f} tok/s for "
                                                        f"one request, {a.aggregate(n):.1f} tok/s at {n}"})
    return perf
