"""Recovery vs cold launch: how long from `kill -9` of one process to Healthy again, against
launching the same cluster from nothing (SmolLM2-135M-Instruct, two stages over two local
agents, coordinator on the first). Prints a table and where the recovery time goes.

    .venv/bin/python e2e/bench_recovery.py [--rounds 3]

Target: recovery <= 0.4 x cold launch. A script, not a test: it measures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from e2e.fault_stack import Stack


class Steps:
    """Records when each timeline step started and finished, as the events arrive."""

    def __init__(self, stack: Stack) -> None:
        self.events = stack.orch.subscribe()
        self.log: list[tuple[float, object]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        while not self._stop.is_set():
            try:
                self.log.append((time.monotonic(), self.events.get(timeout=0.1)))
            except queue.Empty:
                pass

    def took(self, session_id: str) -> dict[str, list[float]]:
        """Seconds each step took (running -> done)."""
        time.sleep(0.3)
        self._stop.set()
        started, took = {}, {}
        for t, e in self.log:
            if getattr(e, "session_id", None) != session_id or e.kind != "launch_stepped":
                continue
            key = e.key.split(".", 2)[-1] if e.key.startswith("recovery-") else e.key
            if e.state == "running":
                started[key] = t
            elif e.state == "done" and key in started:
                took.setdefault(key, []).append(t - started.pop(key))
        return took


def cold_launch(stack: Stack) -> tuple[float, dict[str, list[float]], str]:
    steps = Steps(stack)
    t0 = time.monotonic()
    s = stack.launch()
    s = stack.wait_healthy(s.id)
    took = time.monotonic() - t0
    assert s.health == "Healthy", s.reason
    return took, steps.took(s.id), s.id


def recover(stack: Stack, session_id: str, victim: str) -> tuple[float, float, dict[str, list[float]]]:
    """(kill -> Healthy, kill -> fault seen, per-step seconds)."""
    before = stack.processes(session_id)
    steps = Steps(stack)
    faults = len(stack.orch.state.session(session_id).faults)
    t0 = time.monotonic()
    os.kill(before[victim], signal.SIGKILL)
    stack.orch.wait(lambda st: len(st.session(session_id).faults) > faults, 60)
    seen = time.monotonic() - t0
    st = stack.orch.wait(lambda st: st.session(session_id).phase != "recovering"
                         and st.session(session_id).faults[-1].outcome != "recovering", 300)
    took = time.monotonic() - t0
    s = st.session(session_id)
    assert s.health == "Healthy", s.reason
    after = stack.processes(session_id)
    kept = all(after.get(k) == v for k, v in before.items() if k != victim)
    assert kept and after[victim] != before[victim], (before, after)
    return took, seen, steps.took(session_id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from orchestrator.models.demo import cached_demo_model

    model = cached_demo_model("float32")
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        stack = Stack(Path(tmp))
        try:
            stack.start(model)
            colds, cold_steps = [], {}
            for _ in range(args.rounds):
                took, steps, sid = cold_launch(stack)
                colds.append(took)
                for k, v in steps.items():
                    cold_steps.setdefault(k, []).extend(v)
                stack.orch.stop_session(sid)
                stack.orch.wait(lambda st: not st.sessions, 60)
            _, _, sid = cold_launch(stack)
            rows, detail = [], {}
            for victim in ("stage-0", "stage-1", "coordinator"):
                times, seen = [], []
                for _ in range(args.rounds):
                    took, detected, steps = recover(stack, sid, victim)
                    times.append(took)
                    seen.append(detected)
                    for k, v in steps.items():
                        detail.setdefault(victim, {}).setdefault(k, []).extend(v)
                rows.append((victim, statistics.median(times), min(times), max(times), statistics.median(seen)))
        finally:
            stack.stop()
    cold = statistics.median(colds)
    print(f"\ncold launch (2 stages + coordinator + router), median of {len(colds)}: {cold:.2f} s "
          f"(min {min(colds):.2f}, max {max(colds):.2f})")
    print("  steps: " + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in cold_steps.items()))
    print("\n| killed (kill -9) | kill -> Healthy, median | min | max | kill -> fault seen | vs cold launch "
          "| target <= 0.4 |")
    print("|---|---|---|---|---|---|---|")
    for victim, med, lo, hi, det in rows:
        ratio = med / cold
        print(f"| {victim} | {med:.2f} s | {lo:.2f} s | {hi:.2f} s | {det:.2f} s | {ratio:.2f} | "
              f"{'pass' if ratio <= 0.4 else 'FAIL'} |")
    print("\nwhere a recovery's time goes (median seconds per step):")
    for victim, steps in detail.items():
        print(f"  {victim}: " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in steps.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
