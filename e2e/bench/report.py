"""Rendering: the Markdown report of a benchmark run (docs/benchmark.md), from the records
that `measure.Bench.run_group` and `family_rows.run_family_rows` return. Pure formatting,
apart from `machine_info`, which reads /proc and the installed versions.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
from pathlib import Path
from typing import Any

from e2e.bench.models import LLAMA1B
from e2e.bench.plan import FRAME_SLACK, RETURN_MAX, T_AGG4, T_DECODE1, T_TTFT, System
from e2e.bench.report_group import group_report
from e2e.bench.stats import best_ratio, fmt, median, mib, paired_ratio, spread

VERSIONED = ("mlx", "mlx-cpu", "mlx-lm", "cmeel-openblas", "numpy", "transformers")


def machine_info() -> dict[str, Any]:
    """CPU, memory, kernel, Python and package versions of this machine."""
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = 0
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass

    def ver(pkg: str) -> str:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"

    return {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu": cpu, "mem_gib": mem / 2**30,
            "kernel": platform.release(), "python": platform.python_version(),
            "versions": {p: ver(p) for p in VERSIONED}}


def method_lines(blas_cfg: str | None) -> list[str]:
    """How the numbers were taken (the report's bullet list after the header)."""
    return [
        f"- BLAS: OpenBLAS (the `cmeel-openblas` wheel's, or Debian's where that one cannot run) preloaded by "
        "`orchestrator.engine.blas.preload()` "
        f"({blas_cfg or 'config n/a'}), or the `mlx-cpu` wheel's reference BLAS with "
        "`PIPESERVE_BLAS=reference`. Each process's BLAS threads are set by `OPENBLAS_NUM_THREADS`.",
        "- Method: every system of a group is started once and measured in turn, round by round "
        "(order rotated each round); numbers are medians over rounds, (min–max) when there are several. "
        "Ratios and target verdicts use each system's best round (another user's load only ever slows a "
        "measurement down, and it does not hit the systems of a round evenly: see 'other load', the cores "
        "other processes used during each system's measurements); the median of the per-round ratios is "
        "shown next to each target. Before each round the run waits up to `--quiet-wait` seconds for other "
        "users' processes to take under 0.3 cores.",
        "- Single process = `mlx_lm.generate.generate_step` in a worker process (no HTTP). It serves one request "
        "at a time, so its aggregate decode rate at 2 or 4 concurrent requests equals its 1-request rate: "
        "that is what the pipeline's aggregate is compared with.",
        "- Pipeline = `LocalPipeline` (2 stage processes + coordinator, prompt cache off), requests through "
        "`POST /v1/completions` "
        "(token-id prompt, temperature 0, `stream: true`, `logprobs: 0` so every token is one event) from client "
        "threads. Decode tok/s of a request = 1 / its median inter-token interval (robust to another user's "
        "burst; all systems alike); aggregate at N requests = the sum over the N requests (each gets one token "
        "per pass through the pipeline). Mean-based figures are in the JSON output. TTFT = request sent → "
        "first token received (single process: call → first token).",
        "- To measure an engine change side by side with this checkout: `--variant "
        "pipeline:1:PYTHONPATH=/path/to/patched/checkout[,ENV=VALUE...]` (children run from a neutral directory "
        "with this checkout on PYTHONPATH unless a variant overrides it).",
        "",
    ]


def targets_lines() -> list[str]:
    """The closing "Reading the targets" section."""
    return [
        "## Reading the targets",
        "",
        f"- decode ×1 ≥ {T_DECODE1}× the single process with the same total cores (2 BLAS threads, the whole "
        "machine, vs 1 thread per stage);",
        f"- pipeline aggregate at 4 requests ≥ {T_AGG4}× pipeline at 1 request;",
        f"- TTFT (512-token prompt) ≤ {T_TTFT}× the single process;",
        f"- bytes per decode token per boundary ≤ hidden × element size + {FRAME_SLACK}; return path ≤ {RETURN_MAX} "
        "bytes per token. Bytes are TCP payload bytes counted by the kernel (`ss -ti` bytes_sent) on the "
        "stage-0→stage-1 socket and on the stage-1→coordinator socket, as the marginal cost of decode tokens "
        "(two requests of different length, same prompt), PONG bytes removed from the return path.",
        "",
    ]


def group_title(g: dict) -> str:
    """A group's model, in words."""
    if g["model"] == "smollm2":
        return "SmolLM2-135M-Instruct (float32)"
    return "random Llama ~1B (float32; " + ", ".join(f"{k} {v}" for k, v in LLAMA1B.items()) + ")"


def family_section(rec: dict, max_seconds: float) -> list[str]:
    """The family rows: c1, c4 and c4/c1 per model, next to single-process mlx-lm."""
    n = rec["noise"]
    conc = rec["concurrency"]
    lines = [
        "## Model families — 2-stage pipeline as the demo runs it",
        "",
        f"Random-weight models built by `orchestrator.testmodels.families.build_family_model` with mlx-lm's own "
        f"classes, reshaped like published models (`e2e/bench/models.py`: hidden 1024, 16 query heads of 64 over "
        f"4 KV heads, 6 layers, vocabulary 32000, tied head). Pipeline = 2 stages × 1 BLAS thread, all cores when "
        f"SOLO (what the demo runs); reference = single-process mlx-lm with {os.cpu_count()} BLAS threads. "
        f"{rec['tokens']} tokens per request, random 12-token prompts, {rec['repeats']} round(s); all rows' processes "
        f"up at once and measured in turn (rows rotated each round). c1 = decode tok/s of one request; c{conc} = "
        f"aggregate tok/s of {conc} concurrent requests; c{conc}/c1 from each system's best round, then the median "
        f"of the per-round ratios. Other load on the machine during these measurements: {n['other_cores']:.2f} of "
        f"{os.cpu_count()} cores busy with other processes (ours: {n['own_cores']:.2f}).",
        "",
        f"| model | weights MiB | split | single-process c1 tok/s | pipeline c1 tok/s | c1 vs single (best) | "
        f"pipeline c{conc} tok/s | **c{conc}/c1** (best) | c{conc}/c1 per round, median | stage step ms at "
        f"c{conc} (micro-batch) | same tokens | other load (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cut = []
    for r in rec["rows"]:
        single, pipe = (next(s for s in r["systems"] if s.kind == k) for k in ("single", "pipeline"))
        c1, c4, ref = pipe.results.get("decode1", []), pipe.results.get(f"agg{conc}", []), \
            single.results.get("decode1", [])
        weights = single.results.get("memory", {}).get("processes", {}).get("single", {}).get("weights")
        busy = (pipe.results.get("busy_stages") or [[]])[-1]
        other = median([x for s in r["systems"] for x in s.results.get("other_cores", [])])
        lines.append(
            f"| {r['row'].label} | {mib(weights)} | {' / '.join(f'{a}–{b}' for a, b in r['splits'])} | {spread(ref)} | "
            f"{spread(c1)} | {fmt(best_ratio(c1, ref))} | {spread(c4)} | **{fmt(best_ratio(c4, c1))}** | "
            f"{fmt(median(paired_ratio(c4, c1)))} | {' + '.join(f'{fmt(ms, 1)} (×{b})' for ms, b in busy) or 'n/a'} | "
            f"{'yes' if pipe.results.get('same_tokens') else 'NO'} | {fmt(other)} |")
        cut += [s.label + f" ({r['row'].key})" for s in r["systems"] if s.results.get("cut")]
    lines.append("")
    if cut:
        lines += [f"Note: decode measurements of {', '.join(cut)} were cut at --max-seconds ({max_seconds:g} s; "
                  "rates use the tokens received).", ""]
    return lines


def render(command: str, started: str, elapsed: float, info: dict, groups: list[dict],
           families: dict | None, args: Any) -> str:
    """The whole Markdown report."""
    lines = [
        "# Benchmark: 2-stage pipeline vs single-process mlx-lm",
        "",
        f"Generated by `{command}` on {started} UTC in {elapsed / 60:.1f} min"
        + (" (**--quick**: fewer tokens, rounds and systems)" if args.quick else "") + ".",
        "",
        f"- Machine: {info['nproc']} CPUs ({info['cpu']}), {info['mem_gib']:.0f} GiB RAM, Linux {info['kernel']}, "
        f"Python {info['python']}; shared with other users (see 'other load' per group).",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ".",
    ]
    systems: list[System] = [s for g in groups for s in g["systems"]]
    if families:
        systems += [s for r in families["rows"] for s in r["systems"]]
    blas_cfg = next((s.handle.info.get("openblas", {}).get("config") for s in systems
                     if s.kind == "single" and s.handle and s.handle.info.get("openblas")), None)
    lines += method_lines(blas_cfg)
    for g in groups:
        lines += group_report(g, group_title(g), args.max_seconds)
    if families:
        lines += family_section(families, args.max_seconds)
    lines += targets_lines()
    return "\n".join(lines) + "\n"
