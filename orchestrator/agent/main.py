"""`pipeserve agent`: run the node agent until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import re
import signal
import socket
from pathlib import Path

from orchestrator import logs, settings
from orchestrator.agent.report import parse_port_range, parse_size

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}")


def _name(text: str) -> str:
    if not _NAME.fullmatch(text):
        raise argparse.ArgumentTypeError("1-40 of A-Z a-z 0-9 _ -, starting with a letter or digit")
    return text


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ports(text: str) -> tuple[int, int]:
    try:
        return parse_port_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def default_state_dir(name: str) -> Path:
    """$XDG_STATE_HOME/pipeserve/agent-NAME (else ~/.local/state/...): one per agent name."""
    base = settings.XDG_STATE_HOME.read() or Path.home() / ".local" / "state"
    return base / "pipeserve" / f"agent-{name}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `pipeserve agent` options."""
    default_name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:40].strip("-") or "node"
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to serve on (default 127.0.0.1; the node's LAN address or 0.0.0.0 "
                             "to be reachable)")
    parser.add_argument("--port", type=int, default=39500, help="HTTP port (default 39500; 0 picks a free one)")
    parser.add_argument("--name", type=_name, default=default_name, help="node name shown in the dashboard")
    parser.add_argument("--models-dir", required=True, type=Path, help="directory holding one directory per model")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="identity, credentials, process records (default ~/.local/state/pipeserve/agent-NAME)")
    parser.add_argument("--memory-budget", type=_size, default=None, metavar="SIZE",
                        help="report at most this much memory, e.g. 300M or 2G (models a smaller node)")
    parser.add_argument("--transport-ports", type=_ports, default=(39600, 39629), metavar="START-END",
                        help="ports engine processes may use (default 39600-39629)")
    parser.add_argument("--no-advertise", dest="advertise", action="store_false", help="do not announce on zeroconf")
    parser.add_argument("--advertise-ttl", type=int, default=30, metavar="SECONDS",
                        help="TTL of the zeroconf records: how soon browsers forget a node that died (default 30)")
    parser.add_argument("--upload-limit", type=_size, default=None, metavar="SIZE",
                        help="bytes per second for serving model files to peers, e.g. 50M (default unlimited)")
    parser.add_argument("--reset-pairing", action="store_true",
                        help="print a new pairing token and revoke every credential")
    parser.add_argument("--log-level", default="INFO", choices=["INFO", "WARNING", "ERROR"])


def run(args: argparse.Namespace) -> int:
    """Start the agent and serve until SIGTERM/SIGINT; returns the exit status."""
    from orchestrator.agent.agent import Agent, AgentConfig

    log = logs.setup(f"agent-{args.name}", args.log_level)
    config = AgentConfig(name=args.name, host=args.host, port=args.port, models_dir=args.models_dir,
                         state_dir=args.state_dir or default_state_dir(args.name), memory_budget=args.memory_budget,
                         transport_ports=args.transport_ports, advertise=args.advertise,
                         advertise_ttl=max(1, args.advertise_ttl), upload_limit=args.upload_limit)
    try:
        agent = Agent(config, log)
        signal.signal(signal.SIGTERM, lambda *_: agent.request_stop())
        signal.signal(signal.SIGINT, lambda *_: agent.request_stop())
        token = agent.state.reset_pairing() if args.reset_pairing else agent.state.new_pairing_token
        if token:
            # Shown once (only its digest is stored), before anything else can fail. On stdout, so
            # a supervisor (the demo, a test) can capture it.
            print(f"pairing token: {token}  (node {config.name}; shown once, --reset-pairing makes a new one)",
                  flush=True)
        agent.start()
    except OSError as exc:
        log.error("agent.start_failed", reason=exc)
        return 3
    agent.advertise()
    agent.wait()
    agent.shutdown()
    return 0

