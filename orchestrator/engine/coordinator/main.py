"""`pipeserve coordinator`: the pipeline's only entry point, an OpenAI-compatible server."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from pathlib import Path

from orchestrator import logs
from orchestrator.engine.config import ConfigError, load_config, read_secret
from orchestrator.engine.coordinator.draft_model import DraftModel, DraftModelError, check_same_tokenizer
from orchestrator.engine.coordinator.health_report import HealthReport, control_token
from orchestrator.engine.parent_watch import watch_parent
from orchestrator.engine.stage.faults import Faults
from orchestrator.families.decoder_config import ModelConfigError, read_decoder_facts
from orchestrator.httpkit import App, Limits, OpenAIError, Server, route
from orchestrator.httpkit.server import bound

DRAIN_S = 3.0  # at a stop, at most this long for the scheduler to end every answer and their streams to say so


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
        decoder = read_decoder_facts(args.model)  # the stages' and the planner's reading too
        draft_dir = None if config.cluster.draft_model is None else args.model.parent / config.cluster.draft_model
        if draft_dir is not None:  # before the port: a wrong draft model changes nothing
            check_same_tokenizer(args.model, draft_dir)
    except (ConfigError, ModelConfigError, OSError, ValueError) as exc:
        log.error("config.invalid", reason=exc)
        return 2
    if decoder.num_layers != config.num_layers:
        log.error("config.invalid", reason=f"model has {decoder.num_layers} layers, "
                                             f"the stages cover {config.num_layers}")
        return 2
    context = config.cluster.context_length or decoder.max_position_embeddings or 4096
    name = args.model_name or args.model.resolve().name
    # the port first: no other process may take it while the tokenizer loads
    server = bound(lambda: Server((args.host, args.port), starting_app(name), log, Limits().with_env(),
                                  control_token=control_token(secret) if secret else None),
                   log, f"{args.host}:{args.port}")
    if isinstance(server, int):
        return server
    # Served from the moment it is bound: while it starts, every request gets 503 with
    # Retry-After (a client or router retries) instead of waiting unanswered in the backlog.
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="http",
                               daemon=True)
    serving.start()
    log.info("http.bound", address=f"{args.host}:{args.port}")
    Faults.for_node(args.node_id).before_start()  # test-only: off unless PIPESERVE_FAULTS names it
    from orchestrator.engine.coordinator.api import Coordinator, build_app
    from orchestrator.engine.coordinator.metrics import Metrics
    from orchestrator.engine.coordinator.pipeline import Pipeline

    metrics = Metrics([s.id for s in config.stages])
    # The links and the readiness probe need no tokenizer (a probe ignores end-of-sequence), so
    # they run while mlx-lm's tokenizer stack imports (~1 s: transformers) instead of after it:
    # a replaced coordinator is ready that much sooner. Nothing public reaches the pipeline
    # before the HTTP server below exists, and it has its end-of-sequence ids by then.
    pipeline = Pipeline(config, secret, set(), context, log, metrics, Faults.for_node(args.node_id))
    pipeline.start()
    log.info("pipeline.started", stages=len(config.stages))
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(args.model)
    pipeline.eos_ids = set(tokenizer.eos_token_ids)
    log.info("tokenizer.loaded", pipeline=pipeline.health.state)
    if draft_dir is not None:
        try:
            pipeline.speculation.drafter = DraftModel(draft_dir)  # its tokenizer was checked above
        except DraftModelError as exc:
            log.error("config.invalid", reason=exc)
            pipeline.stop()
            server.shutdown()
            return 2
        log.info("draft.loaded", model=str(draft_dir), weight_bytes=pipeline.speculation.drafter.weight_bytes)
    coordinator = Coordinator(pipeline, tokenizer, name, metrics, log, secret, args.model)
    refusal = coordinator.prepare_grammars()  # before serving: never on a request's thread
    log.info("grammars.prepared", **({"refusal": refusal} if refusal else {}))
    server.app = build_app(coordinator)
    stop = threading.Event()

    def shutdown(*_: object) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    log.info("http.listening", address=f"{args.host}:{args.port}", model=name, stages=len(config.stages),
             context=context)
    while not stop.wait(0.5):  # a bounded wait: the signal handlers run on this thread
        pass
    serving.join(timeout=10)
    # Stopping ends every answer in flight or held with an error; the threads streaming them must write
    # it before the process ends (they are daemons): else their clients see a cut connection, not an error.
    pipeline.stop(wait_s=DRAIN_S)
    drained = time.monotonic() + DRAIN_S
    while server.busy_connections and time.monotonic() < drained:
        time.sleep(0.02)
    log.info("coordinator.stopped")
    return 0


def starting_app(model_name: str) -> App:
    """What the coordinator serves between binding its port and its pipeline's start: a typed
    `starting` health report (503) and, to every other request, 503 with Retry-After."""
    report = HealthReport(status="starting", ready=False, reason="the coordinator is starting", model=model_name)

    def unavailable(_: object) -> None:
        raise OpenAIError(503, "the coordinator is starting; retry shortly", "service_unavailable",
                          code="starting")

    return App.of([route("GET", "/health", lambda _: (503, report.model_dump(mode="json"))),
                   *(route(m, r"/.*", unavailable) for m in ("GET", "POST", "PUT", "DELETE"))], 1 << 20)
