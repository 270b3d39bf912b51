"""Worker subprocesses of the benchmark: single-process mlx-lm (the reference) and model
preparation. Run as `python -m e2e.bench.worker reference MODEL_DIR` (timing commands as
JSON lines on stdin, one JSON reply per line on stdout) or `... prepare NAME` (prints
the model directory). `argv()` is the one place that builds their command line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from e2e.bench.client import MIN_TOKENS


def argv(*args: str) -> list[str]:
    """Command line of a worker subprocess (run with the checkout root as cwd)."""
    return [sys.executable, "-m", "e2e.bench.worker", *args]


def openblas_info() -> dict:
    """OpenBLAS's build configuration and thread count, when it is the BLAS in use."""
    import ctypes

    from orchestrator.engine import blas

    path = blas.loaded()
    if path is None:
        return {}
    lib = ctypes.CDLL(str(path))
    lib.openblas_get_config.restype = ctypes.c_char_p
    return {"config": lib.openblas_get_config().decode(), "threads": lib.openblas_get_num_threads()}


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS / VmHWM in bytes from /proc/PID/status."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def serve_reference(model_dir: Path) -> int:
    """Serve timing commands (JSON lines on stdin) for single-process mlx-lm on one model."""
    from orchestrator.engine import blas

    which = blas.preload()  # before mlx; OPENBLAS_NUM_THREADS comes from the environment
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.generate import generate_step
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_lm.utils import load_model

    out = os.fdopen(os.dup(1), "w", buffering=1)  # results only; stray prints go to stderr
    os.dup2(2, 1)
    model, _ = load_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    eos = set(tokenizer.eos_token_ids)
    weight_bytes = sum(v.nbytes for _, v in nn.utils.tree_flatten(model.parameters()))

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")

    def decode(cmd: dict) -> dict:
        t0 = time.perf_counter()
        times: list[float] = []
        ids: list[int] = []
        lps: list[float] = []
        cap = cmd.get("max_seconds") or float("inf")
        cut = False
        for token, logprobs in generate_step(mx.array(cmd["prompt"]), model, max_tokens=cmd["max_tokens"]):
            times.append(time.perf_counter() - t0)
            token = int(token)
            ids.append(token)
            lps.append(float(logprobs[token].item()))
            if token in eos:  # the pipeline stops at EOS too
                break
            if times[-1] > cap and MIN_TOKENS <= len(times) < cmd["max_tokens"]:
                cut = True
                break
        mx.synchronize()  # generate_step queues one step ahead: let it finish untimed
        return {"times": times, "tokens": ids, "logprobs": lps, "cut": cut,
                "texts": [tokenizer.decode([t]) for t in ids]}

    def ttft(cmd: dict) -> dict:
        t0 = time.perf_counter()
        for _ in generate_step(mx.array(cmd["prompt"]), model, max_tokens=1):
            break
        seconds = time.perf_counter() - t0
        mx.synchronize()
        return {"seconds": seconds}

    def chat(cmd: dict) -> dict:
        """A chat request as a server answers it, timed whole: template, prefill, decode to EOS or
        max_tokens (the EOS counted, as usage counts it), detokenize."""
        t0 = time.perf_counter()
        prompt = list(tokenizer.apply_chat_template(cmd["messages"], add_generation_prompt=True))
        ids: list[int] = []
        for token, _ in generate_step(mx.array(prompt), model, max_tokens=cmd["max_tokens"]):
            ids.append(int(token))
            if ids[-1] in eos:
                break
        text = tokenizer.decode([t for t in ids if t not in eos])
        seconds = time.perf_counter() - t0
        mx.synchronize()
        return {"text": text, "tokens": len(ids), "seconds": seconds}

    ops = {"decode": decode, "ttft": ttft, "chat": chat, "memory": lambda _: proc_status(),
           "tokenize": lambda cmd: {"ids": list(tokenizer.encode(cmd["text"]))}}
    reply({"ready": True, "blas": which, "openblas": openblas_info(), "weight_bytes": weight_bytes,
           "env_threads": os.environ.get("OPENBLAS_NUM_THREADS")})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            op = ops.get(cmd["op"])
            reply(op(cmd) if op else {"error": f"unknown op {cmd['op']}"})
        except Exception as exc:  # noqa: BLE001 (report, keep serving)
            reply({"error": repr(exc)})
    return 0


def main(args: list[str]) -> int:
    """`reference MODEL_DIR` or `prepare NAME`."""
    if len(args) == 2 and args[0] == "reference":
        return serve_reference(Path(args[1]))
    if len(args) == 2 and args[0] == "prepare":
        from e2e.bench.models import prepare

        print(prepare(args[1]))
        return 0
    print("usage: python -m e2e.bench.worker reference MODEL_DIR | prepare NAME", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
