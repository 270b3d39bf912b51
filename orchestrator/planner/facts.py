"""What the planner needs to know about each selected node, taken from the agent's report."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.agent.device_schemas import MEMORY_WORDS
from orchestrator.agent.schemas import Report, Runtime
from orchestrator.planner.perf_inputs import LayerTiming, LinkCost
from orchestrator.planner.transport import InterfaceFact

# Packages whose versions must agree across a cluster: the wire format is pipeserve's, and
# exactness (identical float bits on every stage) needs the same mlx and mlx-lm kernels.
ENGINE_PACKAGES = ("pipeserve", "mlx", "mlx_lm")


class NodeFacts(BaseModel):
    """One selected node, as the planner sees it."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1)  # the registry's id for the node; plans refer to nodes by it
    name: str = Field(min_length=1)  # shown in messages
    accelerator: str  # family: apple-silicon, linux-cuda, linux-cpu, other
    engine_version: str  # see engine_version(); must be equal across a cluster
    free_bytes: int = Field(ge=0)  # memory a plan may use on the node: the accelerator's (memory_kind)
    # Which quantity free_bytes is: host (the OS's), metal (Metal's working set), cuda (the GPU's memory).
    memory_kind: str = "host"
    # mlx's backend and its wheel, e.g. "cuda (mlx-cuda-13 0.32.4)"; "" from an agent that predates
    # the report's runtime (then only engine_version is compared).
    backend: str = ""
    free_ports: tuple[int, ...] = ()  # transport ports free on the node right now
    # The IP the other nodes reach it at. Nodes that share a host (several agents on one
    # machine, as in the demo) share its ports, so the planner never hands one port out twice.
    host: str | None = None
    # The physical machine (agent report's machine_id): nodes on one machine share its cores,
    # so their stages cannot compute at the same time (planner/predict.py).
    machine: str | None = None
    # Performance inputs (planner/placement.py), when measured: this node's timing of the
    # model's layers, and its measured links keyed by the peer's node id.
    timing: LayerTiming | None = None
    links: dict[str, LinkCost] = Field(default_factory=dict)
    # Its network interfaces (kind, RDMA, addresses): the transport backend picks from them.
    interfaces: tuple[InterfaceFact, ...] = ()

    @property
    def label(self) -> str:
        """'name' or 'name (id)' when they differ: what messages call the node."""
        return self.name if self.name == self.id else f"{self.name} ({self.id})"


def free_words(kind: str) -> str:
    """' free' for the OS's memory, ' of GPU memory free' for an accelerator's: what a refusal says a node has."""
    return " free" if kind == "host" else f" of {MEMORY_WORDS.get(kind, kind)} free"


def engine_version(versions: Mapping[str, str | None]) -> str:
    """'pipeserve 0.1.0, mlx 0.32.4, mlx_lm 0.32.2' from a report's `versions` (missing ones shown as '?')."""
    return ", ".join(f"{key} {versions.get(key) or '?'}" for key in ENGINE_PACKAGES)


def backend_of(runtime: Runtime | None) -> str:
    """'cuda (mlx-cuda-13 0.32.4)', 'cpu (mlx-cpu 0.32.4)', 'none (mlx does not load)'; '' when not reported."""
    if runtime is None:
        return ""
    if runtime.backend is None:
        return "none (mlx does not load)"
    return f"{runtime.backend} ({runtime.package})" if runtime.package else runtime.backend


def node_facts_from_report(report: Report, *, node_id: str | None = None, host: str | None = None) -> NodeFacts:
    """The planner's view of a node agent's report.

    `node_id` defaults to the report's name; `host` is the address the registry reaches the
    node at (a report cannot know which of its addresses the peers use).
    """
    return NodeFacts(
        id=node_id or report.name,
        name=report.name,
        accelerator=report.accelerator.family,
        engine_version=engine_version({**report.versions,
                                       "pipeserve": report.versions.get("pipeserve") or report.version}),
        free_bytes=max(0, report.memory.free_bytes),
        memory_kind=report.memory.kind,
        backend=backend_of(report.runtime),
        free_ports=tuple(report.transport_ports.free),
        host=host,
        machine=report.platform.get("machine_id") or None,
        interfaces=tuple(InterfaceFact(name=i.name, kind=i.kind, rdma=i.rdma, addresses=tuple(i.addresses), up=i.up,
                                       speed_mbps=i.speed_mbps) for i in report.interfaces),
    )
