"""The GPU check: a split model on one NVIDIA GPU against single-process mlx-lm on the same GPU.

    python -m e2e.gpu_check            # Linux, one NVIDIA GPU, mlx's CUDA backend (make setup MLX_BACKEND=cuda)
    python -m e2e.gpu_check --small    # the same steps on a small model: proves the script on any machine

It builds a random bfloat16 Llama locally (16 layers of hidden 2048, about 1.4 GB: the three
stages and the reference together stay far under any data-centre card's memory), runs it as 3
stage processes plus the coordinator on this machine (`LocalPipeline`: every process on the one
GPU), and single-process mlx-lm in a worker of its own (`e2e/bench`'s reference worker), then
prints one table:

- exactness: greedy tokens through the split equal mlx-lm's token for token, and the largest
  log-prob difference (bfloat16 on a GPU: a split's kernels may fuse differently than the whole
  model's, so log-probs are held to LOGPROB_TOLERANCE, not to bit equality);
- decode tok/s at 1 request and aggregate at 8, TTFT of a 2,048-token prompt, each ÷ mlx-lm;
- the agent's memory report and runtime for the node (the agent's own functions).

Nothing is asserted about speed; the exit status is 1 only when the tokens differ or the
log-probs are outside the tolerance. docs/benchmark.md, "On a GPU", says what has run it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from e2e.bench.client import aggregate_rate, decode_rate, run_concurrent, stream_completion
from e2e.bench.procs import PipelineSystem, ReferenceWorker
from orchestrator.agent import device_probe
from orchestrator.agent import report as node_report
from orchestrator.testmodels.llama import make_test_model
from orchestrator.units import format_bytes

LOGPROB_TOLERANCE = 0.05  # nats, per token: bfloat16 rounding of a different fusion, never a different token
FULL = dict(layers=16, hidden=2048, heads=16, kv_heads=8, vocab=32000, prompt=2048, tokens=128, splits=3)
SMALL = dict(layers=6, hidden=128, heads=4, kv_heads=2, vocab=512, prompt=256, tokens=24, splits=3)


def splits_of(layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal inclusive ranges (the first stage one layer lighter: it embeds)."""
    bounds = [round(layers * k / stages) for k in range(stages + 1)]
    return [(bounds[k], bounds[k + 1] - 1) for k in range(stages)]


def prompt_of(length: int, vocab: int, salt: int = 0) -> list[int]:
    """A deterministic token-id prompt (no tokenizer involved in what is compared)."""
    return [(7 + 31 * i + 101 * salt) % (vocab - 3) + 3 for i in range(length)]


def node_memory() -> dict:
    """What the agent reports for this node: its mlx runtime and its memory section."""
    probed = device_probe.probe()
    mem = node_report.memory(None, 0, probed)
    return {"runtime": node_report.runtime(probed).model_dump(), "memory": mem.model_dump()}


def measure(args: argparse.Namespace, shape: dict, model_dir: Path, work: Path) -> dict:
    """Every figure of the table, the reference and the pipeline measured in turn in this run."""
    vocab, tokens = shape["vocab"], shape["tokens"]
    short, long = prompt_of(32, vocab), prompt_of(shape["prompt"], vocab, salt=1)
    batch = [prompt_of(32, vocab, salt=2 + i) for i in range(8)]
    out: dict = {}
    ref = ReferenceWorker(model_dir, {}, work / "reference.log")
    try:
        solo = ref.call("decode", prompt=short, max_tokens=tokens)
        out["ref_tokens"], out["ref_logprobs"] = solo["texts"], solo["logprobs"]
        out["ref_decode"] = max(decode_rate(ref.call("decode", prompt=short, max_tokens=tokens)["times"])
                                for _ in range(args.rounds))
        out["ref_ttft"] = statistics.median(ref.call("ttft", prompt=long)["seconds"] for _ in range(args.rounds))
        # mlx-lm serves one request at a time: its aggregate at 8 is its rate at 1
        out["ref_decode8"] = out["ref_decode"]
    finally:
        ref.stop()
        ref.proc.stdout.close()  # type: ignore[union-attr]  (the worker's stop leaves its pipe to the collector)
    pipe = PipelineSystem(model_dir, work / "pipeline", splits_of(shape["layers"], shape["splits"]), threads=0,
                          solo_threads=None, env={}, model_name="gpu-check",
                          cluster={"context_length": shape["prompt"] + tokens + 64})
    try:
        first = stream_completion(pipe.port, "gpu-check", short, tokens)
        out["pipe_tokens"], out["pipe_logprobs"] = first.texts, first.logprobs
        out["pipe_decode"] = max(decode_rate(stream_completion(pipe.port, "gpu-check", short, tokens).times)
                                 for _ in range(args.rounds))
        out["pipe_decode8"] = max(aggregate_rate(run_concurrent(pipe.port, "gpu-check", batch, tokens))
                                  for _ in range(args.rounds))
        ttfts = []
        for _ in range(args.rounds):
            s = stream_completion(pipe.port, "gpu-check", long, 1)
            ttfts.append(s.times[0] - s.t_submit)
        out["pipe_ttft"] = statistics.median(ttfts)
    finally:
        pipe.stop()
    out["node"] = node_memory()
    return out


