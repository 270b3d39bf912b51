"""The one place tests build the values nodes, reports and sessions are made of (pure, no I/O).

`report`, `node` and `session` build the control plane's `Report`, `Node` and `Session`;
`facts` and `facts_for` the planner's `NodeFacts`. Each has the defaults most tests
want (SmolLM2-135M's 30 layers on two nodes, `node-a` at 10.0.0.1 and `node-b` at 10.0.0.2)
and takes the rest as keywords, so a test names only what it is about.
`tests/test_house.py` keeps these builders here: no other test module defines them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.agent.schemas import Accelerator, Memory, ModelInfo, Ports, Report
from orchestrator.control.rules.state import Node, Session, StagePlacement
from orchestrator.planner import NodeFacts

MIB = 1 << 20
GIB = 1 << 30
GB = 10**9
MODEL = "smol"  # SmolLM2-135M's geometry: 30 layers, 540 MiB
PORTS = tuple(range(39600, 39630))  # a node's transport range
SPLIT = ((0, 14), (15, 29))  # MODEL's 30 layers over two stages


def index_of(name: str) -> int:
    """node-a is 0, node-b is 1, ... (the letter after the last dash)."""
    return ord(name[-1]) - ord("a")


def name_of(i: int) -> str:
    """The name of node i: node-a, node-b, ..."""
    return f"node-{chr(ord('a') + i)}"


def lan_host(name: str) -> str:
    """node-a at 10.0.0.1, node-b at 10.0.0.2, ..."""
    return f"10.0.0.{index_of(name) + 1}"


def model_info(model_id: str = MODEL, *, layers: int = 30, total_bytes: int = 540 * MIB, **fields: Any) -> ModelInfo:
    """A model as a node's report lists it; a `.gguf` name is a file the engine cannot serve."""
    if model_id.endswith(".gguf"):
        fields = {"mlx_format": False, "supported": False, "reason": "GGUF file, not an MLX directory", **fields}
    return ModelInfo(**{"id": model_id, "mlx_format": True, "supported": True, "num_layers": layers,
                        "total_bytes": total_bytes, **fields})


def report(name: str = "node-a", free: int = 8 * GIB, *, fingerprint: str | None = None,
           models: Sequence[ModelInfo | str] = (), ports: Sequence[int] = PORTS, disk: int = 10**11,
           **fields: Any) -> Report:
    """A node's report as its agent sends it: a Linux CPU node with `free` bytes of memory, `models`
    (a name stands for `model_info(name)`) and `ports` free in its transport range; `fields`
    replace any other field (memory, accelerator, runtime, versions, ...)."""
    listed = [model_info(m) if isinstance(m, str) else m for m in models]
    memory = Memory(total_bytes=free, available_bytes=free, budget_bytes=free, processes_rss_bytes=0, free_bytes=free)
    return Report(**{"name": name, "fingerprint": fingerprint or f"fp-{name}", "version": "0.1.0",
                     "accelerator": Accelerator(family="linux-cpu", detail="x86_64"), "versions": {"mlx": "0.32.4"},
                     "platform": {"system": "Linux"}, "memory": memory, "disk_free_bytes": disk,
                     "transport_ports": Ports(start=PORTS[0], end=PORTS[-1], free=list(ports)), "models": listed,
                     "processes": [], "downloads": [], **fields})


def node(name: str = "node-a", free: int = 8 * GIB, *, node_id: str | None = None, reachable: bool = True,
         url: str | None = None, **report_fields: Any) -> Node:
    """A registered node (id `n0` for node-a, ...) at its LAN address, with a credential that must
    never be shown and `report(name, free, **report_fields)` as its last report."""
    nid = node_id or f"n{index_of(name)}"
    return Node(id=nid, name=name, url=url or f"http://{lan_host(name)}:39500", credential=f"secret-credential-{nid}",
                status="reachable" if reachable else "unreachable", error=None if reachable else "connection refused",
                report=report(name, free, **report_fields))


def session(sid: str = "s1", phase: str = "running", name: str = "smol-2stage", *, model: str = MODEL,
            splits: Sequence[tuple[int, int]] = SPLIT, node_ids: Sequence[str] | None = None,
            host: str | None = None, port: int = 39601, coordinator_port: int = 39610, **fields: Any) -> Session:
    """A cluster session of `model`: stage i runs layers `splits[i]` on node i (`node_ids[i]`, else
    `n{i}`), at its LAN address or all at `host`, on transport port `port + i`; the coordinator
    beside stage 0. `fields` set any other field (health, reason, timeline, ...)."""
    ids = list(node_ids or (f"n{i}" for i in range(len(splits))))
    stages = tuple(StagePlacement(index=i, node_id=ids[i], node_name=name_of(i), first_layer=a, last_layer=b,
                                  host=host or lan_host(name_of(i)), port=port + i)
                   for i, (a, b) in enumerate(splits))
    return Session(**{"id": sid, "name": name, "model_id": model, "model_name": model, "cluster": True,
                      "stages": stages, "coordinator_node": ids[0], "coordinator_host": stages[0].host,
                      "coordinator_port": coordinator_port, "phase": phase, **fields})


def facts(i: int, free: int = 8 * GB, *, accelerator: str = "linux-cpu",
               version: str = "pipeserve 0.1.0, mlx 0.32.4", ports: tuple[int, ...] = PORTS, host: str | None = None,
               name: str | None = None, backend: str = "") -> NodeFacts:
    """What the planner knows of node `n{i}` named `node{i}` (or `name`)."""
    return NodeFacts(id=f"n{i}", name=name or f"node{i}", accelerator=accelerator, engine_version=version,
                     free_bytes=free, free_ports=ports, host=host, backend=backend)


def facts_for(*free: int, **kw: Any) -> list[NodeFacts]:
    """One node's facts per free-memory value, numbered from 0."""
    return [facts(i, f, **kw) for i, f in enumerate(free)]
