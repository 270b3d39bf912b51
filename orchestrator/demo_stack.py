"""`make demo`: three node agents, the router and the dashboard on 127.0.0.1 (README "Two commands").

The real SmolLM2-135M-Instruct model (imported once into the pipeserve cache, reused after)
is placed on ONE node only; every node reports a memory budget too small for the whole
model but large enough for a share of it, so the newcomer must split it, and Prepare really
copies it from node to node over the LAN path. The demo prints the dashboard's URL, its
admin token and each node's address and pairing token, then serves until Ctrl-C, which
stops every process it started (and the engine processes their agents started).

Each run starts from a clean slate under --dir (node state, dashboard state, router config
and logs are recreated), so the tokens printed are always the ones that work.

`Demo` is also what the browser tests (e2e/) start, on free ports.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import settings
from orchestrator.agent.local_agent import SHARED_HOST_BLAS, LocalAgent
from orchestrator.proc import ChildError, ChildProcess, free_port, free_port_block, kill_marked, port_free, stop_all
from orchestrator.router.local import LocalRouter

MODEL_ID = "SmolLM2-135M-Instruct"
NODE_NAMES = ("node-a", "node-b", "node-c")
# What each node reports as its memory. SmolLM2 in float32 at the dashboard's default plan
# (context 4096 tokens, 4 sequences) needs 1489 MiB on one node (weights 513 MiB, KV cache
# 720 MiB, stage and coordinator overhead 256 MiB) but at most 964 MiB per node when split in
# two (the planner's split, 88% of 1100 MiB): 1100 MiB fits on no single node, and on any two
# or three (checked at start). Contexts down to 2048 tokens keep it that way.
DEFAULT_BUDGET = "1100M"
# The node holding the model serves it to its peers at about a gigabit LAN's speed, so the
# copy's progress bars are there to watch.
DEFAULT_UPLOAD_LIMIT = "110M"
DEFAULT_PORTS = {"dashboard": 8080, "router": 8000, "agents": (39500, 39501, 39502)}
TRANSPORT_DEFAULT = (39600, 39629)  # the dashboard's default Transport port range
STARTUP_TIMEOUT = 30.0


class DemoError(RuntimeError):
    """A process of the demo did not come up; the message carries its output."""


@dataclass
class Demo:
    """The demo's processes: agents, router, dashboard (all real, on 127.0.0.1)."""

    root: Path
    dashboard_port: int
    router_port: int
    nodes: list[LocalAgent]
    budget: str = DEFAULT_BUDGET
    upload_limit: str | None = DEFAULT_UPLOAD_LIMIT
    discovery: bool = True
    health_interval: str = "1s"
    settings: dict | None = None  # dashboard settings to start with (e.g. a transport range)
    dashboard_args: list[str] = field(default_factory=list)  # more options of `pipeserve dashboard`
    python: str = sys.executable
    children: list[ChildProcess] = field(default_factory=list)
    router: LocalRouter | None = None
    admin_token: str | None = None

    @classmethod
    def on_ports(cls, root: Path, *, dashboard_port: int, router_port: int, agent_ports: list[int],
                 transport: tuple[int, int], preset_settings: bool = True, **kw) -> "Demo":
        """Three nodes whose transport ranges split `transport` in equal consecutive parts; with
        `preset_settings`, a `transport` other than the dashboard's default range is written into
        the dashboard's first-run settings (distributed serving still off: the user turns it on)."""
        n = len(agent_ports)
        width = (transport[1] - transport[0] + 1) // n
        nodes = [LocalAgent(name, Path(root) / "nodes" / name, port,
                            (transport[0] + i * width, transport[0] + (i + 1) * width - 1))
                 for i, (name, port) in enumerate(zip(NODE_NAMES, agent_ports))]
        settings = None
        if preset_settings and transport != TRANSPORT_DEFAULT:
            settings = {"distributed_enabled": False, "transport_backend": "tcp",
                        "port_start": transport[0], "port_end": transport[1]}
        return cls(root=Path(root), dashboard_port=dashboard_port, router_port=router_port, nodes=nodes,
                   settings=settings, **kw)

    # --- paths and URLs --------------------------------------------------------------
    @property
    def marker(self) -> str:
        """A string in the command line of every process the demo (or its agents) starts: the
        directory, with a trailing separator so that ".demo1" never matches ".demo"."""
        return os.path.join(str(self.root.resolve()), "")

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def router_yaml(self) -> Path:
        return self.root / "router.yaml"

    @property
    def dashboard_state(self) -> Path:
        return self.root / "dashboard"

    # --- start and stop ----------------------------------------------------------------
    def clean(self) -> list[int]:
        """Stop leftovers of an earlier run (its processes name this directory) and remove its
        state; returns the pids that had to be killed."""
        killed = kill_marked(self.marker)
        for sub in ("nodes", "dashboard", "logs"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        self.router_yaml.unlink(missing_ok=True)
        return killed

    def start(self, model_src: Path) -> "Demo":
        """Place the model on the first node, start everything and wait until each answers.
        Raises DemoError (with the failing process's output) after stopping what started."""
        try:
            self._start(model_src)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str], append: bool = False) -> ChildProcess:
        # die_with_parent: a demo killed with SIGKILL takes its children along (they run in
        # sessions of their own, so Ctrl-C reaches only the demo, which stops them in order).
        child = ChildProcess.spawn(name, argv, self.root / "logs" / f"{name}.log", die_with_parent=True, append=append,
                                   env={**settings.process_environment(), "PYTHONUNBUFFERED": "1", **SHARED_HOST_BLAS})
        self.children.append(child)
        return child

    def _start(self, model_src: Path) -> None:
        self.nodes[0].models_dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(model_src, self.nodes[0].models_dir / MODEL_ID)
        import yaml

        self.router_yaml.write_text(yaml.safe_dump({
            "backends": [],
            "health_checks": {"enabled": True, "interval": self.health_interval, "timeout": "2s",
                              "unhealthy_threshold": 1, "healthy_threshold": 1, "endpoint": "/v1/models"}},
            sort_keys=False))
        if self.settings:
            self.dashboard_state.mkdir(parents=True, exist_ok=True, mode=0o700)
            (self.dashboard_state / "control.json").write_text(json.dumps({"settings": self.settings}))
        for i, node in enumerate(self.nodes):
            node.args = ["--memory-budget", self.budget]
            if i == 0 and self.upload_limit:
                node.args += ["--upload-limit", self.upload_limit]
            if not self.discovery:
                node.args.append("--no-advertise")
            # Logs beside the router's and the dashboard's; die_with_parent for the reason `_spawn` gives.
            node.log_dir, node.die_with_parent, node.python = self.root / "logs", True, self.python
            self.children.append(node.launch().proc)
        self.router = LocalRouter(self.router_yaml, self.router_port, self.root / "logs" / "router.log",
                                  env=SHARED_HOST_BLAS, die_with_parent=True, python=self.python)
        self.children.append(self.router.launch().proc)
        dashboard = self.start_dashboard(wait=False)  # it starts while the others do
        try:
            for node in self.nodes:
                if node.wait_ready(STARTUP_TIMEOUT).token is None:
                    raise ChildError(f"{node.name} printed no pairing token:\n{node.output()}")
            self.router.wait_ready(STARTUP_TIMEOUT)
            self.admin_token = dashboard.wait_ready(lambda: dashboard.printed(r"admin token: (\S+)"), "admin token",
                                                    STARTUP_TIMEOUT)
            self._wait_answering(dashboard)
        except ChildError as exc:
            raise DemoError(str(exc)) from None

    def start_dashboard(self, wait: bool = True) -> ChildProcess:
        """Start the dashboard over its state directory (again, after `stop_dashboard`), with
        `wait` until it answers (ChildError, with its output, when it does not)."""
        argv = [self.python, "-m", "orchestrator.cli", "dashboard", "--host", "127.0.0.1",
                "--port", str(self.dashboard_port), "--state-dir", str(self.dashboard_state),
                "--router", self.router_url, "--router-config", str(self.router_yaml), "--threads", "32",
                *(["--discovery", "--discovery-interface", "127.0.0.1"] if self.discovery else ["--no-discovery"]),
                *self.dashboard_args]
        dashboard = self._spawn("dashboard", argv, append=self.admin_token is not None)  # a restart: one log
        if wait:
            self._wait_answering(dashboard)
        return dashboard

    def _wait_answering(self, dashboard: ChildProcess) -> None:
        import requests

        dashboard.wait_ready(lambda: requests.get(self.dashboard_url + "/login", timeout=2).status_code == 200,
                             "answer on " + self.dashboard_url, STARTUP_TIMEOUT)

    def stop_dashboard(self) -> None:
        """Stop the dashboard alone, as SIGTERM does (agents, router and engines keep running)."""
        dashboard = [c for c in self.children if c.name == "dashboard"]
        stop_all(dashboard, timeout=20.0)
        self.children = [c for c in self.children if c not in dashboard]

    def dead(self) -> list[ChildProcess]:
        """Children that exited although nobody stopped them."""
        return [c for c in self.children if not c.alive()]

    def stop(self) -> list[int]:
        """Stop the dashboard, then the agents (which stop their engine processes), then the
        router; finally kill anything left that names the demo's directory. Returns the pids
        of such leftovers (none when every agent cleaned up after itself)."""
        dashboard = [c for c in self.children if c.name == "dashboard"]
        agents = [n.proc for n in self.nodes if n.proc is not None]
        router = [self.router.proc] if self.router is not None and self.router.proc is not None else []
        for group in (dashboard, agents, router):
            stop_all(group, timeout=20.0)
        self.children.clear()
        return kill_marked(self.marker)


