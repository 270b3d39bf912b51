"""Measuring: one group = one model and one BLAS, its systems started once and measured in
turn, round by round (order rotated each round), so that another user's load on this shared
machine falls on all of them alike. The family rows (`family_rows.py`) reuse the metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from e2e.bench.client import (
    aggregate_rate,
    aggregate_rate_window,
    decode_rate,
    decode_rate_mean,
    run_concurrent,
    stream_completion,
)
from e2e.bench.plan import System, systems_for
from e2e.bench.procs import PipelineSystem, ReferenceWorker, machine_cpu_seconds, own_cpu_seconds, prepare_model
from e2e.bench.worker import proc_status

PROMPT_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press. Before that, books were "
    "copied by hand, which made them rare and expensive. Within fifty years, presses were working in "
    "more than two hundred cities across Europe, and millions of books had been printed. "
)
# Before each round: wait until other users' processes take under QUIET_CORES cores
# (sampled over QUIET_SAMPLE_S seconds), for at most --quiet-wait seconds.
QUIET_CORES = 0.3
QUIET_SAMPLE_S = 2.0
DECODE_TOPICS = ("a lighthouse keeper", "the first railway", "a small mountain village", "an old clockmaker",
                 "a river in spring", "the invention of paper", "a long winter", "a quiet library")


def balanced_split(cfg: dict, mode: str = "balanced") -> list[tuple[int, int]]:
    """2-stage layer split: `local.compute_split` (compute incl. the head), or even by count.

    For a MoE model the per-layer cost counts the experts one token runs through
    (top-k x expert width), not the dense `intermediate_size` that compute_split reads."""
    from orchestrator.engine import local_pipeline as local
    if mode != "balanced":
        return local.even_split(int(cfg["num_hidden_layers"]), 2)
    active = dict(cfg)
    if cfg.get("moe_intermediate_size") and cfg.get("num_experts_per_tok"):
        active["intermediate_size"] = int(cfg["num_experts_per_tok"]) * int(cfg["moe_intermediate_size"])
    return local.compute_split(active, 2)


class Bench:
    """The measurements of one benchmark run (its options in `args`)."""

    def __init__(self, args: argparse.Namespace, log: Callable[[str], None] = print) -> None:
        self.args = args
        self.workroot = Path(args.workdir)
        self.log = log
        self.all_pids: list[int] = []

    # --- systems ------------------------------------------------------------------------
    def prompts(self, which: str, ref: ReferenceWorker | None, vocab: int) -> tuple[list[list[int]], list[int]]:
        """Decode prompts (one per concurrent request) and the long TTFT prompt."""
        n = self.args.prompt_tokens
        if which == "smollm2" and ref is not None:
            # This form makes SmolLM2 write on (no EOS within 128 tokens for any of these topics).
            decode = [ref.call("tokenize", text=f"Chapter 1. The story of {t}\n\nIt was")["ids"]
                      for t in DECODE_TOPICS]
            long_ids = ref.call("tokenize", text=PROMPT_TEXT * (1 + n // 40))["ids"]
            while len(long_ids) < n:
                long_ids += long_ids
            return decode, long_ids[:n]
        rng = random.Random(1234)  # random weights: random token ids are as good a prompt as any
        decode = [[rng.randrange(3, vocab) for _ in range(12)] for _ in DECODE_TOPICS]
        return decode, [rng.randrange(3, vocab) for _ in range(n)]

    def start(self, s: System, model_dir: Path, splits: list[tuple[int, int]], name: str, tag: str) -> None:
        """Start system `s` on `model_dir` (served as `name`); its logs go to workdir/tag/key."""
        workdir = self.workroot / tag / s.key
        workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if s.kind == "single":
            s.handle = ReferenceWorker(model_dir, s.env, workdir / "worker.log")
        else:
            # Prompt cache off: rounds repeat the same prompts, and a TTFT that reuses the last round's
            # prefill (0.2 s for 512 tokens against 3-5 s) is not the cold prefill the target compares.
            s.handle = PipelineSystem(model_dir, workdir, splits, s.threads, s.solo_threads, s.env, name,
                                      {"prompt_cache_bytes": 0, **s.cluster})
        self.log(f"  started {s.label} in {time.perf_counter() - t0:.1f} s")

    def watch(self, systems: list[System]) -> None:
        """Account CPU time of these systems' processes (and ours) as our own from now on."""
        self.all_pids = [p for s in systems for p in s.handle.procs.values()] + [os.getpid()]

    def load_during(self, fn: Callable[[], Any]) -> dict[str, float]:
        """Run fn; return the cores busy meanwhile: ours, other users', and the wall time."""
        m0, o0, w0 = machine_cpu_seconds(), own_cpu_seconds(self.all_pids), time.monotonic()
        fn()
        wall = time.monotonic() - w0
        busy, own = machine_cpu_seconds() - m0, own_cpu_seconds(self.all_pids) - o0
        return {"wall_s": wall, "busy_cores": busy / wall, "own_cores": own / wall,
                "other_cores": max(0.0, busy - own) / wall, "loadavg": os.getloadavg()}

    def wait_quiet(self) -> None:
        """Wait (up to --quiet-wait seconds) until other users take under QUIET_CORES cores.

        A round started in a calm moment is more likely to stay calm; the best-round ratios
        and the 'other load' column then show how far that worked."""
        deadline = time.monotonic() + self.args.quiet_wait
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            other = self.load_during(lambda: time.sleep(QUIET_SAMPLE_S))["other_cores"]
            if other < QUIET_CORES:
                break
        waited = time.monotonic() - t0
        if waited > 2 * QUIET_SAMPLE_S:
            self.log(f"  waited {waited:.0f} s for other load to drop below {QUIET_CORES} cores")

    def noisy(self, s: System, fn: Callable[..., None], *args: Any) -> None:
        """Run one measurement and record how many cores other users' processes took meanwhile."""
        s.add("other_cores", self.load_during(lambda: fn(*args))["other_cores"])

    # --- one group: one model, one BLAS, several systems side by side ----------------------
    def run_group(self, model: str, blas: str) -> dict:
        """Measure every system of the (model, blas) group; returns the group's record."""
        args = self.args
        model_dir = prepare_model(model)
        cfg = json.loads((model_dir / "config.json").read_text())
        splits = balanced_split(cfg, args.split)
        systems = systems_for(model, blas, args.systems, args.quick, args.variant)
        tokens = args.tokens if model == "smollm2" else max(8, args.tokens // 2)
        repeats, ttft_repeats = args.repeats, args.repeats
        if blas == "reference" and not args.full:
            # ~5 tok/s and ~35 s per 512-token prefill on this BLAS: one TTFT round, two rounds.
            tokens, repeats, ttft_repeats = min(tokens, 24), min(2, repeats), 1
        elif model != "smollm2" and not args.full:
            repeats = ttft_repeats = min(2, repeats)  # ~0.3-0.5 s per token
        self.log(f"\n## {model} / {blas} BLAS: split {splits}, {len(systems)} systems, {repeats} rounds, "
                 f"{tokens} tokens per request")
        group = {"model": model, "model_dir": str(model_dir), "blas": blas, "config": cfg, "splits": splits,
                 "tokens": tokens, "systems": systems, "repeats": repeats}
        try:
            for s in systems:
                self.start(s, model_dir, splits, model, f"{model}-{blas}")
            ref = next(s for s in systems if s.kind == "single")
            decode_prompts, long_prompt = self.prompts(model, ref.handle, int(cfg["vocab_size"]))
            group["prompt_tokens"] = len(long_prompt)
            for s in systems:  # warm up: allocate KV caches and buffers, fault in the weights
                self.decode1(s, decode_prompts[0], 4, record=False)
                self.ttft(s, long_prompt[: min(64, len(long_prompt))], record=False)
            self.watch(systems)

            def rounds() -> None:
                for r in range(repeats):
                    order = systems[r % len(systems):] + systems[: r % len(systems)]
                    order = order[::-1] if r % 2 else order
                    self.wait_quiet()
                    self.log(f"  round {r + 1}/{repeats}")
                    for s in order:
                        self.noisy(s, self.decode1, s, decode_prompts[0], tokens)
                    for conc in (2, 4):
                        for s in (x for x in order if x.kind == "pipeline"):
                            self.noisy(s, self.concurrent, s, decode_prompts[:conc], tokens)
                    if r < ttft_repeats:
                        for s in order:
                            self.noisy(s, self.ttft, s, long_prompt)

            group["noise"] = self.load_during(rounds)
            for s in systems:
                self.profile(s, decode_prompts[1], max(48, tokens))
                if s.kind == "pipeline":
                    self.wire(s, decode_prompts[0], tokens)
                self.memory(s)
            check_tokens(systems)
        finally:
            for s in systems:
                if s.handle is not None:
                    s.handle.stop()
        return group

    # --- metrics ------------------------------------------------------------------------
    def decode1(self, s: System, prompt: list[int], tokens: int, record: bool = True) -> None:
        """Decode tok/s of one request alone; keeps the tokens for `check_tokens`."""
        if s.kind == "single":
            res = s.handle.call("decode", prompt=prompt, max_tokens=tokens, max_seconds=self.args.max_seconds)
            times = res["times"]
            sample = {"texts": res["texts"], "logprobs": res["logprobs"], "ttft_short": times[0]}
            cut = res.get("cut")
        else:
            st = stream_completion(s.handle.port, s.handle.model_name, prompt, tokens,
                                   time.perf_counter() + self.args.max_seconds)
            times, cut = st.times, st.finish == "cut"
            sample = {"texts": st.texts, "logprobs": st.logprobs, "ttft_short": times[0] - st.t_submit,
                      "finish": st.finish}
            if st.finish not in ("length", "cut") and record:
                s.add("early_stop", [st.finish])
        if not record:
            return
        if cut:
            s.add("cut", 1)
        rate = decode_rate(times)
        s.add("decode1", rate)
        s.add("decode1_mean", decode_rate_mean(times))
        s.add("decode1_tokens", len(times))
        s.results["sample"] = [sample]
        self.log(f"    {s.label:70s} decode x1: {rate:6.2f} tok/s ({len(times)} tokens)")

    def concurrent(self, s: System, prompts: list[list[int]], tokens: int) -> None:
        """Aggregate decode tok/s of len(prompts) concurrent requests (pipelines only)."""
        streams = run_concurrent(s.handle.port, s.handle.model_name, prompts, tokens, self.args.max_seconds)
        rate = aggregate_rate(streams)
        ends = [st.finish for st in streams]
        s.add(f"agg{len(prompts)}", rate)
        s.add(f"agg{len(prompts)}_window", aggregate_rate_window(streams))
        if any(e not in ("length", "cut") for e in ends):
            s.add("early_stop", ends)
        if "cut" in ends:
            s.add("cut", 1)
        if len(prompts) == 4:
            time.sleep(0.6)  # the next PONG carries step_ms (EMA) and the micro-batch size of the last steps
            s.add("busy_stages", [(x.get("step_ms"), x.get("batch")) for x in s.handle.health().get("stages", [])])
        self.log(f"    {s.label:70s} aggregate x{len(prompts)}: {rate:6.2f} tok/s "
                 f"({sum(len(st.times) for st in streams)} tokens)")

    def ttft(self, s: System, prompt: list[int], record: bool = True) -> None:
        """Time to first token of `prompt` (request sent -> first token)."""
        if s.kind == "single":
            seconds = s.handle.call("ttft", prompt=prompt)["seconds"]
        else:
            st = stream_completion(s.handle.port, s.handle.model_name, prompt, 1)
            seconds = st.times[0] - st.t_submit
        if record:
            s.add("ttft", seconds)
            self.log(f"    {s.label:70s} TTFT {len(prompt)} tokens: {seconds:6.3f} s")

    def profile(self, s: System, prompt: list[int], tokens: int) -> None:
        """Where one token's time goes at 1 request: CPU time of every process per token
        (from /proc), and for the pipeline each stage's compute time per step (`step_ms`
        from GET /health, an EMA that this long decode has flushed of earlier prefills)."""
        procs = s.handle.procs
        cpu0 = {k: own_cpu_seconds([pid]) for k, pid in procs.items()}
        if s.kind == "single":
            times = s.handle.call("decode", prompt=prompt, max_tokens=tokens,
                                  max_seconds=self.args.max_seconds)["times"]
        else:
            times = stream_completion(s.handle.port, s.handle.model_name, prompt, tokens,
                                      time.perf_counter() + self.args.max_seconds).times
        cpu = {k: 1000 * (own_cpu_seconds([pid]) - cpu0[k]) / len(times) for k, pid in procs.items()}
        gaps = [b - a for a, b in zip(times, times[1:])]
        prof = {"interval_ms": 1000 * statistics.median(gaps), "mean_interval_ms": 1000 * statistics.fmean(gaps),
                "cpu_ms": cpu, "tokens": len(times)}
        if s.kind == "pipeline":
            time.sleep(0.7)  # the next PONG carries the stage stats of the last steps
            prof["step_ms"] = [float(x.get("step_ms", float("nan"))) for x in s.handle.health().get("stages", [])]
            # step_ms is an EMA (a mean), so compare it with the mean interval
            prof["overhead_ms"] = prof["mean_interval_ms"] - sum(prof["step_ms"])
        s.results["profile"] = prof

    def wire(self, s: System, prompt: list[int], tokens: int) -> None:
        """Bytes per decode token per boundary, from the kernel's socket counters.

        Two sequential requests with the same prompt and different lengths: the difference
        of the bytes divided by the difference of the tokens is the marginal cost of one
        decode token (prefill, OPEN and CLOSE cancel out). PONGs on the return path are
        subtracted using the PING count and the PONG size measured while idle.
        """
        h = s.handle
        idle0 = h.counters()
        time.sleep(1.6)
        idle1 = h.counters()
        pings_idle = (idle1["pings"] - idle0["pings"]) / 36
        pong = (idle1["ret_bytes"] - idle0["ret_bytes"]) / pings_idle if pings_idle else 0.0
        n1, n2 = 4, 4 + max(16, tokens // 2)
        settle = 0.3  # the CLOSE of the request just finished still travels stage 0 -> stage 1
        c0 = h.counters()
        a = stream_completion(h.port, h.model_name, prompt, n1)
        time.sleep(settle)
        c1 = h.counters()
        b = stream_completion(h.port, h.model_name, prompt, n2)
        time.sleep(settle)
        c2 = h.counters()
        dn = len(b.times) - len(a.times)
        d = {k: (c2[k] - c1[k]) - (c1[k] - c0[k]) for k in c0}
        pings = d["pings"] / 36
        s.results["wire"] = {"fwd_bytes_per_token": d["fwd_bytes"] / dn, "fwd_segs_per_token": d["fwd_segs"] / dn,
                             "ret_bytes_per_token": (d["ret_bytes"] - pings * pong) / dn,
                             "ret_segs_per_token": (d["ret_segs"] - pings) / dn, "pong_bytes": pong, "tokens": dn}

    def memory(self, s: System) -> None:
        """Resident and peak memory of every process, and the weight bytes each holds."""
        if s.kind == "single":
            m = s.handle.call("memory")
            s.results["memory"] = {"processes": {"single": {"rss": m.get("VmRSS"), "hwm": m.get("VmHWM"),
                                                            "weights": s.handle.info["weight_bytes"]}}}
            return
        stages = {x["id"]: x for x in s.handle.health().get("stages", [])}
        procs = {}
        for name, pid in s.handle.procs.items():
            st = proc_status(pid)
            procs[name] = {"rss": st.get("VmRSS"), "hwm": st.get("VmHWM"),
                           "weights": stages.get(name, {}).get("weight_bytes"),
                           "health_rss": stages.get(name, {}).get("rss_bytes")}
        s.results["memory"] = {"processes": procs}


def check_tokens(systems: list[System]) -> None:
    """Greedy output of every system must be the same tokens (same model, same prompt)."""
    base = None
    for s in systems:
        sample = (s.results.get("sample") or [None])[0]
        if sample is None:
            continue
        if base is None:
            base = sample
            s.results["same_tokens"] = True
            continue
        n = min(len(base["texts"]), len(sample["texts"]))
        s.results["same_tokens"] = base["texts"][:n] == sample["texts"][:n] and n > 0
