"""The benchmark's command line: `.venv/bin/python e2e/bench_pipeline.py [options]`.

Usage: e2e/bench_pipeline.py [--quick] [--models smollm2,llama1b] [--families llama,qwen3_moe,llama-q4|none]
       [--no-reference-blas] [--repeats N] [--tokens N] [--systems ...] [--variant ...]
       [--max-seconds S] [--out docs/benchmark-history.md] [--json raw.json]

A/B of an engine change, side by side in one run:
  e2e/bench_pipeline.py --no-reference-blas --systems single2,pipe1 --families none \\
      --variant pipeline:1:PYTHONPATH=/path/to/patched/checkout,PIPESERVE_SOLO_THREADS=2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from e2e.bench.family_rows import run_family_rows
from e2e.bench.measure import Bench
from e2e.bench.models import FAMILY_ROWS
from e2e.bench.plan import SYSTEM_KEYS
from e2e.bench.procs import ROOT
from e2e.bench.report import machine_info, render


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def parser() -> argparse.ArgumentParser:
    """The options."""
    p = argparse.ArgumentParser(description="2-stage pipeline vs single-process mlx-lm, side by side")
    p.add_argument("--quick", action="store_true", help="short run for development: 1 round, 24 tokens, "
                   "fewer systems, no reference-BLAS group")
    p.add_argument("--models", default="smollm2", help="comma list of smollm2, llama1b (default smollm2; "
                   "llama1b, a random ~1B float32 model generated once into the cache, adds ~6 min and ~8 GB)")
    p.add_argument("--families", default=",".join(r.key for r in FAMILY_ROWS),
                   help="family rows, comma list of " + ", ".join(r.key for r in FAMILY_ROWS)
                   + " (default all), or none")
    p.add_argument("--no-reference-blas", action="store_true", help="skip the PIPESERVE_BLAS=reference group")
    p.add_argument("--repeats", type=int, default=None, help="rounds per group (default 3, quick 1)")
    p.add_argument("--tokens", type=int, default=None, help="decode tokens per request (default 32, quick 24; "
                   "family rows 3/4 of it)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="TTFT prompt length (default 512)")
    p.add_argument("--max-seconds", type=float, default=12.0, help="cut a decode measurement after this long "
                   "(keeping at least 8 tokens), so a slow configuration cannot stretch the run (default 12)")
    p.add_argument("--quiet-wait", type=float, default=60.0, help="before each round, wait up to this many "
                   "seconds for other users' load to drop below 0.3 cores (default 60; 0: never wait)")
    p.add_argument("--split", choices=["balanced", "even"], default="balanced",
                   help="layer split: balanced by compute incl. the head (local.compute_split), or even")
    p.add_argument("--systems", default=None, help=f"comma list from {','.join(SYSTEM_KEYS)} "
                   "(default: all for SmolLM2; single2,pipe1,pipesolo with --quick or other models)")
    p.add_argument("--variant", action="append", default=[], metavar="KIND:THREADS[:K=V,...]",
                   help="add a system, e.g. pipeline:2:OPENBLAS_THREAD_TIMEOUT=20, "
                   "pipeline:1:cluster.prefill_step_size=128, or pipeline:1:PYTHONPATH=/other/checkout to "
                   "measure another engine tree side by side (repeatable)")
    p.add_argument("--full", action="store_true", help="no shortcuts: every round of TTFT with the reference "
                   "BLAS, all rounds for llama1b, llama1b with the reference BLAS too (very slow)")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmark-history.md"), help="Markdown report path")
    p.add_argument("--json", default=None, help="also write raw results as JSON here")
    p.add_argument("--workdir", default="/tmp/pipeserve-bench", help="logs of the processes")
    return p


BEGIN = "<!-- `make bench` writes from here... -->"
END = "<!-- ...to here; what follows is kept across runs -->"


def merged(old: str | None, report: str) -> str:
    """The report file after a run: `report` between BEGIN and END, everything outside them kept
    (the hand-written runs and analyses below the generated part). A file without the markers keeps
    its old text after the new report rather than losing it."""
    block = f"{BEGIN}\n{report.rstrip()}\n{END}\n"
    if not old:
        return block
    if BEGIN in old and END in old.split(BEGIN, 1)[1]:
        before, rest = old.split(BEGIN, 1)
        return before + block + "\n" + rest.split(END, 1)[1].lstrip("\n")
    return block + "\n" + old


def raw_results(groups: list[dict], families: dict | None) -> list[dict]:
    """The JSON form of the records (systems flattened to their results)."""
    def systems(items: list) -> list[dict]:
        return [{"key": s.key, "model": s.model, "label": s.label, "threads": s.threads, "env": s.env,
                 "results": s.results} for s in items]

    out = [{**{k: v for k, v in g.items() if k != "systems"}, "systems": systems(g["systems"])} for g in groups]
    if families:
        out.append({"family_rows": [{**{k: v for k, v in r.items() if k != "systems"},
                                     "row": r["row"].key, "systems": systems(r["systems"])}
                                    for r in families["rows"]],
                    **{k: v for k, v in families.items() if k != "rows"}})
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print and write the report. Returns the exit status."""
    args = parser().parse_args(argv)
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "e2e/bench_pipeline.py",
                                                 *(sys.argv[1:] if argv is None else argv)])
    args.out = str(Path(args.out).resolve())
    args.json = str(Path(args.json).resolve()) if args.json else None
    args.workdir = str(Path(args.workdir).resolve())
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.tokens = args.tokens or (24 if args.quick else 32)
    families = [] if args.families in ("", "none") else [f.strip() for f in args.families.split(",") if f.strip()]
    signal.signal(signal.SIGTERM, _interrupt)  # stop every started process on the way out
    if shutil.which("ss") is None:
        print("bench: `ss` (iproute2) is needed for the wire-byte measurement", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    # Children run `python -m orchestrator.cli` from a neutral directory with this checkout on
    # PYTHONPATH, so that a --variant can set PYTHONPATH to another engine tree (A/B of a patch).
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    os.chdir(args.workdir)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    bench = Bench(args)
    info = machine_info()
    print(f"bench: {info['nproc']} CPUs ({info['cpu']}); load average {os.getloadavg()}")
    groups = []
    blases = ["openblas"] + ([] if (args.no_reference_blas or args.quick) else ["reference"])
    for model in (m.strip() for m in args.models.split(",") if m.strip()):
        for blas in blases:
            if blas == "reference" and model != "smollm2" and not args.full:
                print(f"bench: skipping {model} with the reference BLAS (minutes per prompt; --full runs it)")
                continue
            groups.append(bench.run_group(model, blas))
    rows = run_family_rows(bench, families) if families else None
    text = render(command, started.strftime("%Y-%m-%d %H:%M"), time.monotonic() - t0, info, groups, rows, args)
    print("\n" + text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(merged(out.read_text() if out.exists() else None, text))
    print(f"bench: wrote {out}")
    if args.json:
        Path(args.json).write_text(json.dumps(raw_results(groups, rows), indent=1, default=str))
    return 0
