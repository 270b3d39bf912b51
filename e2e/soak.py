"""The soak: floods from a LAN neighbour while 4 streaming clients chat and a stage is killed.

    .venv/bin/python e2e/soak.py [--flood-s 40] [--sockets 400] [--max-connections 128] [--flooders 32]

Loopback only, bounded. Over the chaos run's headless stack (e2e/fault_stack.py: node agents
and `pipeserve router` as processes, the control plane in this process, the demo model over
two nodes) plus a real `pipeserve dashboard`, it

1. launches the cluster (the cold launch time), answers every case alone (the solo greedy runs);
2. kills stage 1 once with no load and no flood: the *quiet* recovery time;
3. starts 4 streaming clients through the router and, at once, three floods without any
   credential — `--sockets` idle TCP connections held at the coordinator's HTTP port
   (refreshed as they are closed), `--flooders` threads reconnecting to stage 1's transport
   port from 127.0.0.2–9 (other "hosts"), and cookieless visits of a viewer link at the
   dashboard — kills stage 1 once more a third of the way in, and samples the session's
   health and the router's model list every 0.25 s;
4. prints a Markdown table: answers completed and equal to their solo run, client errors,
   time not Healthy outside the recovery, the recovery time under flood against the quiet
   one, and whether the admin's dashboard session survived.

Exits 1 when an answer differed, the cluster was torn down or not Healthy outside the
recovery, the loaded recovery took over 2x the quiet one, or the admin was logged out.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import selectors
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from e2e.chaos_clients import Clients, solo_answers
from e2e.fault_stack import MODEL_ID, Stack
from orchestrator import logs

SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]  # "other hosts" on loopback


class ConnectionFlood:
    """`count` idle TCP connections held at (host, port); each one closed is opened again."""

    def __init__(self, host: str, port: int, count: int) -> None:
        self.address, self.count = (host, port), count
        self.opened = self.closed_by_server = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conn-flood", daemon=True)

    def start(self) -> "ConnectionFlood":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        held: set[socket.socket] = set()
        while not self._stop.is_set():
            while len(held) < self.count and not self._stop.is_set():
                try:
                    s = socket.create_connection(self.address, timeout=1)
                except OSError:
                    break  # the backlog is full: wait for closes
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
                held.add(s)
                self.opened += 1
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    if s.recv(65536):
                        continue  # a 429 or the like: read on until the close
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                sel.unregister(s)
                held.discard(s)
                s.close()
                self.closed_by_server += 1
        for s in held:
            s.close()


class HandshakeFlood:
    """`threads` threads connecting to a stage's transport port from other loopback addresses,
    reading its hello and holding the handshake open until the stage gives up on them."""

    def __init__(self, port: int, threads: int) -> None:
        self.port, self.connections = port, 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(SOURCES[i % len(SOURCES)],), daemon=True)
                         for i in range(threads)]

    def start(self) -> "HandshakeFlood":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)

    def _run(self, source: str) -> None:
        while not self._stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=2, source_address=(source, 0))
            except OSError:
                self._stop.wait(0.05)
                continue
            self.connections += 1
            try:
                s.settimeout(2)
                while not self._stop.is_set() and s.recv(4096):
                    pass
            except OSError:
                pass
            finally:
                s.close()


class ViewerFlood:
    """Cookieless visits of a viewer link, one after another (each opens a dashboard session)."""

    def __init__(self, url: str) -> None:
        self.url, self.visits = url, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="viewer-flood", daemon=True)

    def start(self) -> "ViewerFlood":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        with requests.Session() as http:
            while not self._stop.is_set():
                http.cookies.clear()
                try:
                    http.get(self.url, allow_redirects=False, timeout=5)
                    self.visits += 1
                except requests.RequestException:
                    self._stop.wait(0.1)


def _flood_process(coordinator: tuple[str, int], stage_port: int, viewer_url: str, sockets: int, flooders: int,
                   stop, results) -> None:  # runs in its own interpreter (see Floods)
    floods = [ConnectionFlood(coordinator[0], coordinator[1], sockets).start(),
              HandshakeFlood(stage_port, flooders).start(), ViewerFlood(viewer_url).start()]
    stop.wait()
    for f in floods:
        f.stop()
    conn, hand, view = floods
    results.put({"opened": conn.opened, "closed_by_server": conn.closed_by_server, "handshakes": hand.connections,
                 "visits": view.visits})


class Floods:
    """The three floods in a process of their own, as a LAN neighbour is another machine: run
    as threads of this process they took the GIL from the control plane living here (its
    recovery's polls and waits), which no neighbour can do (the 2.07x run had them inside)."""

    def __init__(self, coordinator: tuple[str, int], stage_port: int, viewer_url: str, sockets: int,
                 flooders: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop, self._results = ctx.Event(), ctx.Queue()
        self._proc = ctx.Process(target=_flood_process, name="soak-floods", daemon=True,
                                 args=(coordinator, stage_port, viewer_url, sockets, flooders, self._stop,
                                       self._results))
        self.counts: dict[str, int] = {"opened": 0, "closed_by_server": 0, "handshakes": 0, "visits": 0}

    def start(self) -> "Floods":
        self._proc.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self.counts = self._results.get(timeout=60)
        except queue.Empty:
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()


class HealthLog:
    """The session's phase and health every 0.25 s: seconds not Healthy, and whether it ended."""

    def __init__(self, stack: Stack, session_id: str) -> None:
        self.stack, self.session_id = stack, session_id
        self.samples: list[tuple[float, str, str]] = []  # (monotonic, phase, health)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-log", daemon=True)

    def start(self) -> "HealthLog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            s = self.stack.orch.state.session(self.session_id)
            self.samples.append((time.monotonic(), s.phase if s else "gone", s.health if s else "gone"))

    def unhealthy_s(self, outside: tuple[float, float]) -> float:
        """Seconds sampled not Healthy outside the window `outside` (a recovery in progress)."""
        bad = [t for t, phase, health in self.samples if (phase, health) != ("running", "Healthy")
               and not outside[0] <= t <= outside[1]]
        return 0.25 * len(bad)

    def ended(self) -> bool:
        return any(phase in ("stopping", "stopped", "failed", "gone") for _, phase, _ in self.samples)


class StepClock:
    """Where a recovery's time goes: when the fault was seen and when each of its timeline steps
    (stop, start, listen, coordinator healthy, router) was first seen running and done, sampled
    every 20 ms from the in-process control plane."""

    def __init__(self, stack: Stack, session_id: str) -> None:
        self.stack, self.session_id = stack, session_id
        self.seen: dict[tuple[str, str], float] = {}  # (step key, state) -> first monotonic time
        self.fault_seen: float | None = None
        s = stack.orch.state.session(session_id)
        self._faults = len(s.faults)
        self._before = {(step.key, step.state) for step in s.timeline}  # the launch's and earlier recoveries'
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-clock", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            s = self.stack.orch.state.session(self.session_id)
            if s is None:
                return
            now = time.monotonic()
            if self.fault_seen is None and len(s.faults) > self._faults:
                self.fault_seen = now
            for step in s.timeline:
                if (step.key, step.state) not in self._before:
                    self.seen.setdefault((step.key, step.state), now)

    def phases(self, t0: float, end: float) -> str:
        """`seen +1.23 s, stage-1.stop 0.10 s, ...` for the recovery that began at `t0` (the kill)."""
        self._stop.set()
        self._thread.join(5)
        parts = [f"fault seen +{self.fault_seen - t0:.2f} s" if self.fault_seen else "fault never seen"]
        last = self.fault_seen or t0
        for key in dict.fromkeys(k for k, st in self.seen if st == "done"):
            begun = self.seen.get((key, "running"), last)
            done = self.seen[(key, "done")]
            parts.append(f"{key.rsplit(':', 1)[-1]} {done - max(begun, t0):.2f} s")
            last = done
        parts.append(f"then Healthy {end - last:.2f} s")
        return ", ".join(parts)


def kill_and_recover(stack: Stack, session_id: str, process: str, timeout: float = 300) -> tuple[float, float]:
    """SIGKILL one engine process; (kill time, seconds until the session is Healthy again)."""
    stack.wait_healthy(session_id, timeout)  # a kill is measured from a Healthy session only
    before = len(stack.orch.state.session(session_id).faults)
    pid = stack.processes(session_id)[process]
    clock = StepClock(stack, session_id)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    stack.orch.wait(lambda st: (s := st.session(session_id)) is None or s.phase in ("stopped", "failed") or (
        len(s.faults) > before and s.faults[-1].outcome != "recovering" and s.phase == "running"
        and s.health == "Healthy"), timeout)
    s = stack.orch.state.session(session_id)
    if s is None or s.phase != "running":
        raise RuntimeError(f"the session did not recover from a killed {process}: {s.reason if s else 'gone'}")
    end = time.monotonic()
    print(f"recovery of {process}: {end - t0:.2f} s: {clock.phases(t0, end)}", flush=True)
    return t0, end - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood-s", type=float, default=40.0, help="seconds the floods and the clients run")
    parser.add_argument("--sockets", type=int, default=400, help="idle connections held at the coordinator")
    parser.add_argument("--flooders", type=int, default=32, help="threads flooding a stage's handshake")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--cases", type=int, default=4)
    parser.add_argument("--stall-timeout", type=float, default=60.0,
                        help="PIPESERVE_STALL_TIMEOUT_S of the stages: a loaded 2-core machine is slow, not wedged")
    parser.add_argument("--max-connections", type=int, default=128,
                        help="PIPESERVE_HTTP_MAX_CONNECTIONS of every server: the flood is --sockets over this many "
                             "slots (the descriptor-sized default would need thousands of sockets, a CPU flood on 2 "
                             "cores rather than a slot flood)")
    args = parser.parse_args(argv)
    from orchestrator.models.demo import cached_demo_model
    from tests.support.dashboard_server import start_dashboard
    from webapp.authstore import AuthStore

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        root = Path(tmp)
        stack, dashboard = Stack(root), None
        floods: list = []
        clients = health = None
        try:
            stack.start(cached_demo_model("float32"), env={"PIPESERVE_STALL_TIMEOUT_S": str(args.stall_timeout),
                                                           "PIPESERVE_HTTP_MAX_CONNECTIONS": str(args.max_connections)})
            t = time.monotonic()
            s = stack.wait_healthy(stack.launch().id)
            cold = time.monotonic() - t
            solo = solo_answers(stack.router_url, MODEL_ID, args.cases)
            _, quiet = kill_and_recover(stack, s.id, "stage-1")
            print(f"cold launch {cold:.1f} s; quiet recovery of a killed stage-1 {quiet:.2f} s", flush=True)
            dashboard = start_dashboard(root)
            admin = dashboard.login()
            _, token = AuthStore(dashboard.state_dir).mint_viewer("soak")
            health = HealthLog(stack, s.id).start()
            clients = Clients(stack.router_url, MODEL_ID, solo, args.clients, seed=1).start()
            floods = [Floods((s.coordinator_host, s.coordinator_port), s.stages[1].port,
                             f"{dashboard.url}/viewer/{token}", args.sockets, args.flooders).start()]
            t_flood = time.monotonic()
            time.sleep(args.flood_s / 3)
            killed_at, loaded = kill_and_recover(stack, s.id, "stage-1")
            time.sleep(max(0.0, args.flood_s - (time.monotonic() - t_flood)))
            admin_ok = admin.get(dashboard.url + "/settings", allow_redirects=False, timeout=10).status_code == 200
        finally:
            for f in floods:
                f.stop()
            if clients is not None:
                clients.stop()
            if health is not None:
                health.stop()
            if dashboard is not None:
                dashboard.stop()
            stack.stop()
    tally = clients.tally
    counts = floods[0].counts
    unhealthy = health.unhealthy_s((killed_at, killed_at + loaded))
    rows = [
        ("floods", f"{args.sockets} idle sockets at the coordinator ({counts['opened']} opened, "
                   f"{counts['closed_by_server']} closed by it); {counts['handshakes']} handshakes from "
                   f"{len(SOURCES)} other hosts; {counts['visits']} viewer-link visits (from a process of their own)"),
        ("answers", f"{tally.completed} completed, {tally.matched} equal to their solo greedy run"),
        ("client errors", ", ".join(f"{k}: {v}" for k, v in sorted(tally.errors.items())) or "none"),
        ("not Healthy outside the recovery", f"{unhealthy:.2f} s; torn down: {'yes' if health.ended() else 'no'}"),
        ("stage-1 kill -9 recovery", f"{loaded:.2f} s under flood vs {quiet:.2f} s quiet "
                                     f"({loaded / quiet:.2f}x; cold launch {cold:.1f} s)"),
        ("admin's dashboard session", "kept" if admin_ok else "LOGGED OUT"),
        ("machine load (1 min)", f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"),
    ]
    print("\n| what | result |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    failed = (tally.matched != tally.completed or not tally.completed or health.ended() or unhealthy > 0
              or loaded > 2 * quiet or not admin_ok)
    print("\nverdict:", "FAIL" if failed else "pass")
    return 1 if failed else 0


if __name__ == "__main__":
    logs.setup("soak", "WARNING")
    raise SystemExit(main())
