"""pipeserve: serve one MLX model across several LAN nodes with pipeline parallelism.

Sub-packages: `engine` (stage workers and the coordinator), `models` (test and demo
models built offline), and the control plane (later: agent, planner, launcher).
"""

__version__ = "0.1.0"
