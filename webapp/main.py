"""`pipeserve dashboard`: the web dashboard, its orchestrator thread, under gunicorn.

One process, threads (gunicorn's gthread worker, which flask-sock supports): the
orchestrator owns state in one thread of that process. It is created here, in the serving
entry point, never at import or in create_app.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `pipeserve dashboard`."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--state-dir", type=Path, default=Path.home() / ".pipeserve" / "dashboard")
    parser.add_argument("--router", default="http://127.0.0.1:8000", help="the router's URL (chat, model picker)")
    parser.add_argument("--router-config", type=Path, default=None,
                        help="continuum-router YAML to register clusters in (default: <state-dir>/router.yaml)")
    parser.add_argument("--router-admin-url", default=None, help="register through the router's admin API instead")
    parser.add_argument("--router-admin-token", default=None, help="bearer token for the admin API")
    parser.add_argument("--discovery", action=argparse.BooleanOptionalAction, default=True,
                        help="browse the LAN for node agents (zeroconf)")
    parser.add_argument("--discovery-interface", action="append", default=None,
                        help="interface address to browse on (repeatable; default all)")
    parser.add_argument("--threads", type=int, default=64, help="worker threads (each open websocket holds one)")
    parser.add_argument("--reset-admin-token", action="store_true", help="print a new admin token and exit")


def run(args: argparse.Namespace) -> int:
    """Print the admin token on first start, then serve until SIGTERM."""
    from orchestrator import logs

    from .auth import AuthStore

    log = logs.setup("dashboard")
    auth = AuthStore(args.state_dir)
    if args.reset_admin_token:
        print(f"new admin token: {auth.reset_admin_token()}", flush=True)
        return 0
    token = auth.ensure_admin_token()
    if token:
        print(f"admin token: {token}  (shown once; stored hashed in {args.state_dir})", flush=True)
    from gunicorn.app.base import BaseApplication

    class Server(BaseApplication):
        def load_config(self) -> None:
            for key, value in {"bind": f"{args.host}:{args.port}", "workers": 1, "worker_class": "gthread",
                               "threads": args.threads, "timeout": 120, "graceful_timeout": 10,
                               "accesslog": None, "loglevel": "warning"}.items():
                self.cfg.set(key, value)

        def load(self):
            return build(args, log)

    log.info("dashboard.listening", url=f"http://{args.host}:{args.port}", router=args.router)
    Server().run()
    return 0


def build(args: argparse.Namespace, log):
    """Create and start the orchestrator, then the Flask app around it (runs in the worker)."""
    from orchestrator.control.core import Orchestrator
    from orchestrator.registrar import AdminApiRegistrar, BearerAuth, ConfigFileRegistrar

    from . import create_app
    from .auth import AuthStore

    if args.router_admin_url:
        registrar = AdminApiRegistrar(args.router_admin_url,
                                      auth=BearerAuth(args.router_admin_token) if args.router_admin_token else None)
    else:
        path = args.router_config or (args.state_dir / "router.yaml")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("backends: []\n")
        registrar = ConfigFileRegistrar(path)
    orch = Orchestrator(args.state_dir, registrar, discovery=args.discovery,
                        discovery_interfaces=args.discovery_interface).start()
    return create_app(orch, AuthStore(args.state_dir), args.router)


if __name__ == "__main__":
    sys.exit(run(argparse.ArgumentParser().parse_args()))
