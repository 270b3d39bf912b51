"""Multi-turn prompt-cache benchmark: conversations sharing a long system prompt, cache on vs off.

Usage: .venv/bin/python e2e/bench_prompt_cache.py [--model smollm2|test] [--model-dir DIR] [--conversations 8]
       [--turns 6] [--system-tokens 2000] [--tokens 16] [--agents 4] [--agent-rounds 3] [--no-mlx-lm]
       [--out FILE] [--json FILE]

Side by side in one run, one system at a time on this machine: a 2-stage pipeserve cluster
behind `pipeserve router` with its prompt cache (docs/prompt-cache.md), the same cluster with
`prompt_cache_bytes = 0`, and `mlx_lm.server` on one node with its own prompt cache (the
reference ratio). Each conversation runs in its own thread, turn after turn (the answer is
appended, then the next question); TTFT is the time to the first streamed chunk. Prefill
tokens are the usage's prompt tokens minus its cached tokens. The coding-agent trace sends
the same long prefix with different suffixes, `--agents` at once, `--agent-rounds` times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402  (after the checkout is on the path, like the other e2e scripts)

from orchestrator.proc import free_port, wait_until  # noqa: E402

TEXTS = Path("/usr/share/common-licenses")


def system_prompt(model_dir: Path, tokens: int) -> str:
    """About `tokens` tokens of license text (counted with the model's own tokenizer.json)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "You are a careful assistant. Answer briefly. Reference material follows.\n"
    for path in sorted(TEXTS.glob("*")):
        if path.is_file():
            text += path.read_text(errors="ignore")
        if len(tok.encode(text).ids) > tokens:
            break
    ids = tok.encode(text).ids[:tokens]
    return tok.decode(ids)


def prepare(which: str) -> tuple[Path, str]:
    """The model directory and its served name."""
    if which == "smollm2":
        from orchestrator.models.demo import cached_demo_model

        return cached_demo_model("float32"), "smollm2"
    from orchestrator.testmodels.llama import make_test_model

    path = Path(os.environ.get("TMPDIR", "/tmp")) / "bench-prompt-cache-test-model"
    if not (path / "config.json").is_file():
        make_test_model(path, overwrite=True)
    return path, "test"


class Pipeserve:
    """A 2-stage LocalPipeline behind a `pipeserve router`."""

    def __init__(self, model_dir: Path, name: str, workdir: Path, cache_bytes: int | None) -> None:
        from orchestrator.engine.local_pipeline import LocalPipeline
        from orchestrator.engine.stage.shard import ModelInfo
        from orchestrator.router.local import LocalRouter

        layers = ModelInfo.read(model_dir).num_layers
        # A loaded machine may take long over one prefill chunk: the watchdog must not call that a wedge.
        cluster: dict[str, object] = {"context_length": 8192, "stall_timeout_s": 900}
        if cache_bytes is not None:
            cluster["prompt_cache_bytes"] = cache_bytes
        workdir.mkdir(parents=True, exist_ok=True)
        self.lp = LocalPipeline(workdir / "cluster", model_dir, [(0, layers // 2 - 1), (layers // 2, layers - 1)],
                                threads=1, cluster=cluster, model_name=name).start()
        yaml = workdir / "router.yaml"
        yaml.write_text(f"backends:\n  - name: cluster\n    url: {self.lp.base_url}/v1/\n    models: [{name}]\n"
                        "health_checks: {enabled: true, interval: 500ms, endpoint: /health}\n")
        self.router = LocalRouter(yaml, free_port(), workdir / "router.log").start()
        self.url = self.router.url + "/v1"
        self.metrics_url = self.lp.base_url + "/metrics"
        client = openai.OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=60)
        wait_until(lambda: _answers(client, name), 60, 0.5, "the router to see the cluster healthy")

    def stop(self) -> None:
        self.router.stop()
        self.lp.stop()


def _answers(client: openai.OpenAI, model: str) -> bool:
    try:
        client.completions.create(model=model, prompt="hi", max_tokens=1)
        return True
    except openai.APIStatusError:
        return False


class MlxLmServer:
    """`mlx_lm.server` on one node, with its default prompt cache."""

    def __init__(self, model_dir: Path, workdir: Path) -> None:
        import requests

        port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = open(workdir / "mlx_lm_server.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir), "--port",
                                      str(port)], stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.url = f"http://127.0.0.1:{port}/v1"
        wait_until(lambda: self._up(requests), 120, 0.5, "mlx_lm.server to answer")

    def _up(self, requests) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"mlx_lm.server exited {self.proc.returncode}")
        try:
            return requests.get(self.url + "/models", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def one_turn(client: openai.OpenAI, model: str, messages: list[dict], max_tokens: int) -> dict:
    """A streamed chat completion: TTFT, text, usage."""
    t0 = time.perf_counter()
    first, text, usage = None, "", None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if first is None and chunk.choices:
            first = time.perf_counter()
        for c in chunk.choices:
            text += c.delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    end = time.perf_counter()
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    cached = int(getattr(details, "cached_tokens", 0) or 0) if details else 0
    return {"ttft": (first or end) - t0, "text": text, "prompt": usage.prompt_tokens if usage else 0,
            "cached": cached, "completion": usage.completion_tokens if usage else 0, "end": end, "start": t0}


def conversations(url: str, model: str, system: str, n: int, turns: int, max_tokens: int) -> dict:
    """`n` conversations at once, `turns` turns each; per-turn records."""
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=1800)
    records: list[list[dict]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def run(c: int) -> None:
        messages = [{"role": "system", "content": system}]
        try:
            for t in range(turns):
                messages.append({"role": "user", "content": f"Conversation {c}, question {t + 1}: "
                                                            f"what does section {c + t + 1} say?"})
                r = one_turn(client, model, messages, max_tokens)
                records[c].append(r)
                messages.append({"role": "assistant", "content": r["text"]})
        except (openai.OpenAIError, RuntimeError, OSError) as exc:  # reported after the others finish
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(n)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"a conversation failed: {errors[0]!r}")
    return summarize([r for conv in records for r in conv], wall, by_turn=[[conv[t] for conv in records]
                                                                          for t in range(turns)])


def agents(url: str, model: str, system: str, n: int, rounds: int, max_tokens: int) -> dict:
    """A coding agent's trace: the same long prefix (system + tool list), `n` different suffixes at once."""
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=1800)
    tools = "Tools: read_file(path), write_file(path, text), run(command), search(query).\n"
    by_round, wall = [], 0.0
    for r in range(rounds):
        out: list[dict | None] = [None] * n

        def call(i: int, r: int, out: list[dict | None]) -> None:
            msgs = [{"role": "system", "content": system + tools},
                    {"role": "user", "content": f"Task {r}-{i}: fix the failing test number {i * 7 + r}."}]
            out[i] = one_turn(client, model, msgs, max_tokens)

        threads = [threading.Thread(target=call, args=(i, r, out)) for i in range(n)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall += time.perf_counter() - t0
        if any(o is None for o in out):
            raise RuntimeError("an agent call failed")
        by_round.append(out)
    return summarize([o for rnd in by_round for o in rnd], wall, by_turn=by_round)


def summarize(records: list[dict], wall: float, by_turn: list[list[dict]]) -> dict:
    return {"ttft_by_turn": [statistics.median(r["ttft"] for r in turn) for turn in by_turn],
            "prompt_tokens": sum(r["prompt"] for r in records),
            "prefill_tokens": sum(r["prompt"] - r["cached"] for r in records),
            "cached_tokens": sum(r["cached"] for r in records),
            "completion_tokens": sum(r["completion"] for r in records),
            "wall_s": wall, "tok_s": sum(r["completion"] for r in records) / wall if wall else 0.0}


def render(results: dict[str, dict], args: argparse.Namespace, system_tokens: int) -> str:
    names = list(results)
    lines = [f"Model {args.model}; {args.conversations} conversations x {args.turns} turns, system prompt "
             f"~{system_tokens} tokens, {args.tokens} tokens per answer; coding agent: {args.agents} at once x "
             f"{args.agent_rounds} rounds.", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for t in range(args.turns):
        lines.append(f"| TTFT turn {t + 1} (median s) | "
                     + " | ".join(f"{results[n]['chat']['ttft_by_turn'][t]:.2f}" for n in names) + " |")
    for key, label in (("prefill_tokens", "prefill tokens (total)"), ("cached_tokens", "cached tokens (total)")):
        lines.append(f"| {label} | " + " | ".join(str(results[n]["chat"][key]) for n in names) + " |")
    lines.append("| aggregate tok/s | " + " | ".join(f"{results[n]['chat']['tok_s']:.1f}" for n in names) + " |")
    lines.append("| TTFT turn >= 2 / its own turn 1 | " + " | ".join(
        f"{_later(results[n]['chat']) / results[n]['chat']['ttft_by_turn'][0]:.3f}" for n in names) + " |")
    lines.append("| TTFT turn >= 2 / pipeserve cache off | " + " | ".join(
        f"{_later(results[n]['chat']) / _later(results[names[1]]['chat']):.3f}" if len(names) > 1 else "-"
        for n in names) + " |")
    if args.agents:
        lines.append("| agent TTFT round 1 (median s) | " + " | ".join(
            f"{results[n]['agent']['ttft_by_turn'][0]:.2f}" for n in names) + " |")
        lines.append("| agent TTFT later rounds (median s) | " + " | ".join(
            f"{_later(results[n]['agent']):.2f}" for n in names) + " |")
        lines.append("| agent prefill tokens | " + " | ".join(str(results[n]["agent"]["prefill_tokens"])
                                                           for n in names) + " |")
    return "\n".join(lines) + "\n"


def _later(summary: dict) -> float:
    later = summary["ttft_by_turn"][1:]
    return statistics.median(later) if later else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="test", choices=["test", "smollm2"])
    p.add_argument("--model-dir", type=Path, help="serve this model directory (named after --model)")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system-tokens", type=int, default=2000)
    p.add_argument("--tokens", type=int, default=16, help="max tokens per answer")
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--agent-rounds", type=int, default=3)
    p.add_argument("--no-mlx-lm", action="store_true", help="skip the mlx_lm.server reference")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench-prompt-cache"))
    p.add_argument("--out", type=Path)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    model_dir, name = (args.model_dir, args.model) if args.model_dir else prepare(args.model)
    system = system_prompt(model_dir, args.system_tokens)
    systems = [("pipeserve, cache on", lambda: Pipeserve(model_dir, name, args.workdir / "on", None)),
               ("pipeserve, cache off", lambda: Pipeserve(model_dir, name, args.workdir / "off", 0))]
    if not args.no_mlx_lm:
        systems.append(("mlx_lm.server (1 node)", lambda: MlxLmServer(model_dir, args.workdir / "mlx")))
    results: dict[str, dict] = {}
    for label, start in systems:
        print(f"bench: {label}", file=sys.stderr)
        server = start()
        try:
            served = name if not isinstance(server, MlxLmServer) else str(model_dir)
            results[label] = {"chat": conversations(server.url, served, system, args.conversations, args.turns,
                                                    args.tokens)}
            if args.agents:
                results[label]["agent"] = agents(server.url, served, system, args.agents, args.agent_rounds,
                                                 args.tokens)
        finally:
            server.stop()
        print(json.dumps({label: results[label]["chat"]}), file=sys.stderr)
    table = render(results, args, args.system_tokens)
    print(table)
    if args.out:
        args.out.write_text(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
