"""pipeserve: serve one language model too large for any single machine across the machines of a
LAN, with pipeline parallelism (the big picture: docs/architecture.md).

Sub-packages: `engine` (the stage and coordinator processes and their wire), `agent` (a node's
agent: its models and engine processes), `control` (the control plane inside the dashboard,
`webapp/`), `planner` (pure planning: which node runs which layers), `router` (the
OpenAI-compatible router) and `registrar` (putting a cluster into a router), `models` (what a
model directory is, read without loading it; the demo model), `testmodels` (random models of every
family, for tests), `httpkit` (the one HTTP toolkit) and `proc` (child processes, waits, clocks,
free ports). `cli` is the `pipeserve` command.
"""

__version__ = "0.1.0"
