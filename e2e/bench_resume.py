"""The pause a client sees when a stage dies mid-answer, against a cold launch of the same cluster.

SmolLM2-135M-Instruct (float32) in two stages on this machine. Each round: launch cold (from nothing
to a ready /health), stream one greedy answer, `kill -9` the last stage after AFTER chunks, start it
again on its address at once (as an operator or the control plane would), and time:

- pause: from the kill to the next token the client receives;
- regeneration: the part of the pause spent generating again what the client had (the coordinator's
  `request.resuming` to `request.resumed` log lines), the rest being the stage's start and the probe;
- the same tokens' decode in the undisturbed run (first to AFTER-th chunk), so that regeneration ÷
  decode, taken within one round, says what the resume's replay costs against decoding them, whatever
  the machine's load does between rounds.

The stages run as co-located stages do when local agents start them (`--threads 1 --solo-threads
<cores>`: one BLAS thread each, every core for a lone request's steps); `--threads 0` leaves
OpenBLAS its own count in every stage.

Prints one table with the medians and spreads over the rounds; the answer is checked equal to the
undisturbed one every round. A script, not a test: it measures, it asserts only exactness.

    .venv/bin/python e2e/bench_resume.py [--rounds 3] [--after 40] [--tokens 160]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.engine.local_pipeline import LocalPipeline, compute_split
from orchestrator.models.demo import cached_demo_model
from tests.support.resume import chat_answer

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def stream(cluster: LocalPipeline, tokens: int, on_chunk=None) -> tuple[str, list[float]]:
    """The answer's text and when each chunk arrived (time.monotonic)."""
    times: list[float] = []

    def arrived(n: int) -> None:
        times.append(time.monotonic())
        if on_chunk is not None:
            on_chunk(n)

    body = {"model": cluster.model_dir.name, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens, "temperature": 0}
    return chat_answer(cluster, body, arrived)["content"], times


def logged_at(log: Path, event: str) -> float | None:
    """The wall-clock time (seconds of the day) of the last line logging `event`."""
    found = None
    for line in log.read_text(errors="replace").splitlines():
        if f" {event} " in line or line.rstrip().endswith(f" {event}"):
            m = re.match(r"(\d\d):(\d\d):(\d\d\.\d+)", line)
            if m:
                found = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
    return found


def one_round(model: Path, root: Path, after: int, tokens: int, threads: int) -> dict:
    config = json.loads((model / "config.json").read_text())
    cluster = LocalPipeline(root, model, compute_split(config, 2), threads=threads or None,
                            solo_threads=(os.cpu_count() or 1) if threads else None)
    started = time.monotonic()
    cluster.start()
    cold = time.monotonic() - started
    try:
        undisturbed, first_run = stream(cluster, tokens)
        killed: dict[str, float] = {}

        def on_chunk(n: int) -> None:
            if n == after:
                killed["at"] = time.monotonic()
                cluster.kill("stage-1", signal.SIGKILL)
                threading.Thread(target=cluster.respawn, args=("stage-1",), daemon=True).start()

        text, times = stream(cluster, tokens, on_chunk)
        assert text == undisturbed, "the resumed answer differs from the undisturbed one"
        pause = next(t for t in times if t > killed["at"]) - killed["at"]
        log = root / "coordinator.log"
        resuming, resumed = logged_at(log, "request.resuming"), logged_at(log, "request.resumed")
        regen = (resumed - resuming) if resuming is not None and resumed is not None else float("nan")
        return {"cold": cold, "pause": pause, "regen": regen, "decode": first_run[after - 1] - first_run[0]}
    finally:
        cluster.stop()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--after", type=int, default=40, help="chunks received before the kill")
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per stage (0: OpenBLAS's own)")
    args = parser.parse_args(argv)
    model = cached_demo_model("float32")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        for k in range(args.rounds):
            rows.append(one_round(model, Path(tmp) / f"r{k}", args.after, args.tokens, args.threads))
            print(f"round {k + 1}: {rows[-1]}", flush=True)
    cold, pause, regen, decode = ([r[key] for r in rows] for key in ("cold", "pause", "regen", "decode"))
    print(f"\n| what (SmolLM2-135M f32, 2 stages, kill -9 of the last stage after {args.after} tokens) "
          f"| median (min–max) of {args.rounds} |")
    print("|---|---|")
    print(f"| cold launch, s | {spread(cold)} |")
    print(f"| pause (kill → next token), s | {spread(pause)} |")
    print(f"| pause ÷ cold launch | {spread([p / c for p, c in zip(pause, cold)])} |")
    print(f"| regeneration of the {args.after} tokens the client had, s | {spread(regen)} |")
    print(f"| regeneration's share of the pause | {spread([g / p for g, p in zip(regen, pause)])} |")
    print(f"| the same tokens' decode in the undisturbed run, s | {spread(decode)} |")
    print(f"| regeneration ÷ that decode | {spread([g / d for g, d in zip(regen, decode)])} |")
    print("\nevery resumed answer equal to its undisturbed run: yes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
