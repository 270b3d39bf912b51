"""Which prompt-lookup matches are worth a verification pass? Replayed on the demo model's real answers.

Usage: PYTHONPATH=. .venv/bin/python -m e2e.bench.lookup_replay [--model smollm2] [--tokens 96] [--draft 4]

For each workload of the speculation benchmark (e2e/bench/speculation.py) this takes the model's greedy
answer from single-process mlx-lm, then replays the coordinator's drafting on it step by step —
`drafting.Lookup` over prompt and answer so far, `drafting.DraftLength` adapting k from each pass, the
room a pass may use as `speculation.Speculation.draft` computes it — for each shortest match length
`min_ngram`. Greedy verification accepts a draft's longest prefix that equals the answer, so the passes,
drafts and accepted tokens are exactly what a cluster would see. What a pass costs is measured here, in
the same run: the whole model's step over a chunk of 1 + d tokens (every core's BLAS threads, as a lone
request's SOLO steps run) ÷ a plain step. The predicted decode speed-up is answer tokens ÷ the steps'
summed cost; the hops and the coordinator's own path are left out (they make a pass relatively cheaper).
Prints a Markdown table (docs/benchmark.md).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from e2e.bench.procs import model_parser
from orchestrator.engine import blas
from orchestrator.engine.coordinator.drafting import DraftLength, Lookup

CORES = os.cpu_count() or 1
ROUNDS = 25  # timed steps per chunk width, interleaved


def replay(prompt: list[int], answer: list[int], cost: dict[int, float], maximum: int,
           min_ngram: int) -> tuple[int, int, int, float]:
    """Passes, drafted and accepted tokens, and the summed cost in plain steps, of decoding `answer`."""
    lookup, length = Lookup(tokens=list(prompt), min_ngram=min_ngram), DraftLength(maximum)
    done, passes, drafted, accepted, spent = 0, 0, 0, 0, 0.0
    while done < len(answer):
        room = min(length.next(), len(answer) - done - 1)  # a pass emits its drafts + 1
        draft = lookup.draft(room) if room > 0 else []
        right = 0
        while right < len(draft) and draft[right] == answer[done + right]:
            right += 1
        if draft:
            passes, drafted, accepted = passes + 1, drafted + len(draft), accepted + right
            length.observe(len(draft), right)
        spent += cost[len(draft)]
        lookup.extend(answer[done:done + right + 1])
        done += right + 1
    return passes, drafted, accepted, spent


def main(argv: list[str] | None = None) -> int:
    """Measure, replay and print the table."""
    p = model_parser(__doc__)
    p.add_argument("--tokens", type=int, default=96, help="answer tokens per workload (the speculation bench's 96)")
    p.add_argument("--draft", type=int, default=4, help="the cluster's speculative_tokens")
    args = p.parse_args(argv)
    blas.preload(CORES)  # before mlx is imported
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    from e2e.bench.procs import prepare_model, whole_model_stage
    from e2e.bench.speculation import WORKLOADS

    model_dir = prepare_model(args.model)
    model, tokenizer = load(str(model_dir))
    answers = {}
    for name, text in WORKLOADS.items():
        prompt = list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))
        answer = []
        for token, _ in generate_step(mx.array(prompt), model, max_tokens=args.tokens):
            answer.append(int(token))
            if answer[-1] in tokenizer.eos_token_ids:
                break
        answers[name] = (prompt, answer)
    del model

    stage = whole_model_stage(model_dir)
    cache = stage.make_cache()
    mx.eval(stage.forward(mx.array([answers["free chat"][0]]), cache))
    times: dict[int, list[float]] = {d: [] for d in range(args.draft + 1)}
    for _ in range(ROUNDS):
        for d in times:
            started = time.perf_counter()
            mx.eval(stage.forward(mx.array([list(range(100, 101 + d))]), cache))
            times[d].append(time.perf_counter() - started)
            for c in cache:
                c.trim(d + 1)
    plain = statistics.median(times[0])
    cost = {d: statistics.median(t) / plain for d, t in times.items()}

    widths = ", ".join(f"1 + {d} tokens {c:.2f}×" for d, c in cost.items() if d)
    print(f"Pass cost on this machine ({CORES} BLAS threads, {args.model}'s whole model, median of {ROUNDS}): "
          f"{widths} a plain step ({plain * 1e3:.1f} ms).\n")
    print("| workload | answer tokens | shortest match | passes | drafts right | predicted decode speed-up |")
    print("|---|---|---|---|---|---|")
    for name, (prompt, answer) in answers.items():
        for n in (1, 2, 3):
            passes, drafted, accepted, spent = replay(prompt, answer, cost, args.draft, n)
            print(f"| {name} | {len(answer)} | {n} token{'s' if n > 1 else ''} | {passes} | {accepted} of {drafted} | "
                  f"{len(answer) / spent:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
