"""The user-space part of the emulated LAN: delay, jitter and loss between TAP pairs.

`python -m e2e.lan.relay --pairs N --delay-ms D --jitter-ms J --loss P --mtu M` (run inside
the hub namespace, as root) creates, for each i < N, the TAP devices `lnN<i>` (to be moved
into node i's namespace) and `lbN<i>` (to be enslaved to the bridge), prints `ready`, and
forwards every frame from one to the other after D ± J ms (the order of each direction is
kept, as on a wire), dropping a fraction P. Frames are whole Ethernet frames of up to M
bytes: with jumbo frames a bulk transfer is a few thousand frames a second, which Python
keeps up with. Stops on SIGTERM or when stdin closes.
"""

from __future__ import annotations

import argparse
import fcntl
import heapq
import os
import random
import selectors
import signal
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000


def open_tap(name: str) -> int:
    """A TAP device named `name`, its frames read and written through the returned fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def names(i: int) -> tuple[str, str]:
    """(node side, bridge side) interface names of pair i."""
    return f"ln{i}", f"lb{i}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--mtu", type=int, default=64000)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    peer: dict[int, int] = {}
    for i in range(args.pairs):
        a, b = (open_tap(n) for n in names(i))
        peer[a], peer[b] = b, a
        for n in names(i):
            subprocess.run(["ip", "link", "set", n, "mtu", str(args.mtu)], check=True)
    sel = selectors.DefaultSelector()
    for fd in peer:
        sel.register(fd, selectors.EVENT_READ)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ)
    print("ready", flush=True)
    queue: list[tuple[float, int, int, bytes]] = []
    last: dict[int, float] = {fd: 0.0 for fd in peer}  # per destination: keeps each direction in order
    seq = 0
    delay, jitter = args.delay_ms / 1000, args.jitter_ms / 1000
    while not stop:
        timeout = None if not queue else max(0.0, queue[0][0] - time.monotonic())
        if timeout is not None and 0 < timeout < 0.002:
            # epoll waits whole milliseconds: a sub-millisecond delay needs short sleeps instead
            ready = sel.select(0)
            if not ready:
                time.sleep(min(timeout, 0.0001))
        else:
            ready = sel.select(timeout)
        for key, _ in ready:
            if key.fd == sys.stdin.fileno():
                if not os.read(key.fd, 1024):
                    stop.append(1)
                continue
            while True:
                try:
                    frame = os.read(key.fd, args.mtu + 64)
                except BlockingIOError:
                    break
                except OSError:  # the interface went down (namespace deleted): nothing to forward
                    frame = b""
                if not frame:
                    break
                if args.loss and rng.random() < args.loss:
                    continue
                dest = peer[key.fd]
                at = max(last[dest], time.monotonic() + delay + (rng.uniform(-jitter, jitter) if jitter else 0.0))
                last[dest] = at
                seq += 1
                heapq.heappush(queue, (at, seq, dest, frame))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, dest, frame = heapq.heappop(queue)
            try:
                os.write(dest, frame)
            except OSError:
                pass  # the receiving side is down: the frame is lost, as on a wire
    return 0


if __name__ == "__main__":
    sys.exit(main())
