"""The family rows: decode at 1 request (c1) and aggregate at 4 concurrent requests (c4)
through the 2-stage pipeline the demo runs, for random-weight models of several mlx-lm
families shaped like published ones (`models.FAMILY_ROWS`), next to single-process mlx-lm
on the same model.

Every row's systems are started at once and measured round by round, rows and systems in
rotated order, so that the machine's other load falls on all rows alike; c4/c1 compares a
pipeline with itself, measured minutes apart at most.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e.bench.client import run_concurrent
from e2e.bench.measure import Bench, balanced_split, check_tokens
from e2e.bench.models import family_row
from e2e.bench.plan import System, catalogue
from e2e.bench.procs import prepare_model

CONCURRENCY = 4


def row_systems(key: str) -> list[System]:
    """A row's systems: single-process mlx-lm with every core (the reference) and the
    pipeline as the demo runs it (1 BLAS thread per stage, all cores when SOLO)."""
    named = catalogue("openblas")
    out = [named["single2"], named["pipesolo"]]
    for s in out:
        s.model = key
    return out


def run_family_rows(bench: Bench, keys: list[str]) -> dict[str, Any]:
    """Measure the named FAMILY_ROWS side by side; returns the record the report renders."""
    args = bench.args
    tokens = max(8, args.tokens * 3 // 4)  # the MoE row decodes at a few tok/s here
    rows: list[dict[str, Any]] = []
    for key in keys:  # generate first: building a model takes the CPU the measurements need
        model_dir = prepare_model(key)
        cfg = json.loads((model_dir / "config.json").read_text())
        rows.append({"row": family_row(key), "model_dir": str(model_dir), "config": cfg,
                     "splits": balanced_split(cfg, args.split), "systems": row_systems(key)})
    bench.log(f"\n## family rows: {', '.join(keys)}; {args.repeats} rounds, {tokens} tokens per request")
    record: dict[str, Any] = {"rows": rows, "tokens": tokens, "repeats": args.repeats, "concurrency": CONCURRENCY}
    everything = [s for r in rows for s in r["systems"]]
    try:
        for r in rows:
            for s in r["systems"]:
                bench.start(s, Path(r["model_dir"]), r["splits"], r["row"].key, f"family-{r['row'].key}")
            r["prompts"], _ = bench.prompts(r["row"].key, None, int(r["config"]["vocab_size"]))
            for s in r["systems"]:  # warm up, the batched decode path included
                bench.decode1(s, r["prompts"][0], 4, record=False)
                if s.kind == "pipeline":
                    run_concurrent(s.handle.port, s.handle.model_name, r["prompts"][:CONCURRENCY], 4)
        bench.watch(everything)

        def rounds() -> None:
            for n in range(args.repeats):
                order = rows[n % len(rows):] + rows[: n % len(rows)]
                bench.wait_quiet()
                bench.log(f"  round {n + 1}/{args.repeats}")
                for r in order:
                    systems = r["systems"][::-1] if n % 2 else r["systems"]
                    for s in systems:
                        bench.noisy(s, bench.decode1, s, r["prompts"][0], tokens)
                    pipe = next(s for s in systems if s.kind == "pipeline")
                    bench.noisy(pipe, bench.concurrent, pipe, r["prompts"][:CONCURRENCY], tokens)

        record["noise"] = bench.load_during(rounds)
        for r in rows:
            for s in r["systems"]:
                bench.memory(s)
            check_tokens(r["systems"])
    finally:
        for s in everything:
            if s.handle is not None:
                s.handle.stop()
    return record
