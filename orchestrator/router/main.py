"""`pipeserve router --config router.yaml --host H --port P`: serve until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from orchestrator import logs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `pipeserve router` options."""
    parser.add_argument("--config", required=True, type=Path, help="router YAML (continuum-router format)")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    parser.add_argument("--reload-interval", type=float, default=0.5, metavar="SECONDS",
                        help="how often the YAML is checked for changes (default 0.5)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def run(args: argparse.Namespace) -> int:
    """Load the YAML, start health checks and hot reload, serve HTTP."""
    log = logs.setup("router", args.log_level)
    from orchestrator.httpkit.server import bound
    from orchestrator.router.config import ConfigError, load_config
    from orchestrator.router.reload import ConfigWatcher, signature
    from orchestrator.router.server import make_server
    from orchestrator.router.service import RouterService

    if args.reload_interval <= 0:
        log.error("config.invalid", reason="--reload-interval must be positive")
        return 2
    seen = signature(args.config)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        log.error("config.invalid", reason=exc, hint="a minimal file is `backends: []`")
        return 2
    service = RouterService(config, log, config_path=args.config)
    server = bound(lambda: make_server(service, args.host, args.port), log, f"{args.host}:{args.port}")
    if isinstance(server, int):
        return server
    watcher = ConfigWatcher(args.config, service.apply, service.reject, log, args.reload_interval, seen=seen)
    service.start()
    watcher.start()

    def shutdown(*_: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    log.info("http.listening", address=f"{args.host}:{args.port}", config=args.config,
             backends=len(config.backends), health_interval=config.health_checks.interval)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        watcher.stop()
        service.stop()
        server.server_close()
    log.info("router.stopped")
    return 0
