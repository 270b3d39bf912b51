"""The emulated-node benchmark (`make bench`): each node is one CPU core, and a 2-stage pipeline is
compared with ONE node, not with a process given the whole machine.

Per model, all systems are started once (`node_systems`: one node = `mlx_lm.server` on one core;
pipeserve, 2 stages on cores 0 and 1, the coordinator beside stage 0; mlx-lm's own pipeline, ranks
pinned alike, for qwen2 models) and measured in interleaved rounds (order rotated each round, each
metric taken for every system before the next metric), so that another user's load falls on all
of them alike. Every prompt is unique (a tag at its start), so no prompt cache serves a round from
the last one. Metrics per system and round:

* `ttft`: time to first token of one long prompt (`--ttft-tokens`, 4096);
* `decode1`: decode tok/s of one request (a short prompt, `--long-answer` tokens);
* `agg4`, `agg8`: completion tok/s of 4 / 8 concurrent requests, real prompts (`--prompt-tokens`)
  and short answers (`--short-answer`), first request sent to last token: as agents send them;
* `long4`, `long8` (pipeserve): the sum of the decode rates of 4 / 8 concurrent long answers.

Optional rows: `batched` (PIPESERVE_PREFILL_BATCH=batched, at 4 and 8 requests; with the pipelined
cut unless --no-prefill-chunks, which lets a batch flow through the stages in pieces) and `pipelined`
(PIPESERVE_PREFILL_CHUNKS=pipelined: TTFT and the aggregates after real prompts, whose prefills its
smaller chunks let the stages overlap sooner; its decode is the default's); `metrics` restricts a
run to some metrics (e.g. TTFT alone, whose 4096-token prefills take minutes per system).

Ratios are taken round by round between systems measured side by side; the report (`nodes_report`)
gives their median (min–max) and each target met or missed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from e2e.bench.node_models import describe, end_tokens, family
from e2e.bench.node_prediction import Prediction, predicted
from e2e.bench.node_systems import MlxPipeline, OneNode, Pipeserve, Server
from e2e.bench.openai_client import Answer, complete, concurrent, cut_short, decode_rates, throughput
from e2e.bench.pinning import node_cores
from e2e.bench.procs import machine_cpu_seconds, own_cpu_seconds

FILLER = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
          "movable metal type, oil-based ink and a wooden screw press. Before that, books were copied by hand, "
          "which made them rare and expensive. Within fifty years, presses worked in more than two hundred "
          "cities across Europe, and millions of books had been printed. ")
CONCURRENCY = (4, 8)
METRICS = ("ttft", "decode1", *(f"{k}{c}" for c in CONCURRENCY for k in ("agg", "long")))


@dataclass
class Sizes:
    """How much each measurement asks for."""

    rounds: int
    ttft_tokens: int
    prompt_tokens: int
    short_answer: int
    long_answer: int


@dataclass
class ModelRun:
    """One model's systems and what was measured of them: results[system key][metric] = one value per round."""

    model: str
    model_dir: str
    splits: list[tuple[int, int]]
    sizes: Sizes
    labels: dict[str, str] = field(default_factory=dict)
    pinning: dict[str, str] = field(default_factory=dict)
    blas: dict[str, str] = field(default_factory=dict)
    results: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    other_cores: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    prediction: Prediction | None = None  # the plan's figures for pipeserve's split (node_prediction)

    def add(self, key: str, metric: str, value: float) -> None:
        """Record one round's value."""
        self.results.setdefault(key, {}).setdefault(metric, []).append(value)


