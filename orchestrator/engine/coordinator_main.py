"""`pipeserve coordinator`: the pipeline's only entry point, an OpenAI-compatible server."""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path

from .. import logs
from .config import ConfigError, load_config, read_secret
from .parent_watch import watch_parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `pipeserve coordinator` options."""
    parser.add_argument("--config", required=True, type=Path, help="cluster TOML")
    parser.add_argument("--node-id", required=True, help="the coordinator's [[nodes]] id")
    parser.add_argument("--model", required=True, type=Path, help="MLX model directory (tokenizer and config)")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    parser.add_argument("--model-name", default=None, help="model id served (default: the model directory's name)")


def run(args: argparse.Namespace) -> int:
    """Connect to the stages and serve HTTP until SIGTERM."""
    log = logs.setup(args.node_id)
    watch_parent(log)  # started by an agent: stop when it is gone, even if it was killed
    try:
        config = load_config(args.config)
        node = config.node(args.node_id)
        if node.role not in ("coordinator", "hybrid"):
            raise ConfigError(f"node {node.id!r} has role {node.role!r}, not coordinator/hybrid")
        secret = read_secret(config, args.config)
        model_cfg = json.loads((args.model / "config.json").read_text())
    except (ConfigError, OSError, ValueError) as exc:
        log.error("config.invalid", reason=exc)
        return 2
    from .metrics import Metrics
    from .pipeline import Pipeline

    if int(model_cfg.get("num_hidden_layers", -1)) != config.num_layers:
        log.error("config.invalid", reason=f"model has {model_cfg.get('num_hidden_layers')} layers, "
                                             f"the stages cover {config.num_layers}")
        return 2
    context = config.cluster.context_length or int(model_cfg.get("max_position_embeddings") or 4096)
    metrics = Metrics([s.id for s in config.stages])
    from .api import Coordinator, bind_server, build_app

    try:  # the port first: no other process may take it while the tokenizer loads
        server = bind_server(args.host, args.port, log)
    except ValueError as exc:  # a bad PIPESERVE_HTTP_* setting
        log.error("config.invalid", reason=exc)
        return 2
    except OSError as exc:
        log.error("http.bind_failed", address=f"{args.host}:{args.port}", reason=exc)
        return 3
    log.info("http.bound", address=f"{args.host}:{args.port}")
    # The links and the readiness probe need no tokenizer (a probe ignores end-of-sequence), so
    # they run while mlx-lm's tokenizer stack imports (~1 s: transformers) instead of after it:
    # a replaced coordinator is ready that much sooner. Nothing public reaches the pipeline
    # before the HTTP server below exists, and it has its end-of-sequence ids by then.
    pipeline = Pipeline(config, secret, set(), context, log, metrics)
    pipeline.start()
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(args.model)
    pipeline.eos_ids = set(tokenizer.eos_token_ids)
    log.info("tokenizer.loaded", pipeline=pipeline.health.state)
    name = args.model_name or args.model.resolve().name
    server.app = build_app(Coordinator(pipeline, tokenizer, name, metrics, log, secret))
    stop = threading.Event()

    def shutdown(*_: object) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    log.info("http.listening", address=f"{args.host}:{args.port}", model=name, stages=len(config.stages),
             context=context)
    server.serve_forever(poll_interval=0.2)
    pipeline.stop()
    log.info("coordinator.stopped")
    return 0
