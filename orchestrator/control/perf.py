"""Performance inputs for plans: measured links and timed layers, from the agents' reports.

The pure part (what a plan knows and lacks) is `measured.py`; here: `measure_links` has every selected agent probe the
others (each peer mints a probe ticket for that and nothing else), `time_layers` has one node
that holds the model time its layers; `refresh_after_preview` runs them after a preview and,
after each, refreshes those nodes' reports and previews again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.agent.job_follower import JobTimeout, follow_job
from orchestrator.control.capabilities import Capabilities
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.measured import missing, timing_node
from orchestrator.control.rules.state import Node, State
from orchestrator.control.rules.timing_events import LayerTimingChanged
from orchestrator.proc.wait import WaitTimeout, wait_until

LINK_TTL_S = 86_400  # probe tickets: the agents re-measure periodically with them
LINK_INTERVAL_S = 60.0
PROFILE_TIMEOUT_S = 300.0
REPORTS_APPLIED_S = 5.0  # for the orchestrator thread to apply the reports a worker posted




def transport_hosts(state: State, node_ids: Sequence[str]) -> dict[str, str]:
    """The address each node's stage is given by the plan shown for these nodes (its transport:
    a Thunderbolt bridge's address, say), so the links are measured where the stages will talk;
    nodes the shown plan does not place are left to their registry address (pure)."""
    shown = state.plan
    transport = getattr(shown.result, "transport", None) if shown is not None else None
    if transport is None or set(shown.node_ids) != set(node_ids):  # type: ignore[union-attr]
        return {}
    return {nid: host for nid in node_ids if (host := transport.host_of(nid))}


def measure_links(agents: dict[str, AgentClient], nodes: Sequence[Node], hosts: dict[str, str] | None = None) -> bool:
    """Have every node probe the others (each peer mints a probe ticket) on the path to the
    address its stage will be given (`hosts`, by node id; default the registry's); True when measured."""
    if len(nodes) < 2:
        return False
    hosts = hosts or {}
    tickets = {n.id: agents[n.id].links_ticket(LINK_TTL_S) for n in nodes}
    for a in nodes:
        peers = [{"node_id": b.id, "name": b.name, "url": b.url, "ticket": tickets[b.id],
                  "transport_host": hosts.get(b.id, "")} for b in nodes if b is not a]
        agents[a.id].measure_links(peers, interval_s=LINK_INTERVAL_S)
    return True


def time_layers(agents: dict[str, AgentClient], nodes: Sequence[Node], model_id: str, log: Any = None,
                state: State | None = None, post: Callable[[ev.Event], None] = lambda _: None) -> bool:
    """Have one node that holds `model_id` and serves no stage time its layers (waits for it);
    True when it did (`measured.timing_node` chooses; no node serves when `state` is None).
    `post` tells the plan card what is timed where, and since when, until it ends."""
    holder, why = timing_node(state or State(), nodes, model_id)
    if holder is None:
        if log is not None:
            log.info("perf.profile_skipped", model=model_id, reason=why)
        return False
    client = agents[holder.id]
    status = client.profile(model_id, start=True)
    if status.state == "running":
        post(LayerTimingChanged(node_id=holder.id, model_id=model_id, started_at=time.time()))
        try:
            status = follow_job(lambda: client.profile(model_id), f"timing {model_id} on {holder.name}",
                                PROFILE_TIMEOUT_S, 0.5)
        except JobTimeout:
            return False  # still timing: a later preview measures again
        finally:
            post(LayerTimingChanged(node_id=holder.id, model_id=model_id))
    if status.state == "failed" and log is not None:
        log.warning("perf.profile_failed", node=holder.name, model=model_id, reason=status.error)
    return status.state == "done"





def refresh_after_preview(caps: Capabilities, model_id: str, node_ids: list[str], links: bool, timing: bool,
                          again: Callable[[], None]) -> None:
    """After a preview (a worker): measure what the plan lacked (`decide` said which) and, after
    each part, post the nodes' fresh reports, wait until they are applied and have `again`
    preview the plan once more (only if it is still the one shown, `decide` checks). The links
    take a second and show at once; timing the layers takes longer and follows."""
    state: State = caps.state()
    nodes = [n for nid in node_ids if (n := state.node(nid)) is not None and n.report is not None]
    agents = {n.id: caps.agent(n.id) for n in nodes}
    if len(nodes) != len(node_ids) or any(a is None for a in agents.values()):
        return
    hosts = transport_hosts(state, node_ids)
    parts = [(0, lambda: measure_links(agents, nodes, hosts))] if links else []  # type: ignore[arg-type]
    if timing:
        parts.append((1, lambda: time_layers(agents, nodes, model_id, caps.log, caps.state(),  # type: ignore[arg-type]
                                             caps.post)))
    for which, run in parts:
        try:
            if not run():
                continue
            for n in nodes:
                caps.post(ev.NodeReported(node_id=n.id, report=agents[n.id].report(), at=time.time()))
        except AgentError as exc:
            caps.log.warning("perf.measure_failed", reason=exc.message)
            return
        try:  # the reports posted above are applied by the orchestrator thread
            wait_until(lambda which=which: not missing([caps.state().node(n.id) or n for n in nodes], model_id)[which],
                       REPORTS_APPLIED_S, message="the fresh reports applied")
        except WaitTimeout:
            pass  # preview again all the same: `decide` previews only what is still shown
        again()