def check_budget(model_dir: Path, budget: int, nodes: int) -> list[str]:
    """Warnings when the budget does not make the demo's point: the model must fit on no
    single node at the default plan settings, yet fit across two nodes."""
    from orchestrator.models.describe import describe_model
    from orchestrator.planner import NodeFacts, PlanSettings, StageCosts, plan_cluster

    model = describe_model(model_dir)
    settings = PlanSettings()
    problems = []
    single = StageCosts(model, settings).single_node_bytes()
    if single <= budget:
        problems.append(f"the model ({single / 2**30:.2f} GiB with its KV cache) fits on one node")
    facts = [NodeFacts(id=f"n{i}", name=f"n{i}", accelerator="linux-cpu", engine_version="demo", free_bytes=budget,
                       free_ports=tuple(range(settings.port_start, settings.port_end + 1)), host=f"10.0.0.{i}")
             for i in range(min(2, nodes))]
    if plan_cluster(model, facts, settings, model_name=MODEL_ID).kind != "plan":
        problems.append("the model does not fit on two nodes")
    return problems


def _pick(port: int, taken: set[int]) -> int:
    chosen = port if port_free(port) and port not in taken else free_port()
    taken.add(chosen)
    return chosen


def main(argv: list[str] | None = None) -> int:
    """Run the demo until Ctrl-C; returns the exit status."""
    settings.exit_on_bad_settings(program="demo_stack")
    parser = argparse.ArgumentParser(prog="python -m orchestrator.demo_stack", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(".demo"), help="where node state and logs go (default .demo)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORTS["dashboard"], help="dashboard port (default 8080)")
    parser.add_argument("--router-port", type=int, default=DEFAULT_PORTS["router"], help="router port (default 8000)")
    parser.add_argument("--memory-budget", default=DEFAULT_BUDGET, help=f"per node (default {DEFAULT_BUDGET})")
    parser.add_argument("--upload-limit", default=DEFAULT_UPLOAD_LIMIT,
                        help=f"bytes/s the first node serves the model at (default {DEFAULT_UPLOAD_LIMIT}; "
                             "0: unlimited)")
    parser.add_argument("--no-discovery", dest="discovery", action="store_false",
                        help="no zeroconf (nodes are added by address and token only)")
    args = parser.parse_args(argv)

    from orchestrator.agent.report import parse_size
    from orchestrator.models.demo import cached_demo_model

    try:
        budget = parse_size(args.memory_budget)
    except ValueError as exc:
        parser.error(str(exc))
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    taken: set[int] = set()
    transport = free_port_block(TRANSPORT_DEFAULT[1] - TRANSPORT_DEFAULT[0] + 1, prefer=TRANSPORT_DEFAULT[0])
    taken.update(range(transport[0], transport[1] + 1))
    demo = Demo.on_ports(root, dashboard_port=_pick(args.port, taken), router_port=_pick(args.router_port, taken),
                         agent_ports=[_pick(p, taken) for p in DEFAULT_PORTS["agents"]], transport=transport,
                         budget=args.memory_budget,
                         upload_limit=None if args.upload_limit in ("0", "") else args.upload_limit,
                         discovery=args.discovery)
    leftovers = demo.clean()
    if leftovers:
        print(f"demo: stopped {len(leftovers)} process(es) left over from an earlier run in {root}", file=sys.stderr)

    def progress(step: str, done: int, total: int) -> None:
        if done == 0:
            print(f"demo: importing {MODEL_ID}: {step}...", file=sys.stderr, flush=True)

    print(f"demo: getting {MODEL_ID} (imported once into the pipeserve cache, reused after)", file=sys.stderr)
    try:
        model = cached_demo_model("float32", progress=progress)
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"demo: could not import the model: {exc}", file=sys.stderr)
        return 1
    for problem in check_budget(model, budget, len(demo.nodes)):
        print(f"demo: warning: with --memory-budget {args.memory_budget}, {problem}", file=sys.stderr)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print("demo: starting three node agents, the router and the dashboard ...", file=sys.stderr, flush=True)
    try:
        demo.start(model)
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    print(banner(demo), flush=True)
    status = 0
    try:
        while not stop.wait(1.0):
            dead = demo.dead()
            if dead:
                for c in dead:
                    print(f"demo: {c.name} {c.describe_exit()}:\n{c.output()}", file=sys.stderr)
                status = 1
                break
    finally:
        print("demo: stopping ...", file=sys.stderr, flush=True)
        leftovers = demo.stop()
        note = f" (killed {len(leftovers)} leftover process(es))" if leftovers else ""
        print(f"demo: stopped every process{note}. Logs: {root / 'logs'}", file=sys.stderr)
    return status


