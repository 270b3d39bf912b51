"""`pipeserve router --config router.yaml --host H --port P`: serve until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from .. import logs


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
    from .config import ConfigError, load_config
    from .reload import ConfigWatcher, signature
    from .server import make_server
    from .service import RouterService

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
    try:
        server = make_server(service, args.host, args.port)
    except ValueError as exc:  # a bad PIPESERVE_HTTP_* setting
        log.error("config.invalid", reason=exc)
        return 2
    except OSError as exc:
        log.error("http.bind_failed", address=f"{args.host}:{args.port}", reason=exc)
        return 3
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
