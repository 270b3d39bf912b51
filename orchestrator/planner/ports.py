"""Transport ports for a plan, taken from each node's free ports inside the settings' range.

Every stage needs one port (its transport listener). The coordinator runs on the first node
and needs two more there: its identity address in the cluster TOML (the TOML gives every
node a distinct ip:port; the current coordinator only connects out, but the address stays
reserved so that no stage can be given it) and its HTTP port, which the router calls. The
HTTP port comes from the same range because that range is what the administrator opens in
the firewall. So the first node needs 3 free ports, every other node 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from orchestrator.planner.facts import NodeFacts
from orchestrator.planner.plan_settings import PlanSettings
from orchestrator.planner.result import Issue, RefusalCode

COORDINATOR_NODE_PORTS = 3  # coordinator identity, coordinator HTTP, stage 0
STAGE_NODE_PORTS = 1


class PortAllocation(BaseModel):
    """The ports of a plan: one transport port per stage, two more for the coordinator."""

    model_config = ConfigDict(frozen=True)

    stage_ports: tuple[int, ...]  # stage k's transport port, on the node of stage k
    coordinator_port: int  # the coordinator's identity in the TOML, on the first node
    http_port: int  # the coordinator's HTTP port, on the first node


def ports_needed(stage_index: int) -> int:
    """Ports the node of stage `stage_index` needs."""
    return COORDINATOR_NODE_PORTS if stage_index == 0 else STAGE_NODE_PORTS


def allocate_ports(nodes: Sequence[NodeFacts], settings: PlanSettings) -> tuple[PortAllocation | None, list[Issue]]:
    """The lowest free ports in range for every node, nodes on one host never sharing a port.

    On the first node the lowest goes to the coordinator's identity, the next to stage 0 and
    the third to HTTP (as in docs/configuration.md's cluster TOML: coordinator 39600, stage-0 39601). Returns
    the allocation, or None and one issue per node that lacks ports.
    """
    if not nodes:
        return None, []
    taken: dict[str, set[int]] = {}  # host key -> ports given out on that host
    chosen: list[tuple[int, ...]] = []
    issues: list[Issue] = []
    window = settings.port_range
    for k, node in enumerate(nodes):
        host_key = node.host if node.host is not None else f"node:{node.id}"
        used = taken.setdefault(host_key, set())
        candidates = sorted({p for p in node.free_ports if p in window} - used)
        need = ports_needed(k)
        if len(candidates) < need:
            role = "the coordinator and stage 0 need" if k == 0 else f"stage {k} needs"
            shared = " not taken by other selected nodes on its host" if used else ""
            issues.append(Issue(code=RefusalCode.NOT_ENOUGH_PORTS, node_id=node.id,
                                message=f"node {node.label} has {len(candidates)} free port(s) in "
                                        f"{settings.port_start}-{settings.port_end}{shared}; {role} {need}"))
            continue
        ports = tuple(candidates[:need])
        used.update(ports)
        chosen.append(ports)
    if issues:
        return None, issues
    first = chosen[0]
    return PortAllocation(stage_ports=(first[1], *(p[0] for p in chosen[1:])), coordinator_port=first[0],
                          http_port=first[2]), []
