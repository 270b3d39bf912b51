"""The scheduler is one class in four modules (pipeline, liveness, prompt_caching, speculation): no
half's declaration of a method another half supplies may shadow it in the MRO."""

from __future__ import annotations

import inspect

from orchestrator.engine.coordinator.pipeline import Pipeline


def test_every_method_resolves_to_a_body_not_a_stub():
    stubs = [name for name, fn in inspect.getmembers(Pipeline, inspect.isfunction)
             if inspect.getsource(fn).rstrip().endswith(": ...")]
    assert stubs == []