def banner(demo: Demo) -> str:
    """What a newcomer needs to walk the whole flow (README "Two commands")."""
    t = demo.settings or {"port_start": TRANSPORT_DEFAULT[0], "port_end": TRANSPORT_DEFAULT[1]}
    nodes = "\n".join(f"    {n.name}  address {n.address}  pairing token {n.token}"
                      f"{'   (holds ' + MODEL_ID + ')' if i == 0 else ''}" for i, n in enumerate(demo.nodes))
    return f"""
pipeserve demo is running.

  Dashboard    {demo.dashboard_url}
  Admin token  {demo.admin_token}
  Router       {demo.router_url}/v1   (OpenAI-compatible; chat works here once a model is served)

  Node agents (each reports {demo.budget} of memory: the model fits on no single one):
{nodes}

Walk-through:
  1. Open the dashboard and log in with the admin token.
  2. Settings: check "Enable distributed serving" (transport ports {t['port_start']}-{t['port_end']}) and Save.
  3. Models > Distributed: "Add node" for each node above with its address and pairing token
     {'(or use "Register" next to a discovered node, with its token)' if demo.discovery else ''}.
  4. Serve as cluster: Model {MODEL_ID}, two or three nodes, "Preview shard plan".
  5. "Prepare on all nodes" copies the model from {demo.nodes[0].name} to the others; then "Launch cluster".
  6. Chat: pick {MODEL_ID}, ask "What is the capital of France?".
     Or: curl -s {demo.router_url}/v1/chat/completions -H 'Content-Type: application/json' \\
           -d '{{"model": "{MODEL_ID}", "temperature": 0,
                "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

Logs: {demo.root / 'logs'}    Press Ctrl-C to stop everything.
"""


if __name__ == "__main__":
    sys.exit(main())
