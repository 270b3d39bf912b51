"""`make bench`: the emulated-node benchmark's command line (`e2e/bench_nodes.py [options]`).

Each emulated node is one core of this machine (node k = core k), each process one BLAS thread;
see `e2e.bench.nodes` for what is measured and `e2e.bench.nodes_report` for the targets. The
default sizes are the issue's (4096-token TTFT prompt, 512-token prompts with 24-token answers at
4 and 8 requests, 3 rounds); `--quick` shrinks them for a shared 2-core machine (its report says
so), `--smoke` runs a tiny model in seconds (the test `e2e/bench/test_nodes.py`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from e2e.bench.node_models import MODELS
from e2e.bench.nodes import METRICS, NodeBench, Sizes
from e2e.bench.nodes_report import render
from e2e.bench.procs import ROOT
from e2e.bench.report import machine_info

FULL = Sizes(rounds=3, ttft_tokens=4096, prompt_tokens=512, short_answer=24, long_answer=64)
QUICK = Sizes(rounds=2, ttft_tokens=1024, prompt_tokens=128, short_answer=16, long_answer=32)
SMOKE = Sizes(rounds=1, ttft_tokens=64, prompt_tokens=16, short_answer=4, long_answer=6)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def parser() -> argparse.ArgumentParser:
    """The options."""
    p = argparse.ArgumentParser(description="2 emulated nodes (one core each) against one node, with the peers")
    p.add_argument("--models", default="smollm2,qwen2-l16h1024", help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--quick", action="store_true", help=f"smaller sizes for a shared 2-core machine: {QUICK}")
    p.add_argument("--smoke", action="store_true", help="the tiny qwen2 model, one round, tiny sizes (a test)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3, quick 2)")
    p.add_argument("--ttft-tokens", type=int, help="long prompt of the TTFT (default 4096, quick 1024)")
    p.add_argument("--prompt-tokens", type=int, help="prompt of each concurrent request (default 512, quick 128)")
    p.add_argument("--short-answer", type=int, help="tokens per concurrent answer (default 24, quick 16)")
    p.add_argument("--long-answer", type=int, help="decode ×1 and long answers (default 64, quick 32)")
    p.add_argument("--no-peers", action="store_true", help="skip mlx-lm's pipeline")
    p.add_argument("--prefill-batch", action="store_true",
                   help="also pipeserve with PIPESERVE_PREFILL_BATCH=batched, at 4 and 8 requests (a row beside exact; "
                   "with the pipelined cut unless --no-prefill-chunks)")
    p.add_argument("--prefill-chunks", action=argparse.BooleanOptionalAction, default=True,
                   help="also pipeserve with PIPESERVE_PREFILL_CHUNKS=pipelined, its TTFT beside the default cut "
                   "(on unless --no-prefill-chunks)")
    p.add_argument("--metrics", default=",".join(METRICS),
                   help=f"comma list of the metrics to take (default all: {','.join(METRICS)})")
    p.add_argument("--no-prediction", action="store_true",
                   help="skip the plan's prediction (the layers timed on one core before each model's rounds)")
    p.add_argument("--link", default="", help="pipeserve's stages in network namespaces joined by this emulated "
                   "link (e2e/lan/profiles.py; root only); the peers stay on loopback")
    p.add_argument("--out", help="also write the Markdown report here")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--workdir", default="/tmp/pipeserve-bench-nodes", help="logs of the processes")
    return p


def sizes(args: argparse.Namespace) -> Sizes:
    """The sizes: the mode's, with any given option instead."""
    base = SMOKE if args.smoke else QUICK if args.quick else FULL
    given = {k: getattr(args, k) for k in asdict(base) if getattr(args, k) is not None}
    return Sizes(**{**asdict(base), **given})


def prepare(model: str) -> Path:
    """The model's directory, generated once (in a subprocess: this one never imports MLX)."""
    res = subprocess.run([sys.executable, "-m", "e2e.bench.node_models", model], capture_output=True, text=True,
                         cwd=ROOT)
    if res.returncode:
        raise RuntimeError(f"preparing {model} failed:\n{res.stderr[-3000:]}")
    return Path(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Run; print the report (and write it with --out). Returns the exit status."""
    args = parser().parse_args(argv)
    command = " ".join(shlex.quote(a) for a in ["e2e/bench_nodes.py", *(sys.argv[1:] if argv is None else argv)])
    sz = sizes(args)
    models = ["qwen2-tiny"] if args.smoke else [m.strip() for m in args.models.split(",") if m.strip()]
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)  # stop every started process on the way out
    info = machine_info()
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    load0 = os.getloadavg()
    paths = {m: prepare(m) for m in models}
    with ExitStack() as around:
        lan = None
        if args.link:
            from e2e.lan.netns import Lan, joined, unavailable
            from e2e.lan.profiles import PROFILES

            if unavailable() or args.link not in PROFILES:
                raise SystemExit(f"--link {args.link}: {unavailable() or f'choose from {list(PROFILES)}'}")
            lan = around.enter_context(Lan(PROFILES[args.link], 2))
            around.enter_context(joined(lan.control))  # this thread, its threads and children talk over the bridge
        bench = NodeBench(sz, Path(args.workdir).resolve(), peers=not args.no_peers, lan=lan,
                           batched=args.prefill_batch, pipelined=args.prefill_chunks,
                           metrics=tuple(m.strip() for m in args.metrics.split(",") if m.strip() in METRICS),
                           prediction=not args.no_prediction)
        print(f"bench: 2 emulated nodes = cores {bench.cores} of {info['nproc']} ({info['cpu']}); load {load0}")
        runs = [bench.run_model(m, paths[m]) for m in models]
    link = f"; pipeserve over the emulated {args.link} link" if args.link else ""
    mode = "--smoke" if args.smoke else "--quick" if args.quick else "full sizes"
    header = [
        f"Generated by `{command}` ({mode}: {sz.rounds} round(s), {sz.ttft_tokens}-token TTFT prompt, "
        f"{sz.prompt_tokens}-token prompts with {sz.short_answer}-token answers at 4 and 8, {sz.long_answer}-token "
        f"long answers{link}) on {started:%Y-%m-%d %H:%M} UTC in {(time.monotonic() - t0) / 60:.1f} min.",
        "",
        f"- Machine: {info['nproc']} CPUs ({info['cpu']}), Linux {info['kernel']}, Python {info['python']}; "
        f"each emulated node is one core (cores {bench.cores}); shared with other users (load average "
        f"{load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end).",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ".",
        "- One BLAS thread per process (OpenBLAS: the stages load it, the peers get it by `LD_PRELOAD`); "
        "one node = `mlx_lm.server` on core 0; figures are medians (min–max) over interleaved rounds; "
        "ratios are taken round by round between systems measured side by side.",
    ]
    text = render(runs, header)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "sizes": asdict(r.sizes)} for r in runs], indent=1))
    return 0
