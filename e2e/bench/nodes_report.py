"""The emulated-node benchmark's report: raw figures per system, and ONE table of the targets
(issue 41, item 3), each with its figure (the median of per-round ratios, measured side by side)
and spread (min–max over rounds), met or missed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from e2e.bench.node_models import describe
from e2e.bench.nodes import CONCURRENCY, ModelRun
from e2e.bench.stats import fmt, median, paired_ratio, spread

T_TTFT = 0.6        # long-prompt TTFT <= 0.6 x one node
T_DECODE1 = 0.95    # decode at 1 request >= 0.95 x one node
T_AGG = 1.5         # aggregate at 4 and 8 (short answers after real prompts) >= 1.5 x one node's batched
T_LONG = 1.9        # aggregate at 4 and 8 with long answers >= 1.9 x the pipeline's single request
T_PEER1 = 1.5       # pipeserve >= 1.5 x mlx-lm's pipeline at 1 request
T_PEERN = 1.25      # ... and >= 1.25 x at 4 and 8
T_PLAN = 0.20       # the plan's predicted figures within +-20 % of these measurements


@dataclass
class Target:
    """One target row: a ratio of two systems' metrics, round by round."""

    name: str
    num: tuple[str, str]
    den: tuple[str, str]
    ok: Callable[[float], bool]


def targets(run: ModelRun) -> list[Target]:
    """The targets of item 3 that this run can judge."""
    ttft = f"long-prompt TTFT ({run.sizes.ttft_tokens} tokens) ≤ {T_TTFT} × one node"
    out = [Target(ttft, ("pipeserve", "ttft"), ("node", "ttft"), lambda v: v <= T_TTFT)]
    if "pipelined" in run.results:
        out.append(Target(ttft + ", pipelined prefill", ("pipelined", "ttft"), ("node", "ttft"), lambda v: v <= T_TTFT))
    out.append(Target(f"decode at 1 request ≥ {T_DECODE1} × one node", ("pipeserve", "decode1"), ("node", "decode1"),
                      lambda v: v >= T_DECODE1))
    for c in CONCURRENCY:
        agg = f"aggregate at {c} (short answers after real prompts) ≥ {T_AGG} × one node's batched"
        out.append(Target(agg, ("pipeserve", f"agg{c}"), ("node", f"agg{c}"), lambda v: v >= T_AGG))
        if run.results.get("pipelined", {}).get(f"agg{c}"):
            out.append(Target(agg + ", pipelined prefill", ("pipelined", f"agg{c}"), ("node", f"agg{c}"),
                              lambda v: v >= T_AGG))
    for c in CONCURRENCY:
        out.append(Target(f"aggregate at {c}, long answers ≥ {T_LONG} × the pipeline at 1 request",
                          ("pipeserve", f"long{c}"), ("pipeserve", "decode1"), lambda v: v >= T_LONG))
    if "mlxpipe" in run.results:
        out.append(Target(f"÷ mlx-lm's pipeline at 1 request ≥ {T_PEER1}", ("pipeserve", "decode1"),
                          ("mlxpipe", "decode1"), lambda v: v >= T_PEER1))
        for c in CONCURRENCY:
            out.append(Target(f"÷ mlx-lm's pipeline at {c} requests ≥ {T_PEERN}", ("pipeserve", f"agg{c}"),
                              ("mlxpipe", f"agg{c}"), lambda v: v >= T_PEERN))
    return out


def ratios(run: ModelRun, t: Target) -> list[float]:
    """The target's ratio in each round."""
    get = run.results.get
    return paired_ratio(get(t.num[0], {}).get(t.num[1], []), get(t.den[0], {}).get(t.den[1], []))


def verdict(values: list[float], ok: Callable[[float], bool]) -> str:
    """met / missed on the median of the rounds; 'spread crosses' when rounds fall on both sides."""
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    word = "**met**" if ok(median(values)) else "**missed**"
    return word + (" (rounds on both sides)" if len({ok(v) for v in values}) > 1 else "")


def info_rows(run: ModelRun) -> list[tuple[str, list[float]]]:
    """Ratios shown without a target: the peers against one node, TTFT against mlx-lm's pipeline, and
    (--prefill-batch) pipeserve's batched prefill against one node and against its exact default."""
    get = run.results.get
    rows = []
    if "mlxpipe" in run.results:
        rows.append(("(info) TTFT ÷ mlx-lm's pipeline", paired_ratio(get("pipeserve", {}).get("ttft", []),
                                                                  get("mlxpipe", {}).get("ttft", []))))
        for metric, what in (("ttft", "TTFT"), ("decode1", "decode ×1"), ("agg4", "aggregate ×4"),
                             ("agg8", "aggregate ×8")):
            rows.append((f"(info) mlx-lm's pipeline ÷ one node, {what}",
                         paired_ratio(get("mlxpipe", {}).get(metric, []), get("node", {}).get(metric, []))))
    if "pipelined" in run.results:
        rows.append(("(info) pipelined prefill ÷ the mlx cut (pipeserve's default), TTFT",
                     paired_ratio(get("pipelined", {}).get("ttft", []), get("pipeserve", {}).get("ttft", []))))
    if "batched" in run.results:
        for c in CONCURRENCY:
            rows.append((f"(info) batched prefill ÷ one node's batched, aggregate ×{c}",
                         paired_ratio(get("batched", {}).get(f"agg{c}", []), get("node", {}).get(f"agg{c}", []))))
            rows.append((f"(info) batched prefill ÷ exact (pipeserve's default), aggregate ×{c}",
                         paired_ratio(get("batched", {}).get(f"agg{c}", []), get("pipeserve", {}).get(f"agg{c}", []))))
            rows.append((f"(info) batched prefill ÷ exact, ×{c} long answers",
                         paired_ratio(get("batched", {}).get(f"long{c}", []),
                                      get("pipeserve", {}).get(f"long{c}", []))))
    return rows


