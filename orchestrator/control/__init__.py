"""The control plane: node registry, prepare, ordered launch, health, recovery, teardown.

The folders are the seam. `rules/` is the pure core: the state (`rules.state`), commands
(`rules.commands`, from the web or Python) and events (`rules.events`), every rule as the pure
`rules.decide.decide` (command -> events and effects) and `rules.decide.react` (event -> effects),
and state changes as the pure `rules.transitions.apply`. This package is the shell around it: one
`Orchestrator` thread (`core`) owns the state, fed through one inbox; `effects.EffectRunner` turns
effects into workers (`launcher`, `recovery`, `preparer`, `perf`, `models`) that talk to agents,
coordinators and the router and report back as events, as the `watcher` does; `bus` publishes
every applied event, `store` and `secrets` keep what survives a restart.
"""
