"""Which network the stages talk over (pure): the transport backend of a plan.

The agents report their interfaces (kind, RDMA, addresses; agent/netif.py). From them:
- `tcp`: every stage binds, and its predecessor connects, at the address the registry
  reaches the node at (whatever interface that is);
- `thunderbolt`: at the node's Thunderbolt-bridge address instead, so activations cross the
  Thunderbolt cable even when the nodes also share an Ethernet or Wi-Fi LAN; a node without
  an up Thunderbolt interface with an address refuses the plan, naming it;
- `rdma`: RDMA capability is detected per node (an RDMA device behind an up interface), but
  pipeserve's engine moves activations over TCP sockets only (engine/transport.py has no
  verbs data path), so the cluster runs on tcp and `reason` says so and why (which nodes
  lack RDMA, or that the engine cannot use it) for the plan, the timeline and the cluster view.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

Backend = Literal["tcp", "thunderbolt", "rdma"]
# Whether the engine has an RDMA data path. It has none (TCP sockets only); kept as a named
# fact so the fallback's reason says "the engine" rather than blaming the nodes.
ENGINE_RDMA_DATA_PATH = False


class InterfaceFact(BaseModel):
    """One network interface of a node, as its agent reported it."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: str  # ethernet, wifi, thunderbolt, infiniband, loopback, virtual, other
    rdma: bool = False
    addresses: tuple[str, ...] = ()
    up: bool = True
    speed_mbps: int | None = None

    @property
    def label(self) -> str:
        """'bridge0 (thunderbolt)', 'eth1 (ethernet, 10000 Mbit/s, RDMA)'."""
        bits = [self.kind, *([f"{self.speed_mbps} Mbit/s"] if self.speed_mbps else []),
                *(["RDMA"] if self.rdma else [])]
        return f"{self.name} ({', '.join(bits)})"


class NodeTransport(BaseModel):
    """Where one node's engine processes bind and are reached."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    node_name: str
    host: str | None  # the address in the cluster TOML (None: the registry's, filled in later)
    interface: str = ""  # the interface holding it, when the report says


class TransportPlan(BaseModel):
    """The backend asked for, the one that runs, and why they differ."""

    model_config = ConfigDict(frozen=True)

    requested: Backend
    used: Literal["tcp", "thunderbolt"]
    reason: str = ""  # non-empty when `used` is not `requested`: shown in the plan, the timeline and the cluster view
    nodes: tuple[NodeTransport, ...] = ()

    def host_of(self, node_id: str) -> str | None:
        """The address node `node_id`'s processes bind on (None: not decided here)."""
        return next((n.host for n in self.nodes if n.node_id == node_id), None)

    def interface_of(self, node_id: str) -> str:
        return next((n.interface for n in self.nodes if n.node_id == node_id), "")

    @property
    def summary(self) -> str:
        """'Transport: thunderbolt (node-a 169.254.3.1 on bridge0, …)' or 'Transport: tcp (rdma …)'."""
        where = ", ".join(f"{n.node_name} {n.host} on {n.interface.split(' ')[0]}" for n in self.nodes
                          if n.host and n.interface)
        text = f"Transport: {self.used}"
        if self.reason:
            return f"{text} — {self.reason}"
        return f"{text} ({where})" if where and self.used != "tcp" else text


class NodeLike(Protocol):
    """What this module reads of a node (NodeFacts has these fields)."""

    id: str
    name: str
    host: str | None
    interfaces: tuple[InterfaceFact, ...]


def _ipv4_first(addresses: Sequence[str]) -> list[str]:
    """IPv4 before IPv6 (a stage binds one address; IPv6 link-local ones need a scope id)."""
    def key(a: str) -> int:
        try:
            return 0 if ipaddress.ip_address(a).version == 4 else 1
        except ValueError:
            return 2
    return sorted(addresses, key=key)


def thunderbolt_interface(interfaces: Sequence[InterfaceFact]) -> tuple[InterfaceFact, str] | None:
    """The node's up Thunderbolt interface with a usable address (IPv4 preferred), or None."""
    for i in interfaces:
        if i.kind == "thunderbolt" and i.up:
            usable = [a for a in _ipv4_first(i.addresses) if not a.lower().startswith("fe80")]
            if usable:
                return i, usable[0]
    return None


def holding(interfaces: Sequence[InterfaceFact], address: str | None) -> InterfaceFact | None:
    """The interface that holds `address`."""
    return next((i for i in interfaces if address and address in i.addresses), None)


def _node_list(interfaces: Sequence[InterfaceFact]) -> str:
    shown = [i.label for i in interfaces if i.kind != "loopback"]
    return ", ".join(shown) if shown else "no interfaces reported"


def plan_transport(nodes: Sequence[NodeLike], backend: Backend) -> tuple[TransportPlan, list[tuple[str, str]]]:
    """The transport for `nodes` (stage order) and the refusals it causes: (node id, message)
    pairs, one per node that cannot take part in the requested backend (thunderbolt only)."""
    problems: list[tuple[str, str]] = []
    if backend == "thunderbolt":
        chosen = []
        for n in nodes:
            found = thunderbolt_interface(n.interfaces)
            if found is None:
                problems.append((n.id, f"node {n.name} has no Thunderbolt bridge interface with an address "
                                       f"({_node_list(n.interfaces)}): connect it by Thunderbolt and give the "
                                       "bridge an address, or choose the tcp transport in Settings"))
                chosen.append(NodeTransport(node_id=n.id, node_name=n.name, host=n.host))
            else:
                iface, address = found
                chosen.append(NodeTransport(node_id=n.id, node_name=n.name, host=address, interface=iface.label))
        return TransportPlan(requested="thunderbolt", used="thunderbolt", nodes=tuple(chosen)), problems
    on_host = tuple(NodeTransport(node_id=n.id, node_name=n.name, host=n.host,
                                  interface=(i.label if (i := holding(n.interfaces, n.host)) else ""))
                    for n in nodes)
    if backend == "tcp":
        return TransportPlan(requested="tcp", used="tcp", nodes=on_host), problems
    return TransportPlan(requested="rdma", used="tcp", reason=rdma_reason(nodes), nodes=on_host), problems


def rdma_reason(nodes: Sequence[NodeLike]) -> str:
    """Why an rdma request runs on tcp, naming each node's capability."""
    capable = {n.id: [i for i in n.interfaces if i.rdma and i.up] for n in nodes}
    lacking = [n.name for n in nodes if not capable[n.id]]
    have = [f"{n.name} ({', '.join(i.name for i in capable[n.id])})" for n in nodes if capable[n.id]]
    if lacking:
        why = f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no RDMA device"
        if have:
            why += f" (RDMA on {', '.join(have)})"
    elif not ENGINE_RDMA_DATA_PATH:
        why = f"every node has RDMA ({', '.join(have)}), but pipeserve's engine has no RDMA data path yet"
    else:  # pragma: no cover - no engine with one today
        return ""
    return f"rdma requested, running on tcp: {why}"
