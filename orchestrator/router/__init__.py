"""`pipeserve router`: a small OpenAI-compatible router reading continuum-router's YAML.

Modules: `config` (the YAML), `health` (probes and the health state machine), `table`
(routing table and weighted round-robin), `proxy` (relaying a request), `service` (the
router's state), `server` (HTTP), `reload` (hot reload), `metrics`, `main` (the command).
Importing the package starts nothing.
"""
