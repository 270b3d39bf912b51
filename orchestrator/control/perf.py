"""Performance inputs for plans: measured links and timed layers, from the agents' reports.

Pure part: `with_performance` adds each node's timing of the model and its measured links
(keyed by the registry's node ids) to the planner's NodeFacts; `missing` says what a plan
over some nodes still lacks. I/O part: `measure_links` has every selected agent probe the
others (each peer mints a probe ticket for that and nothing else), `time_layers` has one node
that holds the model time its layers; `refresh_after_preview` runs them after a preview and,
after each, refreshes those nodes' reports and previews again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..agent.client import AgentClient, AgentError
from ..planner import NodeFacts
from ..planner.perf_inputs import LayerTiming, LinkCost
from . import events as ev
from .state import Node, State

if TYPE_CHECKING:
    from .core import Orchestrator

LINK_TTL_S = 86_400  # probe tickets: the agents re-measure periodically with them
LINK_INTERVAL_S = 60.0
PROFILE_TIMEOUT_S = 300.0


def timing_of(node: Node, model_id: str) -> LayerTiming | None:
    """The node's cached timing of `model_id`, as the planner takes it."""
    if node.report is None:
        return None
    for p in node.report.compute:
        if p.model_id == model_id:
            fields = p.model_dump(exclude={"model_id", "threads", "at"})
            return LayerTiming(node_id=node.id, **fields)
    return None


def links_of(node: Node, known: set[str]) -> dict[str, LinkCost]:
    """The node's measured links to registered peers (kernel RTT when known, else the HTTP one)."""
    out: dict[str, LinkCost] = {}
    for s in node.report.links if node.report is not None else []:
        rtt = s.rtt_ms if s.rtt_ms is not None else s.http_rtt_ms
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
    return node.report is not None and any(m.id == model_id for m in node.report.models)


def measure_links(agents: dict[str, AgentClient], nodes: Sequence[Node]) -> bool:
    """Have every node probe the others (each peer mints a probe ticket); True when measured."""
    if len(nodes) < 2:
        return False
    tickets = {n.id: agents[n.id].links_ticket(LINK_TTL_S) for n in nodes}
    for a in nodes:
        peers = [{"node_id": b.id, "name": b.name, "url": b.url, "ticket": tickets[b.id]} for b in nodes if b is not a]
        agents[a.id].measure_links(peers, interval_s=LINK_INTERVAL_S)
    return True


def time_layers(agents: dict[str, AgentClient], nodes: Sequence[Node], model_id: str, log: Any = None) -> bool:
    """Have one node that holds `model_id` time its layers (waits for it); True when it did."""
    holder = next((n for n in nodes if holds(n, model_id)), None)
    if holder is None:
        return False
    client = agents[holder.id]
    status = client.profile(model_id, start=True)
    deadline = time.monotonic() + PROFILE_TIMEOUT_S
    while status.state == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
        status = client.profile(model_id)
    if status.state == "failed" and log is not None:
        log.warning("perf.profile_failed", node=holder.name, model=model_id, reason=status.error)
    return status.state == "done"


def lacking(state: State, model_id: str, node_ids: Sequence[str]) -> tuple[bool, bool]:
    """(links, timing): what a plan over these nodes would gain from measuring (pure); nothing
    when a node is not registered or has not reported."""
    nodes = [n for nid in node_ids if (n := state.node(nid)) is not None and n.report is not None]
    return missing(nodes, model_id) if len(nodes) == len(node_ids) else (False, False)


def refresh_after_preview(orch: "Orchestrator", model_id: str, node_ids: list[str], links: bool, timing: bool,
                          again: Callable[[], None]) -> None:
    """After a preview (a worker): measure what the plan lacked (`decide` said which) and, after
    each part, post the nodes' fresh reports, wait until they are applied and have `again`
    preview the plan once more (only if it is still the one shown, `decide` checks). The links
    take a second and show at once; timing the layers takes longer and follows."""
    state: State = orch.state
    nodes = [n for nid in node_ids if (n := state.node(nid)) is not None and n.report is not None]
    agents = {n.id: orch.agent(n.id) for n in nodes}
    if len(nodes) != len(node_ids) or any(a is None for a in agents.values()):
        return
    parts = [(0, lambda: measure_links(agents, nodes))] if links else []  # type: ignore[arg-type]
    if timing:
        parts.append((1, lambda: time_layers(agents, nodes, model_id, orch.log)))  # type: ignore[arg-type]
    for which, run in parts:
        try:
            if not run():
                continue
            for n in nodes:
                orch.post(ev.NodeReported(node_id=n.id, report=agents[n.id].report(), at=time.time()))
        except AgentError as exc:
            orch.log.warning("perf.measure_failed", reason=exc.message)
            return
        deadline = time.monotonic() + 5
        while missing([orch.state.node(n.id) or n for n in nodes], model_id)[which] and time.monotonic() < deadline:
            time.sleep(0.05)  # the reports posted above are applied by the orchestrator thread
        again()
