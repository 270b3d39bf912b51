"""The control plane: node registry, prepare, ordered launch, health, recovery, teardown.

One `Orchestrator` thread (`core`) owns the state (`state.State`), fed through one inbox with
commands (`commands`, from the web or Python) and events (from workers doing I/O). Every rule
is the pure `decide.decide` (command -> events and effects) and `decide.react` (event ->
effects); state changes are the pure `transitions.apply`; `effects.EffectRunner` turns
effects into workers (`launcher`, `recovery`, `preparer`, `perf`) that talk to agents,
coordinators and the router and report back as events, as the `watcher` does.
"""
