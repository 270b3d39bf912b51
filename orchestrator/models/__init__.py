"""Models built offline: deterministic random test models and the SmolLM2 demo import."""