def targets_table(runs: list[ModelRun]) -> list[str]:
    """ONE table: every target for every model, figure (median of per-round ratios), spread, verdict."""
    lines = ["| model | target | figure: median (min–max) of rounds | rounds | met? |", "|---|---|---|---|---|"]
    for run in runs:
        for t in targets(run):
            values = ratios(run, t)
            lines.append(f"| {run.model} | {t.name} | {spread(values)} | {len(values)} | {verdict(values, t.ok)} |")
        for name, values in info_rows(run):
            lines.append(f"| {run.model} | {name} | {spread(values)} | {len(values)} | – |")
        lines.append(f"| {run.model} | the plan's predicted figures within ±{T_PLAN:.0%} of these | "
                     f"{prediction_figure(run)} |")
    return lines + [""]


# (the prediction's figure, the system and metric measured against it, in words)
PREDICTED = (("decode1", "pipeserve", "decode1", "decode ×1"),
             *((f"long{c}", "pipeserve", f"long{c}", f"×{c} long answers") for c in CONCURRENCY),
             ("ttft", "pipeserve", "ttft", "TTFT"), ("ttft_pipelined", "pipelined", "ttft", "TTFT, pipelined prefill"))


def prediction_errors(run: ModelRun) -> list[tuple[str, float, float]]:
    """(what, the measured median, predicted) of each predicted figure this run measured."""
    if run.prediction is None:
        return []
    got = run.prediction.figures
    return [(what, median(run.results[key][metric]), got[figure]) for figure, key, metric, what in PREDICTED
            if run.results.get(key, {}).get(metric) and figure in got]


def prediction_figure(run: ModelRun) -> str:
    """The target row's figure, rounds and verdict: how many predicted figures fall within ±20 % of
    pipeserve's measured medians, each 'measured / predicted (error)'."""
    if run.prediction is None:
        return "not measured (--no-prediction, or an emulated link: the prediction assumes loopback) | – | n/a"
    errors = prediction_errors(run)
    if not errors:
        return "none of the predicted figures measured | – | n/a"
    within = [abs(p - m) <= T_PLAN * m for _, m, p in errors]
    each = "; ".join(f"{what} {m:.2f} / {p:.2f} ({100 * (p - m) / m:+.0f} %)" for what, m, p in errors)
    doubt = f"; timing doubted: {run.prediction.doubt}" if run.prediction.doubt else ""
    rounds = len(run.results["pipeserve"].get("decode1", []))
    return (f"{sum(within)} of {len(within)} within (measured median / predicted: {each}{doubt}) | {rounds} | "
            + ("**met**" if all(within) else "**missed**"))


def figures_table(run: ModelRun) -> list[str]:
    """Each system's raw figures: median (min–max) over rounds."""
    sz = run.sizes
    cols = [("ttft", f"TTFT s ({sz.ttft_tokens} tok)", 2), ("decode1", "decode ×1 tok/s", 2)]
    cols += [(f"agg{c}", f"×{c} tok/s ({sz.prompt_tokens}-tok prompts, {sz.short_answer}-tok answers)", 2)
             for c in CONCURRENCY]
    cols += [(f"long{c}", f"×{c} long answers ({sz.long_answer} tok), decode tok/s", 2) for c in CONCURRENCY]
    lines = ["| system | pinning (cores) | BLAS | " + " | ".join(c[1] for c in cols) + " |",
             "|---" * (3 + len(cols)) + "|"]
    for key, label in run.labels.items():
        res = run.results.get(key, {})
        lines.append(f"| {label} | {run.pinning.get(key, '')} | {run.blas.get(key, '')} | "
                     + " | ".join(spread(res[m], d) if res.get(m) else "–" for m, _, d in cols) + " |")
    return lines + [""]


def render(runs: list[ModelRun], header: list[str]) -> str:
    """The whole Markdown report."""
    lines = [*header, "", "### Targets (2 emulated nodes against one)", ""]
    lines += targets_table(runs)
    for run in runs:
        splits = " / ".join(f"layers {a}–{b}" for a, b in run.splits)
        lines += [f"### {describe(run.model)}", "",
                  f"pipeserve's split {splits}; {run.sizes.rounds} interleaved round(s); other users' load during "
                  f"the rounds: {', '.join(fmt(x) for x in run.other_cores)} cores.", ""]
        lines += figures_table(run)
        lines += [f"- {n}" for n in run.notes] + ([""] if run.notes else [])
    return "\n".join(lines) + "\n"
