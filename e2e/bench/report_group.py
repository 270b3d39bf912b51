"""The tables of one group (one model, one BLAS): throughput, memory, where a token's time
goes, micro-batch steps at 4 requests, wire bytes, and the targets with their verdicts."""

from __future__ import annotations

import os

from e2e.bench.plan import FRAME_SLACK, RETURN_MAX, T_AGG4, T_DECODE1, T_TTFT, System
from e2e.bench.stats import best_ratio, fmt, median, mib, paired_ratio, spread


def group_report(g: dict, title: str, max_seconds: float) -> list[str]:
    """Markdown of one group; also stores the verdicts in g["targets"]."""
    systems: list[System] = g["systems"]
    ref = next(s for s in systems if s.kind == "single" and s.primary)
    n = g["noise"]
    lines = [
        f"## {title} — {g['blas']} BLAS",
        "",
        f"Split {' / '.join(f'layers {a}-{b}' for a, b in g['splits'])}; {g['tokens']} tokens per request; "
        f"{g['repeats']} round(s); TTFT prompt {g.get('prompt_tokens')} tokens. Other load on the machine during the "
        f"measurements: {n['other_cores']:.2f} of {os.cpu_count()} cores busy with other processes "
        f"(ours: {n['own_cores']:.2f}).",
        "",
    ]
    lines += _throughput(systems, ref)
    lines += _memory(systems, ref)
    lines += _profile(systems)
    lines += _wire(g, systems)
    lines += _targets(g, systems, ref)
    cuts = [s.label for s in systems if s.results.get("cut")]
    if cuts:
        lines += [f"Note: decode measurements of {', '.join(cuts)} were cut at --max-seconds "
                  f"({max_seconds:g} s; rates use the tokens received).", ""]
    stops = [(s.label, s.results["early_stop"]) for s in systems if s.results.get("early_stop")]
    if stops:
        lines += [f"Note: some requests ended before max_tokens: {stops}", ""]
    return lines


