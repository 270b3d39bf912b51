"""The control plane's pure core: rules over pydantic values, no I/O (tests/control/test_purity.py).

The state (`state`, `download_state`), what happened (`events`, `event_base`, `download_events`,
`timing_events`), what is asked (`commands`), the rules (`decide`, `model_rules`, `planning`,
`relocation`, `verification`), how events change the state (`transitions.apply`) and the builders
they use (`timelines`, `measured`, `session_toml`, `chart_samples`, `lease`, `process_ends`), and
the wording of the audit log (`audit`). The shell around it — the orchestrator thread, the effect
runner and its workers, the watcher, the coordinator client, the store, the secrets, the event bus
— is `orchestrator/control/`; nothing here imports it.
"""
