"""A LAN on one machine: every node in its own network namespace, on one bridge, with a
link profile (profiles.py) between them. Test tree only; needs root.

Layout (all inside namespaces this harness creates; nothing touches the host's interfaces):
- a hub namespace holding the bridge `br0` (multicast snooping off, so zeroconf floods);
- one namespace per node with `eth0` at 10.77.0.(10+i)/24 on that bridge;
- a control namespace at 10.77.0.254 (dashboard, router, browser), attached unshaped.
A node's attachment is a veth pair (loopback profile) or, when the profile adds delay,
jitter or loss, a TAP pair joined by the user-space relay (relay.py) running in the hub.
Line rates are tbf qdiscs in the kernel on both ends of every node's attachment.
`Lan.down()` (also on failure: use it as a context manager) ends every process still in its
namespaces and deletes them, which removes every interface with them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from e2e.lan.profiles import LinkProfile, tbf_args

SUBNET = "10.77.0"
CONTROL_IP = f"{SUBNET}.254"
MTU = 64000
PREFIX = "ps11"  # every namespace name starts with it (how a crashed run's leftovers are found)
CLONE_NEWNET = 0x40000000
REPO = Path(__file__).resolve().parents[2]


class LanError(RuntimeError):
    """A step of building the LAN failed; the message has the command and its output."""


def unavailable() -> str | None:
    """Why the emulated LAN cannot be built here (tests needing it skip with this), or None."""
    if os.geteuid() != 0:
        return "the emulated LAN needs root (network namespaces, a bridge, TAP devices, tc): run as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the emulated LAN needs iproute2's `{tool}`"
    if not os.path.exists("/dev/net/tun"):
        return "the emulated LAN needs /dev/net/tun for its relay"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def run(*argv: str) -> str:
    """Run a command; LanError with its output when it fails."""
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if r.returncode != 0:
        raise LanError(f"{' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


@dataclass
class LanHost:
    """One namespace on the LAN."""

    name: str
    ns: str
    ip: str

    def argv(self, *cmd: str) -> list[str]:
        """`cmd` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns, *cmd]


@dataclass
class Lan:
    """The emulated LAN: `with Lan(profile, 3) as lan: ...`."""

    profile: LinkProfile
    size: int
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    nodes: list[LanHost] = field(default_factory=list)
    control: LanHost | None = None
    _relay: subprocess.Popen | None = None
    _namespaces: list[str] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"{PREFIX}{self.tag}h"

    def __enter__(self) -> "Lan":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _netns(self, name: str) -> str:
        run("ip", "netns", "add", name)
        self._namespaces.append(name)
        run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def up(self) -> "Lan":
        """Build the namespaces, the bridge, the attachments and the shaping."""
        hub = self._netns(self.hub)
        run("ip", "-n", hub, "link", "add", "br0", "mtu", str(MTU), "type", "bridge", "mcast_snooping", "0")
        run("ip", "-n", hub, "link", "set", "br0", "up")
        self.control = LanHost("control", self._netns(f"{PREFIX}{self.tag}c"), CONTROL_IP)
        self._veth(self.control, "lc")
        self.nodes = [LanHost(f"node-{chr(97 + i)}", self._netns(f"{PREFIX}{self.tag}n{i}"), f"{SUBNET}.{10 + i}")
                      for i in range(self.size)]
        if self.profile.relayed:
            self._start_relay()
        for i, node in enumerate(self.nodes):
            if self.profile.relayed:
                run("ip", "-n", hub, "link", "set", f"ln{i}", "netns", node.ns)
                run("ip", "-n", node.ns, "link", "set", f"ln{i}", "name", "eth0")
                run("ip", "-n", hub, "link", "set", f"lb{i}", "master", "br0", "up")
                self._configure(node)
            else:
                self._veth(node, f"lb{i}")
            if self.profile.rate_bps:
                run("tc", "-n", node.ns, "qdisc", "add", "dev", "eth0", "root", *tbf_args(self.profile.rate_bps, MTU))
                run("tc", "-n", hub, "qdisc", "add", "dev", f"lb{i}", "root", *tbf_args(self.profile.rate_bps, MTU))
        return self

    def _veth(self, host: LanHost, hub_side: str) -> None:
        run("ip", "-n", self.hub, "link", "add", hub_side, "mtu", str(MTU), "type", "veth", "peer", "name", "eth0",
            "mtu", str(MTU), "netns", host.ns)
        run("ip", "-n", self.hub, "link", "set", hub_side, "master", "br0", "up")
        self._configure(host)

    def _configure(self, host: LanHost) -> None:
        run("ip", "-n", host.ns, "link", "set", "eth0", "mtu", str(MTU), "up")
        run("ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        run("ip", "-n", host.ns, "route", "add", "224.0.0.0/4", "dev", "eth0")  # zeroconf's multicast

    def _start_relay(self) -> None:
        delay, jitter, loss = self.profile.per_relay()
        self._relay = subprocess.Popen(
            ["ip", "netns", "exec", self.hub, sys.executable, "-m", "e2e.lan.relay", "--pairs", str(self.size),
             "--delay-ms", str(delay), "--jitter-ms", str(jitter), "--loss", str(loss), "--mtu", str(MTU)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self._relay.stdout.readline().strip() if self._relay.stdout else ""
        if line != "ready":
            raise LanError(f"the relay did not start: {line} {self._relay.stderr.read() if self._relay.stderr else ''}")

    def down(self) -> None:
        """End every process in the LAN's namespaces, stop the relay, delete the namespaces."""
        for ns in reversed(self._namespaces):
            kill_namespace_processes(ns)
        if self._relay is not None:
            with contextlib.suppress(OSError):
                self._relay.stdin.close()  # type: ignore[union-attr]
            self._relay.terminate()
            try:
                self._relay.wait(5)
            except subprocess.TimeoutExpired:
                self._relay.kill()
                self._relay.wait(5)
            for pipe in (self._relay.stdout, self._relay.stderr):  # else a ResourceWarning, later, elsewhere
                if pipe is not None:
                    pipe.close()
            self._relay = None
        for ns in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._namespaces.clear()


def kill_namespace_processes(ns: str) -> None:
    """SIGKILL every process in namespace `ns` (they are this harness's: it made the namespace)."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in out:
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), 9)


def leftovers() -> list[str]:
    """Namespaces of earlier runs of this harness (e.g. killed before it could clean up)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX) and "probe" not in line]


def remove_leftovers(older_than_s: float = 3600) -> list[str]:
    """Delete this harness's namespaces older than `older_than_s` (a concurrent run's are kept)."""
    import time

    gone = []
    for ns in leftovers():
        path = Path("/run/netns") / ns
        try:
            age = time.time() - path.stat().st_mtime
        except OSError:
            continue
        if age > older_than_s:
            kill_namespace_processes(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            gone.append(ns)
    return gone


@contextlib.contextmanager
def joined(host: LanHost) -> Iterator[None]:
    """Run the calling thread (and every process it starts) inside `host`'s namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{host.ns}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise LanError(f"setns into {host.ns}: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(back, CLONE_NEWNET) != 0:
                raise LanError(f"could not return to the original network namespace: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(target)
        os.close(back)
