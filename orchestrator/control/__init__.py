"""The control plane: node registry, prepare, ordered launch, health, teardown.

One `Orchestrator` thread owns the state (`state.State`), fed through one inbox with
commands (from the web or Python) and events (from workers doing I/O). State changes are
pure functions (`transitions.apply`); workers (`launcher`, `preparer`, `watcher`) talk to
agents, coordinators and the router, and report back as events.
"""
