"""The LAN benchmark on random models and links: `python -m e2e.lan.bench_lan --random N --seed S`.

For each pair drawn by random_pairs.py: `pipeserve make-test-model` writes the model, its
layers are timed on this machine, it is served split in two over an emulated link of that
RTT and line rate (bench_lan.run_profile), and the planner's prediction is set beside each
measurement: decode at 1, 4 and 16 requests and the time to first token of a 1k prompt.
Prints one row per pair as it is measured, then the table and the share of predictions
within ±20 %.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from e2e.lan.netns import REPO
from e2e.lan.random_pairs import TOLERANCE, Pair, draw, share_within

REQUESTS = (4, 16)
VOCAB = 512


def make_model(pair: Pair, root: Path, seed: int) -> Path:
    """The pair's model, written by the product's own command."""
    out = root / f"model-{pair.index}"
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "make-test-model", str(out), "--layers",
                    str(pair.layers), "--hidden", str(pair.hidden), "--heads", str(pair.heads), "--kv-heads",
                    str(pair.kv_heads), "--vocab", str(VOCAB), "--seed", str(seed + pair.index)],
                   check=True, cwd=REPO, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return out


def figures(row: dict) -> list[tuple[float | None, float]]:
    """(measured, predicted) of the four compared figures of one row."""
    p = row["pred"]
    return [(row["decode1"], p.decode_tps_1), *((row[f"agg{n}"], p.aggregate(n)) for n in REQUESTS),
            (row["ttft1024"], p.ttft(1024))]


def _pair_text(measured: float | None, predicted: float) -> str:
    if measured is None:
        return f"– / {predicted:.2f}"
    return f"{measured:.2f} / {predicted:.2f} ({100 * (predicted - measured) / measured:+.0f} %)"


def table(rows: list[dict]) -> str:
    """Markdown: per pair, measured / predicted (error) of every compared figure."""
    out = ["| # | model | link drawn (RTT, cap) | link measured | decode ×1 tok/s | ×4 | ×16 | TTFT 1k s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pair: Pair = r["pair"]
        link = f"{r['link'].rtt_ms:.2f} ms, {r['link'].bandwidth_Bps * 8 / 1e9:.2f} Gbit/s"
        cells = " | ".join(_pair_text(m, p) for m, p in figures(r))
        out.append(f"| {pair.index} (load {r['load']:.1f}) | {pair.label} | {pair.link.name} | {link} | {cells} |")
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    inside, compared = share_within(f for r in rows for f in figures(r))
    share = 100 * inside / compared if compared else 0.0
    return f"within ±{TOLERANCE:.0%}: {inside} of {compared} predicted figures ({share:.0f} %)"


def run_random(n: int, seed: int) -> int:
    """Draw, build, measure and print; 0 when every pair ran."""
    from e2e.lan.bench_lan import run_profile

    pairs = draw(n, seed)
    load = os.getloadavg()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for pair in pairs:
            model = make_model(pair, root, seed)
            logs = root / f"logs-{pair.index}"
            logs.mkdir()
            eos = json.loads((model / "config.json").read_text()).get("eos_token_id", 2)
            row = run_profile(pair.link.name, model, False, logs, profile=pair.link, split=pair.split,
                              hidden_bytes=pair.hidden * 4, requests=REQUESTS, vocab=VOCAB,
                              extra={"logit_bias": {str(e): -100 for e in (eos if isinstance(eos, list) else [eos])}})
            rows.append({**row, "pair": pair})
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\n--random {n} --seed {seed}: measured / predicted (prediction error); load average before "
          f"{load[0]:.1f}, after {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print(table(rows))
    print(f"\n{summary(rows)}")
    return 0