def shown(n: int | None) -> str:
    """Bytes in words, "–" where the report has no such figure (a CPU node has no device memory)."""
    return format_bytes(n) if n else "–"


def table(shape: dict, r: dict) -> tuple[str, bool]:
    """The printed table, and whether the split was exact within the tolerance."""
    n = min(len(r["ref_tokens"]), len(r["pipe_tokens"]))
    same = n > 0 and r["ref_tokens"][:n] == r["pipe_tokens"][:n]
    worst = max((abs(a - b) for a, b in zip(r["ref_logprobs"][:n], r["pipe_logprobs"][:n])), default=float("inf"))
    exact = same and worst <= LOGPROB_TOLERANCE
    rt, mem = r["node"]["runtime"], r["node"]["memory"]
    rows = [
        ("model", f"random Llama, bfloat16, {shape['layers']} layers, hidden {shape['hidden']}, "
                  f"{shape['splits']} stages + coordinator"),
        ("device", f"{rt['device'] or '?'}; mlx {rt['mlx']} ({rt['backend']}: {rt['package']}), mlx-lm {rt['mlx_lm']}"),
        ("greedy tokens = mlx-lm", f"{'yes' if same else 'NO'} ({n} tokens)"),
        ("largest |log-prob difference|", f"{worst:.4g} (tolerance {LOGPROB_TOLERANCE}) "
                                          f"{'ok' if exact else 'OUTSIDE'}"),
        ("decode tok/s at 1: split / mlx-lm", f"{r['pipe_decode']:.1f} / {r['ref_decode']:.1f} = "
                                              f"{r['pipe_decode'] / r['ref_decode']:.2f}"),
        ("decode tok/s at 8 (aggregate): split / mlx-lm at 1", f"{r['pipe_decode8']:.1f} / {r['ref_decode8']:.1f} = "
                                                               f"{r['pipe_decode8'] / r['ref_decode8']:.2f}"),
        (f"TTFT at {shape['prompt']} tokens: split / mlx-lm", f"{r['pipe_ttft'] * 1000:.0f} ms / "
                                                              f"{r['ref_ttft'] * 1000:.0f} ms = "
                                                              f"{r['pipe_ttft'] / r['ref_ttft']:.2f}"),
        ("agent memory report", f"kind {mem['kind']}: {format_bytes(mem['free_bytes'])} free of "
                                f"{format_bytes(mem['total_bytes'])} ({mem['source']})"),
        ("", f"device {shown(mem['device_total_bytes'])}, mlx limit {shown(mem['limit_bytes'])}, "
             f"host RAM {shown(mem['host_total_bytes'])}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"| {k.ljust(width)} | {v} |" for k, v in rows), exact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="a small model (any machine: proves the script)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each timing (best decode, median TTFT)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    shape = SMALL if args.small else FULL
    backend = node_memory()["runtime"]["backend"]
    if not args.small and backend != "cuda":
        print(f"mlx's backend here is {backend}, not cuda: run with --small, or on an NVIDIA machine after "
              "`make setup MLX_BACKEND=cuda`", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        model_dir = make_test_model(work / "model", layers=shape["layers"], hidden=shape["hidden"],
                                    heads=shape["heads"], kv_heads=shape["kv_heads"], vocab=shape["vocab"],
                                    dtype="bfloat16")
        results = measure(args, shape, model_dir, work)
    text, exact = table(shape, results)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"shape": shape, **results}, indent=1))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
