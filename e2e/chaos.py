"""The chaos run: K streaming clients through the router while faults are injected at random.

    .venv/bin/python e2e/chaos.py [--duration 300] [--clients 4] [--seed 1] [--faults kill-stage,...]

Over a headless stack (e2e/fault_stack.py: node agents and `pipeserve router` as processes,
the control plane in this process, SmolLM2-135M-Instruct split over two nodes), it first
answers every case alone (the solo greedy runs), then starts the clients and, one at a
time with a random quiet gap, injects a fault:

| fault | what |
|---|---|
| kill-stage / stop-stage | SIGKILL, or SIGSTOP then SIGCONT after a while, of a random stage |
| kill-coordinator / stop-coordinator | the same for the coordinator |
| kill-agent / stop-agent | a node agent (its engine processes die with it); restarted / continued after a while |
| restart-control | the control plane (the dashboard's orchestrator) stops and comes back after a while |

After each fault it waits until the cluster is Healthy again (or cleanly stopped: nothing
left running, router entry gone; then it launches a new cluster and carries on). Invariants
(e2e/chaos_clients.py): every completed answer equals its solo run; no request waits more
than `--stall-bound` s without a token or an error; the router never lists a backend that
cannot serve for more than 2 s; each recovery within the target (0.4 x the cold launch
measured at the start, at least `--min-target` s); no orphan process and no leaked port at
the end. Prints a Markdown report; exits 1 when any invariant was violated.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from e2e.chaos_clients import Clients, Monitor, solo_answers
from e2e.fault_stack import AGENT_STARTUP_TIMEOUT_S, MODEL_ID, Stack
from orchestrator import logs
from orchestrator.proc import marked_processes, port_free

# Before "no fault seen" is concluded: a frozen stage is declared lost after the coordinator's
# 3 s ping timeout, a frozen coordinator after the watcher's 1 s /health timeout.
QUIET_S = 5.0
# Detection time on top of the recovery target for a frozen (SIGSTOP) process, by design.
FROZEN_DETECTION_S = 3.5
FAULTS = ("kill-stage", "stop-stage", "kill-coordinator", "stop-coordinator", "kill-agent", "stop-agent",
          "restart-control")


def last_fault_at(session) -> float:
    """When the session's latest fault was seen (0 when none): it keeps only its last faults, so
    their count stops growing while new ones still come."""
    return session.faults[-1].at if session is not None and session.faults else 0.0


@dataclass
class Injected:
    """One fault and how the cluster came out of it."""

    at: float  # seconds since the clients started
    kind: str
    target: str
    outcome: str = ""  # recovered | no fault seen | stopped (relaunched) | NOT RECOVERED
    seconds: float | None = None  # from the injection (a process) or the return (an agent, the control plane)
    detail: str = ""  # to Healthy again, or to stopped
    away: float = 0.0  # seconds an agent or the control plane stayed away (not counted in `seconds`)


class Run:
    """The stack, the live session and the faults injected so far."""

    def __init__(self, stack: Stack, rng: random.Random, hold: tuple[float, float]) -> None:
        self.stack, self.rng, self.hold = stack, rng, hold
        self.session_id = ""
        self.faults: list[Injected] = []
        self.relaunches = 0
        self.ports: set[int] = set()  # engine ports the run's sessions listened on (checked at the end)

    def launch(self) -> float:
        """Launch the cluster and wait until Healthy and routable; returns the seconds it took."""
        t0 = time.monotonic()
        orch = self.stack.orch
        if orch.state.preparation is None:  # a restarted control plane does not keep it: check again
            orch.prepare(MODEL_ID, [a.node_id for a in self.stack.agents])
            orch.wait(lambda st: st.preparation is not None and st.preparation.finished, 300)
        s = self.stack.launch()
        s = self.stack.wait_healthy(s.id)
        assert s is not None and s.health == "Healthy", s.reason if s else "gone"
        self.session_id = s.id
        self.ports.update([s.coordinator_port] + [st.port for st in s.stages])
        deadline = time.monotonic() + 60
        while MODEL_ID not in self.stack.router_models():
            assert time.monotonic() < deadline, "the router never listed the model"
            time.sleep(0.1)
        return time.monotonic() - t0

    def inject(self, kind: str, at: float) -> Injected:
        """Inject one fault. A stopped process is continued later by a timer (the recovery runs
        meanwhile); an agent or the control plane is brought back before this returns."""
        pids = self.stack.processes(self.session_id)
        sig = signal.SIGKILL if kind.startswith("kill") else signal.SIGSTOP
        if kind.endswith("-stage"):
            target = self.rng.choice(sorted(p for p in pids if p.startswith("stage-")))
            return self._signal_process(Injected(at, kind, target), pids[target], sig)
        if kind.endswith("-coordinator"):
            return self._signal_process(Injected(at, kind, "coordinator"), pids["coordinator"], sig)
        if kind.endswith("-agent"):
            agent = self.rng.choice(self.stack.agents[:2])
            fault = Injected(at, kind, agent.name)
            agent.send(sig)
            fault.away = self.rng.uniform(*self.hold)
            time.sleep(fault.away)
            if sig == signal.SIGKILL:
                agent.proc.wait_exit(10)
                agent.start(AGENT_STARTUP_TIMEOUT_S)  # same state directory: same identity and credential
            else:
                agent.send(signal.SIGCONT)
            return fault
        fault = Injected(at, kind, "control plane")
        self.stack.orch.stop()
        fault.away = self.rng.uniform(*self.hold)
        time.sleep(fault.away)
        self.stack.orch = self.stack._control_plane()
        return fault

    def _signal_process(self, fault: Injected, pid: int, sig: int) -> Injected:
        os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            def cont() -> None:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass  # replaced (killed) by the recovery meanwhile, as it should be

            timer = threading.Timer(self.rng.uniform(*self.hold), cont)
            timer.daemon = True
            timer.start()
        return fault

    def settle(self, fault: Injected, started: float, faults_before: float, timeout: float = 180.0) -> None:
        """Wait until the session is Healthy and serving again, or was stopped (then relaunch)."""
        time.sleep(1.0)  # let the watcher see what happened (a kill -9 is seen in 0.1-0.5 s)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            orch = self.stack.orch
            s = next((x for x in orch.state.sessions if x.id == self.session_id), None)  # live ones only
            if s is None:
                ended = orch.state.session(self.session_id)  # in the history, with why it ended
                fault.seconds = time.monotonic() - started
                fault.outcome = "stopped (relaunched)"
                fault.detail = (ended.reason if ended else "session gone")[:120]
                left = [p for p in self.stack.processes(self.session_id)]
                if left or MODEL_ID in self.stack.router_models():
                    fault.outcome = "NOT CLEANLY STOPPED"
                    fault.detail += f" (left: {left})"
                self.relaunches += 1
                self.launch()
                return
            seen = last_fault_at(s) > faults_before
            if not seen and time.monotonic() - started < QUIET_S:
                time.sleep(0.1)  # a frozen process is only declared lost after a few seconds
                continue
            if s.phase == "running" and s.health == "Healthy" and self._serving(s.url):
                fault.seconds = time.monotonic() - started if seen else None  # nothing to recover from
                fault.outcome = "recovered" if seen else "no fault seen"
                if not seen:
                    fault.detail = f"no fault declared; Healthy and serving {QUIET_S:.0f} s later"
                if seen:
                    f = s.faults[-1]
                    fault.detail = (f"{', '.join(f.processes)} replaced (attempts {f.attempts}); "
                                    f"{f.reason[:80]}")
                return
            time.sleep(0.1)
        fault.outcome = "NOT RECOVERED"
        fault.seconds = time.monotonic() - started
        last = self.stack.orch.state.session(self.session_id)
        fault.detail = f"{last.phase}, {last.health}: {last.reason[:100]}" if last else "session unknown"

    def _serving(self, url: str) -> bool:
        import requests

        try:
            return requests.get(url + "/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False


def leftovers(stack: Stack, root: Path, ports: list[int]) -> list[str]:
    """Orphan processes (any pipeserve process naming the run directory) and ports still taken."""
    deadline = time.monotonic() + 20
    while True:
        orphans = marked_processes(str(root))
        taken = [p for p in ports if not port_free(p)]
        if (not orphans and not taken) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return [f"orphan pid {p}" for p in orphans] + [f"port {p} still taken" for p in taken]


def target_of(fault: Injected, target: float) -> float:
    """The recovery target of one fault: a frozen process is only seen after a few seconds."""
    frozen = fault.kind in ("stop-stage", "stop-coordinator")
    return target + (FROZEN_DETECTION_S if frozen else 0.0)


def print_report(args, load: tuple[float, float], cold: float, target: float, run: Run, clients: Clients,
           monitor: Monitor, left: list[str], elapsed: float) -> list[str]:
    """Print the Markdown report; returns the invariant violations."""
    t = clients.tally
    violations = list(monitor.violations) + t.mismatches + left
    if args.streams_must_survive:  # answers in flight pause and resume (docs/recovery.md): none may break
        violations += [f"{n} answer(s) broken: {kind}" for kind, n in sorted(t.errors.items())
                       if kind in ("stream error", "connection")]
    violations += [f"fault {i + 1} ({f.kind} {f.target}): {f.outcome}" for i, f in enumerate(run.faults)
                   if f.outcome in ("NOT RECOVERED", "NOT CLEANLY STOPPED")]
    late = [f"fault {i + 1} ({f.kind} {f.target}): healthy again after {f.seconds:.1f} s > target "
            f"{target_of(f, target):.1f} s" for i, f in enumerate(run.faults)
            if f.outcome == "recovered" and f.seconds and f.seconds > target_of(f, target)]
    if args.time_targets == "enforce":
        violations += late
    print(f"\n## Chaos run: {elapsed:.0f} s, {args.clients} streaming clients, seed {args.seed}")
    print(f"\nload average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end, on {os.cpu_count()} cores; "
          f"cold launch {cold:.1f} s, recovery target {target:.1f} s\n")
    print("| # | at | fault | target | outcome | to Healthy (target) | detail |")
    print("|---|---|---|---|---|---|---|")
    for i, f in enumerate(run.faults):
        secs = f"{f.seconds:.1f} s" if f.seconds is not None else "-"
        away = f" (after {f.away:.1f} s away)" if f.away else ""
        print(f"| {i + 1} | {f.at:.0f} s | {f.kind} | {f.target} | {f.outcome} | {secs}{away} "
              f"({target_of(f, target):.1f} s) | {f.detail} |")
    print(f"\nrequests: {t.completed} completed ({t.matched} equal to their solo run, {len(t.mismatches)} not), "
          f"errors {dict(sorted(t.errors.items())) or 'none'}, {t.tokens} stream chunks; longest wait without a "
          f"token or an error {monitor.longest_wait:.1f} s (bound {args.stall_bound:.0f} s); longest listing of a "
          f"backend that could not serve {monitor.longest_bad_listing:.1f} s (bound 2 s); relaunches "
          f"{run.relaunches}; leftovers {left or 'none'}")
    print(f"\ninvariant violations: {len(violations)}")
    for v in violations:
        print(f"- {v}")
    if late and args.time_targets == "report":
        print("recovery times over the target (reported, not counted: --time-targets report):")
        for v in late:
            print(f"- {v}")
    return violations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of faults and load")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS), help="fault kinds to draw from (comma-separated)")
    parser.add_argument("--sequence", default="", help="these fault kinds in this order, then stop (smoke test)")
    parser.add_argument("--gap", type=float, nargs=2, default=(3.0, 10.0), help="quiet seconds between faults")
    parser.add_argument("--hold", type=float, nargs=2, default=(2.0, 6.0),
                        help="seconds a process stays stopped / an agent or the control plane stays away")
    parser.add_argument("--cases", type=int, default=6, help="how many of the prompt cases to use (smoke: fewer)")
    parser.add_argument("--stall-bound", type=float, default=20.0)
    parser.add_argument("--streams-must-survive", action="store_true",
                        help="an answer broken by a fault (an error event in its stream, a dropped connection) is a "
                             "violation: with stage faults only, every answer in flight pauses and resumes")
    parser.add_argument("--min-target", type=float, default=5.0)
    parser.add_argument("--time-targets", choices=("enforce", "report"), default="enforce",
                        help="count a recovery slower than its target as a violation, or only report it "
                             "(the smoke test: a measured time on a loaded machine is not a failure)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    assert all(k in FAULTS for k in kinds + [k for k in args.sequence.split(",") if k]), FAULTS
    from orchestrator.models.demo import cached_demo_model

    rng = random.Random(args.seed)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(tmp)
        stack = Stack(root)
        run = Run(stack, rng, tuple(args.hold))
        clients = monitor = None
        aborted: list[str] = []
        try:
            stack.start(cached_demo_model("float32"))
            cold = run.launch()
            target = max(0.4 * cold, args.min_target)
            solo = solo_answers(stack.router_url, MODEL_ID, args.cases)
            clients = Clients(stack.router_url, MODEL_ID, solo, args.clients, args.seed).start()
            monitor = Monitor(clients, stack.router_url, args.stall_bound).start()
            t0 = time.monotonic()
            sequence = [k for k in args.sequence.split(",") if k]
            try:
                while time.monotonic() - t0 < args.duration and (not args.sequence or sequence):
                    time.sleep(rng.uniform(*args.gap))
                    kind = sequence.pop(0) if args.sequence else rng.choice(kinds)
                    # the session keeps only its last faults: a new one is told by its time, not the count
                    faults_before = last_fault_at(stack.orch.state.session(run.session_id))
                    fault = run.inject(kind, time.monotonic() - t0)
                    run.faults.append(fault)
                    run.settle(fault, time.monotonic() if fault.away else t0 + fault.at, faults_before)
                    print(f"[{time.monotonic() - t0:6.1f} s] {fault.kind} {fault.target}: {fault.outcome} "
                          f"{fault.seconds or 0:.1f} s {fault.detail}", flush=True)
            except Exception as exc:  # noqa: BLE001 (reported as a violation; cleanup and report still run)
                aborted.append(f"run aborted: {type(exc).__name__}: {exc}")
            elapsed = time.monotonic() - t0
        finally:
            if monitor is not None:
                monitor.stop()
            if clients is not None:
                clients.stop()
            # Only ports this run listened on: others' tests may take any other port meanwhile.
            router = [stack.router.port] if stack.router is not None else []
            ports = [a.port for a in stack.agents] + router + sorted(run.ports)
            stack.stop()
        left = leftovers(stack, root, ports)
    violations = print_report(args, (load0, os.getloadavg()[0]), cold, target, run, clients, monitor, aborted + left,
                        elapsed)
    return 1 if violations else 0


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack: a stuck run shows where
    logs.setup("chaos", "WARNING")  # the control plane's warnings (recoveries, teardowns) with their reasons
    raise SystemExit(main())
