"""`pipeserve dashboard`: the web dashboard, its orchestrator thread, under gunicorn.

One process, gunicorn's gevent worker: every connection is a greenlet, so idle or slow
clients and open websockets cost memory, not one of a fixed number of threads (with the
threaded worker ~70 stalled sockets froze the dashboard; see docs/dashboard.md and
docs/security.md). The gevent worker monkey-patches the process before the app is built, so
the orchestrator's threads are greenlets too; their work is I/O (HTTP to agents, zeroconf,
files) that yields. A request's headers must arrive within KEEPALIVE_S or the connection is
dropped. The orchestrator is created here, in the serving entry point, never at import or in
create_app.
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

from orchestrator import settings
from orchestrator.control.rules.lease import LEASE_S

ROUTER_TOKEN_ENV = settings.ROUTER_ADMIN_TOKEN.name
KEEPALIVE_S = 5  # the longest a client may take to send a request's headers (and idle between requests)
CONNECTIONS = 4096  # simultaneous connections (greenlets); websockets are capped separately (webapp.guard)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `pipeserve dashboard`."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--state-dir", type=Path, default=Path.home() / ".pipeserve" / "dashboard")
    parser.add_argument("--router", default="http://127.0.0.1:8000",
                        help="the router's URL (chat, model picker; a session is Healthy once it routes to it)")
    parser.add_argument("--router-config", type=Path, default=None,
                        help="continuum-router YAML to register clusters in (default: <state-dir>/router.yaml)")
    parser.add_argument("--router-admin-url", default=None, help="register through the router's admin API instead")
    parser.add_argument("--router-admin-token-file", type=Path, default=None,
                        help=f"file holding the admin API's bearer token (or set ${ROUTER_TOKEN_ENV})")
    # Refused with a pointer: a token on the command line is readable by every local user
    # (/proc/PID/cmdline, ps).
    parser.add_argument("--router-admin-token", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--discovery", action=argparse.BooleanOptionalAction, default=True,
                        help="browse the LAN for node agents (zeroconf)")
    parser.add_argument("--discovery-interface", action="append", default=None,
                        help="interface address to browse on (repeatable; default all)")
    parser.add_argument("--lease-s", type=float, default=LEASE_S, metavar="SECONDS",
                        help=f"how long engine processes outlive a silent dashboard (default {LEASE_S:.0f}; "
                             "long enough for a restart, short enough for orphans: docs/recovery.md)")
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)  # gthread era; ignored
    parser.add_argument("--reset-admin-token", action="store_true", help="print a new admin token and exit")


def run(args: argparse.Namespace) -> int:
    """Print the admin token on first start, then serve until SIGTERM."""
    if args.router_admin_token is not None:
        print(f"pipeserve dashboard: --router-admin-token is refused (a command line is visible to every local "
              f"user); put the token in a file and pass --router-admin-token-file FILE, or set ${ROUTER_TOKEN_ENV}",
              file=sys.stderr, flush=True)
        return 2
    try:
        router_admin_token(args)
    except ValueError as exc:
        print(f"pipeserve dashboard: {exc}", file=sys.stderr, flush=True)
        return 2
    if not args.reset_admin_token:
        # Before anything imports ssl, sockets or threads (gevent's rule): the master forks the
        # worker, which must inherit cooperative versions of them all.
        from gevent import monkey

        monkey.patch_all()
    from orchestrator import logs
    from webapp.authstore import AuthStore

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
            for key, value in {"bind": f"{args.host}:{args.port}", "workers": 1, "worker_class": "gevent",
                               "worker_connections": CONNECTIONS, "keepalive": KEEPALIVE_S, "timeout": 120,
                               "graceful_timeout": 10, "accesslog": None, "loglevel": "warning"}.items():
                self.cfg.set(key, value)

        def load(self):
            return build(args, log)

    _raise_open_files(CONNECTIONS + 256)
    log.info("dashboard.listening", url=f"http://{args.host}:{args.port}", router=args.router)
    Server().run()
    return 0


def router_admin_token(args: argparse.Namespace) -> str | None:
    """The router admin API's bearer token: from --router-admin-token-file, else the environment.

    Raises ValueError (in words) when the file cannot be read or is empty.
    """
    path = getattr(args, "router_admin_token_file", None)
    if path is not None:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise ValueError(f"--router-admin-token-file {path}: {exc.strerror}") from None
        if not token:
            raise ValueError(f"--router-admin-token-file {path} is empty")
        return token
    return (settings.ROUTER_ADMIN_TOKEN.read() or "").strip() or None


def _raise_open_files(wanted: int) -> None:
    """Lift the soft open-files limit towards `wanted` (each connection is a file descriptor)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def build(args: argparse.Namespace, log):
    """Create and start the orchestrator, then the Flask app around it (runs in the worker)."""
    from orchestrator.control.core import Orchestrator
    from orchestrator.registrar import AdminApiRegistrar, BearerAuth, ConfigFileRegistrar
    from webapp import create_app
    from webapp.asyncio_bridge import isolate_asyncio_per_greenlet
    from webapp.authstore import AuthStore

    isolate_asyncio_per_greenlet()  # before zeroconf starts its loop (discovery)
    # --router is asked whether it routes to a session before the session is called Healthy.
    if args.router_admin_url:
        token = router_admin_token(args)
        registrar = AdminApiRegistrar(args.router_admin_url, auth=BearerAuth(token) if token else None,
                                      router_url=args.router)
    else:
        path = args.router_config or (args.state_dir / "router.yaml")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("backends: []\n")
        registrar = ConfigFileRegistrar(path, router_url=args.router)
    orch = Orchestrator(args.state_dir, registrar, discovery=args.discovery, lease_s=args.lease_s,
                        discovery_interfaces=args.discovery_interface).start()
    return create_app(orch, AuthStore(args.state_dir), args.router)


if __name__ == "__main__":
    # The same arguments as the pipeserve sub-command (a bare parser would lack them all).
    _parser = argparse.ArgumentParser(prog="python -m webapp.main")
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
