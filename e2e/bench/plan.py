"""What the benchmark measures: the targets, the systems under test and their catalogue.

A system is one configuration started once per group and measured round by round next to
the others: single-process mlx-lm with some BLAS threads, or a 2-stage `LocalPipeline`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

# Targets (ratios from the same run); see "Reading the targets" in docs/benchmark.md.
T_DECODE1 = 0.95   # pipeline decode, 1 request  >= 0.95 x single process (same total cores)
T_AGG4 = 2.0       # pipeline aggregate at 4 requests >= 2.0 x pipeline at 1 request
T_TTFT = 1.15      # pipeline TTFT <= 1.15 x single process
FRAME_SLACK = 64   # bytes per decode token per boundary <= hidden * elemsize + 64
RETURN_MAX = 64    # return path bytes per token <= 64

SYSTEM_KEYS = ("single2", "single1", "pipe1", "pipe2", "pipesolo")


@dataclass
class System:
    """One system under test and what was measured of it (lists: one entry per round)."""

    key: str
    kind: str                    # "single" | "pipeline"
    label: str
    threads: int                 # BLAS threads per process
    env: dict[str, str]
    primary: bool = False        # the same-total-cores pair the targets use
    solo_threads: int | None = None  # pipeline: BLAS threads of a step the coordinator marks SOLO
    cluster: dict[str, object] = field(default_factory=dict)  # pipeline: extra [cluster] keys
    model: str = ""              # family rows: which model (groups have one model for all)
    handle: Any = None
    results: dict[str, list] = field(default_factory=dict)

    def add(self, metric: str, value: Any) -> None:
        """Record one round's value of `metric`."""
        self.results.setdefault(metric, []).append(value)


def catalogue(blas: str) -> dict[str, System]:
    """The named systems of an OpenBLAS group (fresh objects: each group records its own)."""
    base = {"PIPESERVE_BLAS": blas}
    cores = os.cpu_count() or 1

    def env(threads: int) -> dict[str, str]:
        return {**base, "OPENBLAS_NUM_THREADS": str(threads)}

    return {
        "single2": System("single2", "single", "single-process mlx-lm, 2 BLAS threads", 2, env(2), primary=True),
        "single1": System("single1", "single", "single-process mlx-lm, 1 BLAS thread", 1, env(1)),
        "pipe1": System("pipe1", "pipeline", "pipeline, 2 stages × 1 BLAS thread", 1, env(1), primary=True),
        "pipe2": System("pipe2", "pipeline", "pipeline, 2 stages × 2 BLAS threads", 2, env(2)),
        # What the demo runs: 1 thread per stage, every core for a step nothing else competes
        # with (the coordinator's SOLO flag; agent.local.SHARED_HOST_BLAS).
        "pipesolo": System("pipesolo", "pipeline", "pipeline, 2 stages × 1 BLAS thread, all cores when SOLO", 1,
                           env(1), primary=True, solo_threads=cores),
    }


def reference_blas_systems() -> list[System]:
    """The pair of the reference-BLAS group: netlib's BLAS is single-threaded, so thread
    settings change nothing there."""
    env = {"PIPESERVE_BLAS": "reference", "OPENBLAS_NUM_THREADS": "1"}
    return [System("single", "single", "single-process mlx-lm (reference BLAS, 1 thread)", 1, dict(env), primary=True),
            System("pipe1", "pipeline", "pipeline, 2 stages (reference BLAS)", 1, dict(env), primary=True)]


def parse_variant(spec: str, base: dict[str, str], index: int) -> System:
    """--variant KIND:THREADS[:KEY=VALUE,...]: an extra system. KIND is single or pipeline;
    KEY=VALUE pairs are environment variables of its processes, except cluster.KEY=VALUE
    (a [cluster] key of the pipeline's TOML, e.g. cluster.prefill_step_size=128)."""
    parts = spec.split(":", 2)
    if len(parts) < 2 or parts[0] not in ("single", "pipeline") or not parts[1].isdigit():
        raise SystemExit(f"--variant {spec!r}: expected single|pipeline:THREADS[:KEY=VALUE,...]")
    kind, threads = parts[0], int(parts[1])
    env = {**base, "OPENBLAS_NUM_THREADS": str(threads)}
    cluster: dict[str, object] = {}
    for item in (parts[2].split(",") if len(parts) > 2 and parts[2] else []):
        key, _, value = item.partition("=")
        if key.startswith("cluster."):
            cluster[key[8:]] = int(value) if value.isdigit() else value
        else:
            env[key] = value
    extras = ", ".join(f"{k}={v}" for k, v in {**{k: v for k, v in env.items() if k not in base
                                                  and k != "OPENBLAS_NUM_THREADS"}, **cluster}.items())
    label = (f"pipeline, 2 stages × {threads} BLAS threads" if kind == "pipeline"
             else f"single-process mlx-lm, {threads} BLAS threads") + (f", {extras}" if extras else "")
    return System(f"var{index}", kind, label, threads, env, cluster=cluster)


def systems_for(model: str, blas: str, wanted: str | None, quick: bool, variants: list[str]) -> list[System]:
    """The systems of one group: `wanted` (a comma list of SYSTEM_KEYS) or the default for
    the model, plus the --variant systems."""
    if blas == "reference":
        return reference_blas_systems()
    named = catalogue(blas)
    if wanted:
        keys = wanted.split(",")
    elif model != "smollm2" or quick:
        keys = ["single2", "pipe1", "pipesolo"]  # the 2-threads-per-stage trap is shown on SmolLM2 already
    else:
        keys = list(named)
    unknown = [k for k in keys if k not in named]
    if unknown:
        raise SystemExit(f"unknown --systems {unknown}; choose from {list(named)}")
    out = [named[k] for k in keys]
    for spec in variants:
        out.append(parse_variant(spec, {"PIPESERVE_BLAS": blas}, len(out)))
    if not any(x.kind == "single" and x.primary for x in out):
        raise SystemExit("the run needs the reference system single2")
    return out
