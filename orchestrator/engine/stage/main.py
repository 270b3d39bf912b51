"""`pipeserve stage`: run one pipeline stage from the cluster TOML."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from orchestrator import logs, settings
from orchestrator.engine import blas
from orchestrator.engine.config import ConfigError, load_config, read_secret
from orchestrator.engine.parent_watch import watch_parent
from orchestrator.engine.stage.model_import import import_model_code_only


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `pipeserve stage` options."""
    parser.add_argument("--config", required=True, type=Path, help="cluster TOML")
    parser.add_argument("--node-id", required=True, help="this stage's [[nodes]] id, e.g. stage-1")
    parser.add_argument("--model", required=True, type=Path, help="MLX model directory")
    parser.add_argument("--threads", type=int, default=settings.STAGE_THREADS.read() or None,
                        help="BLAS threads (default: $PIPESERVE_STAGE_THREADS, else OpenBLAS's own: every core)")
    parser.add_argument("--solo-threads", type=int, default=settings.SOLO_THREADS.read() or None,
                        help="BLAS threads for steps the coordinator marks SOLO (nothing else in flight), "
                             "e.g. all cores when stages share a host and --threads splits them")


def run(args: argparse.Namespace) -> int:
    """Load the stage's layers, bind its address, and serve until SIGTERM."""
    log = logs.setup(args.node_id)
    watch_parent(log)  # started by an agent: stop when it is gone, even if it was killed
    try:
        config = load_config(args.config)
        node = config.node(args.node_id)
        if node.role != "pipeline_stage":
            raise ConfigError(f"node {node.id!r} has role {node.role!r}, not pipeline_stage")
        secret = read_secret(config, args.config)
    except ConfigError as exc:
        log.error("config.invalid", reason=exc)
        return 2
    which_blas = blas.preload(args.threads, args.solo_threads)  # before mlx is imported
    lean = import_model_code_only()  # before shard: a stage never tokenizes (a second of start-up)
    from orchestrator.engine import transport
    from orchestrator.engine.stage import memory_share
    from orchestrator.engine.stage.shard import ShardError, StageModel
    from orchestrator.engine.stage.stage import Stage

    host, port = node.host_port
    start, end = node.layer_range
    log.info("stage.starting", stage=node.stage, layers=node.layers, address=node.address, blas=which_blas,
             pid=os.getpid(),
             lean_import=lean)
    try:
        listener = transport.bind(host, port)  # a taken port fails before the slow load
    except OSError as exc:
        log.error("transport.bind_failed", address=node.address, reason=exc)
        return 3
    try:  # the plan's share of the node's accelerator memory: fail now, not paging later
        limits = memory_share.apply(node.memory_bytes) if node.memory_bytes else None
    except memory_share.MemoryShareError as exc:
        log.error("memory.share_refused", reason=exc)
        return 5
    try:
        model = StageModel(args.model, start, end)
        if model.info.num_layers != config.num_layers:
            raise ShardError(f"the model has {model.info.num_layers} layers, the config covers {config.num_layers}")
        if limits is not None:
            log.info("memory.limit_set", backend=limits.backend, memory_limit=limits.memory, wired_limit=limits.wired,
                     loaded=memory_share.check_loaded(limits.memory))
    except ShardError as exc:
        log.error("model.invalid", reason=exc)
        return 4
    except memory_share.MemoryShareError as exc:
        log.error("memory.share_refused", reason=exc)
        return 5
    listener.listen(16)  # only now does the port accept: "listening" means ready
    stage = Stage(config, node, model, secret, listener, log, which_blas,
                  threads=(args.threads or 0, args.solo_threads or 0) if which_blas == "openblas" else (0, 0))
    signal.signal(signal.SIGTERM, lambda *_: stage.stop())
    signal.signal(signal.SIGINT, lambda *_: stage.stop())
    stage.serve()
    log.info("transport.listening", address=node.address, weight_bytes=model.weight_bytes)
    stage.run()
    log.info("stage.stopped")
    return 0


if __name__ == "__main__":
    # The same arguments as the pipeserve sub-command (a bare parser would lack them all).
    _parser = argparse.ArgumentParser(prog="python -m orchestrator.engine.stage.main")
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