def _throughput(systems: list[System], ref: System) -> list[str]:
    lines = [
        "| system | BLAS threads/process | decode ×1 tok/s | ×1 vs single (best rounds) | aggregate ×2 tok/s "
        "| aggregate ×4 tok/s | ×4 vs own ×1 (best) | TTFT s | TTFT vs single (best) | RSS MiB (per process) "
        "| same tokens | other load (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in systems:
        r = s.results
        d1 = r.get("decode1", [])
        if s.kind == "single":
            agg2 = agg4 = "= ×1 (one at a time)"
            agg_ratio = "1.00"
        else:
            agg2, agg4 = spread(r.get("agg2", [])), spread(r.get("agg4", []))
            agg_ratio = fmt(best_ratio(r.get("agg4", []), d1))
        ttft = r.get("ttft", [])
        mem = r.get("memory", {}).get("processes", {})
        if s.kind == "pipeline":
            rss = " + ".join(f"{k.replace('stage-', 's')}: {mib(v['rss'])}" for k, v in mem.items())
            rss += f" = {mib(sum(v['rss'] or 0 for v in mem.values()))}"
        else:
            rss = mib(mem.get("single", {}).get("rss"))
        lines.append(
            f"| {s.label}{' **(target pair)**' if s.primary else ''} | {s.threads} | {spread(d1)} | "
            f"{fmt(best_ratio(d1, ref.results.get('decode1', [])))} | {agg2} | {agg4} | {agg_ratio} | "
            f"{spread(ttft, 3)} | {fmt(best_ratio(ttft, ref.results.get('ttft', []), True))} | {rss} | "
            f"{'yes' if r.get('same_tokens') else 'NO'} | {fmt(median(r.get('other_cores', [])))} |")
    return lines + [""]


def _memory(systems: list[System], ref: System) -> list[str]:
    lines = ["Memory (MiB): resident now / peak / weights held.", "",
             "| system | process | RSS | peak RSS | weights |", "|---|---|---|---|---|"]
    for s in systems:
        for name, v in s.results.get("memory", {}).get("processes", {}).items():
            lines.append(f"| {s.label} | {name} | {mib(v['rss'])} | {mib(v['hwm'])} | {mib(v.get('weights'))} |")
    lines.append("")
    single_rss = ref.results.get("memory", {}).get("processes", {}).get("single", {}).get("rss")
    for s in systems:
        procs = s.results.get("memory", {}).get("processes", {})
        stages = [v["rss"] for k, v in procs.items() if k.startswith("stage-") and v.get("rss")]
        if s.kind == "pipeline" and stages and single_rss:
            total = sum(v["rss"] or 0 for v in procs.values())
            lines.append(f"- {s.label}: largest stage {100 * max(stages) / single_rss:.0f}% of the single process's "
                         f"RSS; all pipeline processes together {100 * total / single_rss:.0f}%.")
    return lines + [""]


def _profile(systems: list[System]) -> list[str]:
    lines = ["Where one token's time goes at 1 request (a separate 48-token decode per system: median and mean "
             "token interval; pipeline stage compute = `step_ms` from GET /health, an EMA of the last steps; "
             "overhead = mean interval − sum of stage compute = transport, coordinator, HTTP and Python between "
             "steps; CPU ms per token of each process from /proc, all its threads — more CPU than wall time "
             "means BLAS threads spinning):", "",
             "| system | token interval ms: median / mean | stage compute ms | overhead ms/token | "
             "CPU ms/token per process |",
             "|---|---|---|---|---|"]
    for s in systems:
        prof = s.results.get("profile")
        if not prof:
            continue
        cpu = ", ".join(f"{k}: {fmt(v, 1)}" for k, v in prof["cpu_ms"].items())
        steps = " + ".join(fmt(x, 1) for x in prof.get("step_ms", [])) or "–"
        lines.append(f"| {s.label} | {fmt(prof['interval_ms'], 1)} / {fmt(prof.get('mean_interval_ms'), 1)} "
                     f"| {steps} | "
                     f"{fmt(prof.get('overhead_ms'), 1) if 'overhead_ms' in prof else '–'} | {cpu} |")
    lines.append("")
    busy = [s for s in systems if s.kind == "pipeline" and s.results.get("busy_stages")]
    if busy:
        lines += ["At 4 concurrent requests (last round): each stage's compute per step and its micro-batch size "
                  "(the scheduler keeps one group per stage in flight, so 4 requests run as 2 groups of 2; one "
                  "full cycle of all requests costs about 2 × the slower stage's step):", "",
                  "| system | stage step ms (micro-batch) | predicted ×4 tok/s = 4 / (2 × slowest step) "
                  "| measured ×4 |",
                  "|---|---|---|---|"]
        for s in busy:
            last = s.results["busy_stages"][-1]
            slow = max((x[0] or 0) for x in last)
            pred = 4000 / (2 * slow) if slow else float("nan")
            lines.append(f"| {s.label} | {' + '.join(f'{fmt(ms, 1)} (×{b})' for ms, b in last)} | {fmt(pred, 1)} | "
                         f"{fmt(s.results.get('agg4', [float('nan')])[-1], 1)} |")
        lines.append("")
    return lines


def _elem_bytes(g: dict) -> tuple[int, int]:
    cfg = g["config"]
    return int(cfg["hidden_size"]), 4 if cfg.get("torch_dtype", "float32") == "float32" else 2


def _wire(g: dict, systems: list[System]) -> list[str]:
    hidden, elem = _elem_bytes(g)
    lines = [f"Wire bytes per decode token (hidden {hidden} × {elem} bytes = {hidden * elem}; frame header 36):", "",
             "| system | stage-0→stage-1 bytes/token | segments/token | stage-1→coordinator bytes/token | "
             "segments/token |", "|---|---|---|---|---|"]
    for s in systems:
        if s.kind != "pipeline":
            continue
        w = s.results.get("wire", {})
        lines.append(f"| {s.label} | {fmt(w.get('fwd_bytes_per_token'), 1)} | {fmt(w.get('fwd_segs_per_token'))} | "
                     f"{fmt(w.get('ret_bytes_per_token'), 1)} | {fmt(w.get('ret_segs_per_token'))} |")
    return lines + [""]


def _targets(g: dict, systems: list[System], ref: System) -> list[str]:
    hidden, elem = _elem_bytes(g)
    lines = [f"Targets (each pipeline configuration against the reference: {ref.label}):", "",
             "| pipeline | target | measured (best rounds) | per-round ratio, median | result |",
             "|---|---|---|---|---|"]
    g["targets"] = []
    rd1, rttft = ref.results.get("decode1", []), ref.results.get("ttft", [])
    for s in (x for x in systems if x.kind == "pipeline"):
        r = s.results
        d1, agg4, ttft, wire = r.get("decode1", []), r.get("agg4", []), r.get("ttft", []), r.get("wire", {})
        checks = [
            (f"decode ×1 ≥ {T_DECODE1}× single", best_ratio(d1, rd1), median(paired_ratio(d1, rd1)),
             lambda v: v >= T_DECODE1, 2),
            (f"aggregate ×4 ≥ {T_AGG4}× own ×1", best_ratio(agg4, d1), median(paired_ratio(agg4, d1)),
             lambda v: v >= T_AGG4, 2),
            (f"TTFT ≤ {T_TTFT}× single", best_ratio(ttft, rttft, True), median(paired_ratio(ttft, rttft)),
             lambda v: v <= T_TTFT, 2),
            (f"bytes/token/boundary ≤ {hidden * elem + FRAME_SLACK}", wire.get("fwd_bytes_per_token"), None,
             lambda v: v <= hidden * elem + FRAME_SLACK, 1),
            (f"return path ≤ {RETURN_MAX} bytes/token", wire.get("ret_bytes_per_token"), None,
             lambda v: v <= RETURN_MAX, 1),
        ]
        for name, value, paired, ok, digits in checks:
            verdict = "n/a" if value is None or value != value else ("PASS" if ok(value) else "MISS")
            g["targets"].append((s.label, name, value, verdict))
            lines.append(f"| {s.label} | {name} | {fmt(value, digits)} | "
                         f"{fmt(paired, digits) if paired is not None else '–'} | {verdict} |")
        singles = [x for x in systems if x.kind == "single"]
        if len(singles) > 1:
            best = [max(vals) for vals in zip(*[x.results.get("decode1", []) for x in singles])]
            lines.append(f"| {s.label} | (info) decode ×1 vs the faster single-process configuration of each round | "
                         f"{fmt(max(d1) / max(best) if d1 and best else float('nan'))} | "
                         f"{fmt(median(paired_ratio(d1, best)))} | – |")
    return lines + [""]