class Prompts:
    """Unique prompts of a given token count, built with the model's own tokenizer (no MLX here)."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.count = 0

    def make(self, tokens: int) -> str:
        """A prompt of about `tokens` tokens whose first tokens no other prompt of this run shares."""
        self.count += 1
        head = f"Request {self.count} of the benchmark, {time.monotonic_ns() % 10**6}. "
        text = head + FILLER * (1 + 2 * tokens // max(1, len(self.tok.encode(FILLER).ids)))
        ids = self.tok.encode(text, add_special_tokens=False).ids[: max(1, tokens - 2)]
        return self.tok.decode(ids)


class NodeBench:
    """Run the emulated-node benchmark for one model at a time."""

    def __init__(self, sizes: Sizes, workdir: Path, peers: bool = True, lan: Any = None,
                 log: Callable[[str], None] = print, batched: bool = False, pipelined: bool = False,
                 metrics: tuple[str, ...] = METRICS, prediction: bool = True) -> None:
        self.sizes, self.workdir, self.peers, self.lan, self.log = sizes, workdir, peers, lan, log
        # the plan's prediction beside the measurements (over loopback: not with an emulated link)
        self.prediction = prediction and lan is None
        self.batched = batched  # also pipeserve with PIPESERVE_PREFILL_BATCH=batched, at 4 and 8 requests
        self.pipelined = pipelined  # also pipeserve with PIPESERVE_PREFILL_CHUNKS=pipelined, TTFT and aggregates
        self.metrics = metrics  # the metrics taken (all by default)
        self.cores = node_cores(2)

    def start(self, model: str, model_dir: Path, run: ModelRun) -> list[Server]:
        """The model's systems, started and pinned."""
        work = self.workdir / model
        work.mkdir(parents=True, exist_ok=True)
        makers: list[tuple[str, Callable[[], Server]]] = [
            ("node", lambda: OneNode(model_dir, model, self.cores[0], work)),
            ("pipeserve", lambda: Pipeserve(model_dir, model, self.cores, work / "pipeserve", run.splits,
                                                 lan=self.lan)),
        ]
        if self.batched:
            makers.append(("batched", lambda: Pipeserve(model_dir, model, self.cores, work / "pipeserve-batched",
                                                        run.splits, lan=self.lan, batched=True,
                                                        pipelined=self.pipelined)))
        if self.pipelined:
            makers.append(("pipelined", lambda: Pipeserve(model_dir, model, self.cores, work / "pipeserve-pipelined",
                                                          run.splits, lan=self.lan, pipelined=True)))
        if self.peers and family(model) == "qwen2":
            makers.append(("mlxpipe", lambda: MlxPipeline(model_dir, model, self.cores, work)))
        elif self.peers:
            run.notes.append(f"mlx-lm's pipeline: not run ({family(model)}: mlx-lm 0.32 pipelines qwen2, "
                             "qwen3_moe, deepseek_v3 and a few others, not SmolLM2's llama)")
        systems: list[Server] = []
        try:
            for _key, make in makers:
                t0 = time.monotonic()
                s = make()
                systems.append(s)
                s.idle()
                self.log(f"  started {s.label} in {time.monotonic() - t0:.0f} s")
        except BaseException:
            for s in systems:
                s.stop()
            raise
        return systems

    def other_load(self, systems: list[Server], fn: Callable[[], None]) -> float:
        """Run fn; return the cores other users' processes took meanwhile."""
        pids = [p for s in systems for p in s.pids()] + [os.getpid()]
        m0, o0, w0 = machine_cpu_seconds(), own_cpu_seconds(pids), time.monotonic()
        fn()
        wall = time.monotonic() - w0
        return max(0.0, (machine_cpu_seconds() - m0) - (own_cpu_seconds(pids) - o0)) / wall

    def run_model(self, model: str, model_dir: Path) -> ModelRun:
        """Start the model's systems, measure them round by round, stop them."""
        from e2e.bench.measure import balanced_split

        cfg = json.loads((model_dir / "config.json").read_text())
        run = ModelRun(model, str(model_dir), balanced_split(cfg), self.sizes)
        self.log(f"\n## {describe(model)}: split {run.splits}")
        prompts = Prompts(model_dir)
        if self.prediction:  # before any system runs: the timing has the node's core to itself
            t0 = time.monotonic()
            run.prediction = predicted(model_dir, run.splits, self.cores[0], self.sizes.ttft_tokens)
            self.log(f"  layers timed on core {self.cores[0]} in {time.monotonic() - t0:.0f} s "
                     f"({run.prediction.timing}{'; doubted: ' + run.prediction.doubt if run.prediction.doubt else ''});"
                     f" predicted {', '.join(f'{k} {v:.2f}' for k, v in run.prediction.figures.items())}")
        systems = self.start(model, model_dir, run)
        sz = self.sizes
        try:
            for s in systems:
                run.labels[s.key], run.pinning[s.key], run.blas[s.key] = s.label, s.pinning(), s.blas()
                s.active()  # warm up: first compilations, buffers, the batch paths
                complete(s.port, s.model_name, prompts.make(32), 4, s.host)
                concurrent(s.port, s.model_name, [prompts.make(16) for _ in range(4)], 4, s.host)
                s.idle()
            alone = [s.key for s in systems if s.key not in ("batched", "pipelined")]  # the same path either way
            # Every answer runs to the length asked, in every system: the bench's models end an answer
            # early at random (2 of 8 long answers in one round of qwen2-l16h1024), which left fewer
            # requests decoding than the metric names, a different number in each system.
            bias = {t: -100.0 for t in end_tokens(model_dir)}
            short: dict[str, int] = {}

            def ask(s: Server, prompt_tokens: int, answer: int, n: int = 1) -> list[Answer]:
                answers = concurrent(s.port, s.model_name, [prompts.make(prompt_tokens) for _ in range(n)], answer,
                                     s.host, logit_bias=bias)
                short[s.key] = short.get(s.key, 0) + cut_short(answers, answer)
                return answers

            metrics: list[tuple[str, list[str], Callable[[Server], float]]] = [
                ("ttft", [s.key for s in systems if s.key != "batched"],
                 lambda s: complete(s.port, s.model_name, prompts.make(sz.ttft_tokens), 1, s.host).ttft),
                ("decode1", alone, lambda s: ask(s, 24, sz.long_answer)[0].decode_rate),
            ]
            many = [s.key for s in systems]
            for c in CONCURRENCY:
                metrics.append((f"agg{c}", many,
                                lambda s, c=c: throughput(ask(s, sz.prompt_tokens, sz.short_answer, c))))
                metrics.append((f"long{c}", ["pipeserve", "batched"],
                                lambda s, c=c: decode_rates(ask(s, 24, sz.long_answer, c))))
            metrics = [m for m in metrics if m[0] in self.metrics]
            for r in range(sz.rounds):
                order = systems[r % len(systems):] + systems[: r % len(systems)]
                order = order[::-1] if r % 2 else order
                self.log(f"  round {r + 1}/{sz.rounds}")

                def one_round(order: list[Server] = order) -> None:
                    for metric, keys, measure in metrics:
                        for s in (x for x in order if x.key in keys):
                            s.active()
                            try:
                                value = measure(s)
                            finally:
                                s.idle()
                            run.add(s.key, metric, value)
                            self.log(f"    {s.label:42s} {metric:8s} {value:8.3f}")

                run.other_cores.append(self.other_load(systems, one_round))
            run.notes += [f"{key}: {n} answers ended before the length asked (the end-of-sequence bias not honoured)"
                          for key, n in short.items() if n]
        finally:
            for s in systems:
                s.stop()
        return run
