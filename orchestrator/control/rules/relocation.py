"""Where a stage goes when its own node cannot take it back (pure).

A stage whose node's agent vanished cannot be restarted there. Another registered node may
take it when it is reachable, holds the session's model (listed in its report, the same
manifest as the session's nodes report) — or can get it — and has room: a free port of the
dashboard's range and free memory for the stage's layer range — weights, KV cache and
process overhead, the planner's own estimate (`planner.memory.StageCosts`). Nodes outside
the session are preferred; a node that already serves the session may take the stage only
when its free memory (which already counts what it runs) fits it too.

A node that holds the model always wins over one that would have to copy it first (a copy
costs the recovery its duration). Only when no node holding it has room, a node that does
not hold it can get it: it has free disk for the whole model and another reachable node
(never the failed one) holds it to copy from over the LAN; the `Move` then names those
sources.

`choose_node` decides; `moved_toml` writes the cluster TOML with the stage's new address.
The I/O (copying the model, starting the stage, telling the coordinator) is
`recovery.py`'s and `stage_copy.py`'s.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Sequence

from orchestrator.agent.schemas import ModelInfo
from orchestrator.control.rules.state import Node, Session, Settings, StagePlacement
from orchestrator.engine.config import ClusterConfig
from orchestrator.planner import PlanSettings
from orchestrator.planner.cluster_toml import engine_address, render_cluster_toml
from orchestrator.planner.memory import StageCosts
from orchestrator.units import format_bytes

DEFAULT_CONTEXT = 4096  # a session without a plan's numbers (single-node, tests): the plan form's defaults
DEFAULT_CONCURRENCY = 4


@dataclass(frozen=True)
class Move:
    """Stage `index` goes to this node, listening on host:port."""

    index: int
    node_id: str
    node_name: str
    host: str
    port: int
    # Nodes (ids) that hold the model, to copy it from before the stage starts; empty when
    # the node holds it already.
    sources: tuple[str, ...] = ()

    @property
    def copies(self) -> bool:
        """Whether the model is copied to the node first."""
        return bool(self.sources)

    def placement(self, old: StagePlacement) -> StagePlacement:
        """The stage's placement on its new node (same layers)."""
        return old.model_copy(update={"node_id": self.node_id, "node_name": self.node_name, "host": self.host,
                                      "port": self.port})


def plan_numbers(toml: str) -> tuple[int, int]:
    """(context length, concurrent sequences) the session was planned for, from its cluster TOML."""
    try:
        cluster = ClusterConfig.model_validate(tomllib.loads(toml)).cluster if toml else None
    except (tomllib.TOMLDecodeError, ValueError):
        cluster = None
    if cluster is None or cluster.context_length is None:
        return DEFAULT_CONTEXT, DEFAULT_CONCURRENCY
    return cluster.context_length, cluster.max_requests


def stage_bytes(model: ModelInfo, stage: StagePlacement, toml: str) -> int | None:
    """Memory the stage needs on a node that does not run the coordinator (None: unknown model layout)."""
    if model.description is None:
        return None
    context, concurrency = plan_numbers(toml)
    costs = StageCosts(model.description, PlanSettings(context_length=context, max_concurrent_sequences=concurrency))
    return costs.total_bytes(stage.first_layer, stage.last_layer + 1, runs_coordinator=False)


def _holds(node: Node, model: ModelInfo) -> bool:
    assert node.report is not None
    mine = next((m for m in node.report.models if m.id == model.id), None)
    if mine is None or not mine.mlx_format:
        return False
    # Same files as the session's nodes: a model of the same name but other weights would
    # serve other answers (manifests are compared when both sides have one).
    return mine.manifest is None or model.manifest is None or mine.manifest == model.manifest


def model_bytes(model: ModelInfo) -> int:
    """Disk the model takes on a node (its manifest's files, else the listing's size)."""
    return model.manifest.total_bytes if model.manifest is not None else model.total_bytes


def _refusal(node: Node, session: Session, model: ModelInfo, need: int | None, settings: Settings,
             failed: str, sources: Sequence[Node]) -> str | int:
    """Why `node` cannot take the stage, or the port it would listen on (holding the model, or
    able to copy it from one of `sources`)."""
    if node.id == failed:
        return "the stage's own node (its agent is unreachable)"
    if node.report is None or node.status != "reachable":
        return f"unreachable ({node.error or 'no report'})"
    if not _holds(node, model):
        if not sources:
            return f"does not hold {model.id}, and no reachable node holds it to copy from"
        disk = node.report.disk_free_bytes
        if disk < model_bytes(model):
            return (f"does not hold {model.id}, and its {format_bytes(disk)} of free disk cannot take a copy "
                    f"({format_bytes(model_bytes(model))})")
    taken = {st.port for st in session.stages if st.node_id == node.id}
    if session.coordinator_node == node.id:
        taken.add(session.coordinator_port)
    ports = [p for p in node.report.transport_ports.free
             if settings.port_start <= p <= settings.port_end and p not in taken]
    if not ports:
        return f"no free transport port in {settings.port_start}–{settings.port_end}"
    free = node.report.memory.free_bytes
    if need is not None and free < need:
        return f"{format_bytes(free)} free, the stage needs {format_bytes(need)}"
    return ports[0]


def choose_node(session: Session, index: int, nodes: Sequence[Node], model: ModelInfo, settings: Settings,
                failed: str) -> Move | str:
    """The node that takes stage `index` of `session` (its node `failed` is gone), or why none can.

    A node holding the model first; only when none of them can, one that copies it first
    (`Move.sources`: every reachable node holding it)."""
    stage = session.stages[index]
    need = stage_bytes(model, stage, session.config_toml)
    members = set(session.node_ids)
    # Outside the session first (the session's nodes already carry their share), then the
    # most free memory: the stage's KV cache grows into it.
    order = sorted(nodes, key=lambda n: (n.id in members,
                                         -(n.report.memory.free_bytes if n.report is not None else 0), n.name))
    sources = [n for n in order if n.id != failed and n.report is not None and n.status == "reachable"
               and _holds(n, model)]
    verdicts = [(node, _refusal(node, session, model, need, settings, failed, sources)) for node in order]
    takers = [(node, v) for node, v in verdicts if isinstance(v, int)]
    holding = [(node, v) for node, v in takers if _holds(node, model)]
    for node, port in holding or takers:
        copy_from = () if holding else tuple(n.id for n in sources)
        return Move(index=index, node_id=node.id, node_name=node.name, host=node.host, port=port,
                    sources=copy_from)
    refused = [f"{node.name}: {v}" for node, v in verdicts]
    what = f"stage {index} (layers {stage.first_layer}–{stage.last_layer}" + (
        f", needs {format_bytes(need)})" if need is not None else ")")
    if not refused:
        return f"no registered node can take {what}: there is no other node"
    return f"no registered node can take {what}: " + "; ".join(refused)


def moved_toml(toml: str, move: Move) -> str:
    """The cluster TOML with stage `move.index` at its new address (everything else unchanged)."""
    config = ClusterConfig.model_validate(tomllib.loads(toml))
    name = f"stage-{move.index}"
    nodes = [n.model_copy(update={"address": engine_address(move.host, move.port)}) if n.id == name else n
             for n in config.nodes]
    # Validated again: two nodes on one address would be refused here, before anything starts.
    moved = ClusterConfig.model_validate({**config.model_dump(exclude_none=True),
                                          "nodes": [n.model_dump(exclude_none=True) for n in nodes]})
    return render_cluster_toml(moved)


__all__ = ["Move", "choose_node", "model_bytes", "moved_toml", "plan_numbers", "stage_bytes"]
