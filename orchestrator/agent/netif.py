"""The node's network interfaces: kind, link speed and addresses, as the OS tells them.

Linux: /sys/class/net/<if>/ (a `wireless` directory means Wi-Fi, `speed` the negotiated
Mb/s, the driver `thunderbolt-net` a Thunderbolt bridge, a `/sys/class/infiniband` device
pointing at it RDMA) and `ip -j addr` for addresses. macOS: `networksetup` names the
hardware port of each interface (Wi-Fi, Thunderbolt Bridge, Ethernet). Elsewhere: names and
addresses only.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

from orchestrator.agent.perf_schemas import NetInterface
from orchestrator.agent.report import command_output

SYS_NET = Path("/sys/class/net")
SYS_IB = Path("/sys/class/infiniband")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def linux_kind(name: str, root: Path = SYS_NET) -> str:
    """ethernet, wifi, thunderbolt, infiniband, loopback, virtual or other, from sysfs."""
    d = root / name
    if name == "lo":
        return "loopback"
    if (d / "wireless").exists() or (d / "phy80211").exists():
        return "wifi"
    driver = Path(_read_link(d / "device" / "driver")).name
    if driver == "thunderbolt-net" or name.startswith("thunderbolt"):
        return "thunderbolt"
    if _read(d / "type") == "32":  # ARPHRD_INFINIBAND
        return "infiniband"
    if not (d / "device").exists():
        return "virtual"  # veth, bridge, tun: no hardware behind it
    return "ethernet" if _read(d / "type") == "1" else "other"


def _read_link(path: Path) -> str:
    try:
        return str(path.resolve()) if path.exists() else ""
    except OSError:
        return ""


def linux_speed(name: str, root: Path = SYS_NET) -> int | None:
    """Negotiated speed in Mb/s; None when the OS does not say (-1, absent, down)."""
    text = _read(root / name / "speed")
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def rdma_netdevs(root: Path = SYS_IB) -> set[str]:
    """Network interfaces with an RDMA device (RoCE or InfiniBand) behind them."""
    out: set[str] = set()
    for dev in root.glob("*"):
        for ndev in dev.glob("ports/*/gid_attrs/ndevs/*"):
            name = _read(ndev)
            if name:
                out.add(name)
        for net in (dev / "device" / "net").glob("*"):
            out.add(net.name)
    return out


def linux_addresses() -> dict[str, list[str]]:
    """Interface name -> its IPv4/IPv6 addresses, from `ip -j addr`."""
    try:
        data = json.loads(command_output(["ip", "-j", "addr"]) or "[]")
    except ValueError:
        return {}
    return {i.get("ifname", ""): [a["local"] for a in i.get("addr_info", []) if a.get("local")] for i in data}


def linux_interfaces(root: Path = SYS_NET) -> list[NetInterface]:
    """Every interface under /sys/class/net with what the OS says about it."""
    addresses = linux_addresses()
    rdma = rdma_netdevs()
    out = []
    for d in sorted(root.glob("*")):
        name = d.name
        kind = linux_kind(name, root)
        # a virtual device's speed is made up (a TAP says 10 Mb/s whatever it carries)
        speed = None if kind in ("virtual", "loopback") else linux_speed(name, root)
        out.append(NetInterface(name=name, kind=kind, speed_mbps=speed,
                                rdma=name in rdma, addresses=addresses.get(name, []),
                                up=_read(d / "operstate") in ("up", "unknown")))
    return out


def mac_interfaces() -> list[NetInterface]:
    """macOS: hardware ports from networksetup, addresses from ifconfig."""
    ports = re.findall(r"Hardware Port: (.+)\nDevice: (\S+)", command_output(["networksetup", "-listallhardwareports"]))
    kinds = {dev: ("wifi" if "Wi-Fi" in port else "thunderbolt" if "Thunderbolt" in port else "ethernet")
             for port, dev in ports}
    out, name = [], None
    addrs: dict[str, list[str]] = {}
    for line in command_output(["ifconfig"]).splitlines():
        m = re.match(r"^(\S+): ", line)
        if m:
            name = m.group(1)
            addrs[name] = []
        elif name and (m := re.match(r"\s+inet6? (\S+)", line)):
            addrs[name].append(m.group(1).split("%")[0])
    for n, a in addrs.items():
        guess = "virtual" if n.startswith(("bridge", "utun")) else "other"
        kind = "loopback" if n.startswith("lo") else kinds.get(n, guess)
        out.append(NetInterface(name=n, kind=kind, addresses=a))  # type: ignore[arg-type]
    return out


def interfaces() -> list[NetInterface]:
    """This node's interfaces (cheap: sysfs and one command)."""
    system = platform.system()
    if system == "Linux" and SYS_NET.is_dir():
        return linux_interfaces()
    if system == "Darwin":
        return mac_interfaces()
    return []


def interface_for(address: str, found: list[NetInterface]) -> NetInterface | None:
    """The interface holding a local address."""
    return next((i for i in found if address in i.addresses), None)


def describe(i: NetInterface | None) -> str:
    """'eth0 (ethernet, 1000 Mbit/s, RDMA)' for plans and the link matrix."""
    if i is None:
        return ""
    bits = [i.kind] + ([f"{i.speed_mbps} Mbit/s"] if i.speed_mbps else []) + (["RDMA"] if i.rdma else [])
    return f"{i.name} ({', '.join(bits)})"
