"""How long a plan's prediction takes to be ready (issue 41 item 3): `.venv/bin/python -m e2e.bench_prediction`.

From "plan asked" (the control plane asks a node's agent for its timing of the model,
agent/compute.py) to "prediction ready" (the timing done and planner/predict.py run on it,
2 stages on loopback links), through the agent's own ComputeProfiler and timing process, on
this machine, in three ways per model:

- before: every layer of the body timed (the profiler's `--all-layers`), nothing cached, and
  the retries as they were (up to PIPESERVE_TIMING_TRIES while doubted, with no window): what a
  plan waited for before the few-layer timing, the retry window and the reuse;
- cold: the few layers that stand for all (families/layer_kinds.py), nothing cached;
- reused: another model id with the same family, shapes, dtype and backend, on the same agent
  state as the cold run (families/timing_key.py): no timing at all.

Each with the agent's retries while the busy-machine rule doubts a timing (PIPESERVE_TIMING_TRIES,
3 by default, 10 s apart, none starting 30 s after the first: agent/compute.RETRY_WINDOW_S), the
1-minute load average when it started, and the predicted decode tokens/s at 1 request from that
timing (before and cold should agree within the busy machine's noise). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from orchestrator import settings
from orchestrator.agent import compute
from orchestrator.agent.perf_schemas import ComputeProfile
from orchestrator.logs import EventLogger
from orchestrator.planner.perf_inputs import LayerTiming, LinkCost
from orchestrator.planner.predict import StageSpec, predict

LOOPBACK = LinkCost(rtt_ms=0.2, bandwidth_Bps=13.5e9 / 8)  # what e2e/lan measured on loopback
WAIT_S = 1800.0


class Models:
    """The one method of the agent's inventory the profiler uses, over a folder of links."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def model_dir(self, model_id: str) -> Path:
        return self.root / model_id


def _link_model(source: Path, target: Path) -> None:
    """`target` holds `source`'s files as symbolic links: another model id, the same bytes."""
    target.mkdir(parents=True)
    for f in source.iterdir():
        (target / f.name).symlink_to(f.resolve())


def _all_layers(model_dir: Path, out: Path) -> dict:
    """The timing process as it ran before: every layer of the body."""
    return compute.run_profile_process(model_dir, out, command=[
        sys.executable, "-m", "orchestrator.engine.profiling.layers", "--model", str(model_dir), "--out", str(out),
        "--all-layers"])


def _prediction_ready(profiler: compute.ComputeProfiler, model_id: str, layers: int, hidden: int) -> dict:
    """Ask for the model's timing, wait for it and predict from it: seconds, and what it was."""
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    status = profiler.start(model_id)
    while status.state == "running":
        if time.monotonic() - t0 > WAIT_S:
            raise RuntimeError(f"{model_id}: no timing after {WAIT_S:.0f} s")
        time.sleep(0.2)
        status = profiler.status(model_id)
    if status.state != "done" or status.profile is None:
        raise RuntimeError(f"{model_id}: {status.state} ({status.error})")
    p: ComputeProfile = status.profile
    timing = LayerTiming(**p.model_dump(exclude={"model_id", "threads", "at", "load", "cpus", "spread", "doubt",
                                                 "tries", "layers_timed", "reused_from"}))
    half = layers // 2
    stages = [StageSpec(label=f"stage {k}", node_name=f"node-{k}", layer_weight=w, last=k == 1, timing=timing)
              for k, w in enumerate((half, layers - half))]
    perf = predict(stages, [LOOPBACK, LOOPBACK], hidden * 4)
    return {"s": time.monotonic() - t0, "load": load, "tries": p.tries, "timed": p.layers_timed,
            "reused_from": p.reused_from, "doubt": p.doubt, "decode1": perf.decode_tps_1,
            "layer_ms": p.layer_ms_b1}


def run_model(name: str, model: Path, work: Path, log: EventLogger, before: bool) -> dict:
    """The before / cold / reused rows of one model."""
    from orchestrator.engine.stage.shard import ModelInfo

    info = ModelInfo.read(model)
    folder = work / name / "models"
    _link_model(model, folder / name)
    _link_model(model, folder / f"{name}-copy")
    out = {"model": name, "layers": info.num_layers}
    if before:
        old = compute.ComputeProfiler(Models(folder), work / name / "state-before", log, run=_all_layers,
                                      clock=lambda: 0.0)  # no retry window, as before it
        out["before"] = _prediction_ready(old, name, info.num_layers, info.hidden_size)
    new = compute.ComputeProfiler(Models(folder), work / name / "state", log,
                                  run=partial(compute.run_profile_process))
    out["cold"] = _prediction_ready(new, name, info.num_layers, info.hidden_size)
    out["reused"] = _prediction_ready(new, f"{name}-copy", info.num_layers, info.hidden_size)
    return out


def table(rows: list[dict]) -> str:
    """The Markdown table of `run_model`'s rows."""
    lines = ["| model | way | plan asked → prediction ready | load at start | tries | layers timed | "
             "layer ms (1 row) | predicted decode ×1 tok/s | doubt |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for way in ("before", "cold", "reused"):
            c = r.get(way)
            if c is None:
                continue
            timed = f"{c['timed']} of {r['layers'] - 1}" if c["timed"] else "–"
            if c["reused_from"]:
                timed = f"none (reused {c['reused_from']}'s)"
            label = {"before": "before: every layer", "cold": "cold: few layers", "reused": "reused: same shape"}
            lines.append(f"| {r['model']} | {label[way]} | **{c['s']:.1f} s** | {c['load']:.1f} | {c['tries']} | "
                         f"{timed} | {c['layer_ms']:.3f} | {c['decode1']:.2f} | {c['doubt'] or '–'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,qwen2-l16h1024",
                        help="comma list of e2e/bench/node_models.py's models")
    parser.add_argument("--no-before", action="store_true", help="skip the every-layer timing (minutes)")
    args = parser.parse_args(argv)
    from e2e.bench.node_models import prepare

    models = {name: prepare(name) for name in args.models.split(",")}
    start = os.getloadavg()
    t0 = time.monotonic()
    log = EventLogger("bench-prediction")
    work = Path(tempfile.mkdtemp(prefix="bench-prediction-"))
    try:
        rows = [run_model(name, path, work, log, not args.no_before) for name, path in models.items()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{os.cpu_count()} CPUs; load average {start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
          f"PIPESERVE_TIMING_TRIES={settings.TIMING_TRIES.read()}; {time.monotonic() - t0:.0f} s in all\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
