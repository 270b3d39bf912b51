"""llguidance's tokenizer is built at the coordinator's start, never on a request's thread.

Its build holds Python's lock for its whole length (seconds on a loaded machine), so built on the
first `response_format` request it silenced /health and the watcher replaced the coordinator. In
process, with the test model's real tokenizer: once prepared, a constrained request builds nothing
(llguidance's constructor is made to fail); a coordinator that cannot constrain says why at start.
"""

from __future__ import annotations

from types import SimpleNamespace

import llguidance
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from orchestrator.engine.coordinator.api import Coordinator
from orchestrator.engine.coordinator.metrics import Metrics
from orchestrator.logs import EventLogger

SCHEMA = {"type": "json_schema", "json_schema": {"name": "n", "schema": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}


def coordinator(model_dir) -> Coordinator:
    pipeline = SimpleNamespace(context_length=4096)  # only read for the context limit of a prepared request
    return Coordinator(pipeline, load_tokenizer(model_dir), model_dir.name, Metrics(["stage-0"]), EventLogger("t"),
                       model_dir=model_dir)


def test_a_prepared_coordinator_builds_nothing_on_its_first_constrained_request(test_model_dir, monkeypatch):
    c = coordinator(test_model_dir)
    assert c.prepare_grammars() == ""

    def no_build(*_: object, **__: object) -> None:
        raise AssertionError("llguidance's tokenizer built on a request's thread")

    monkeypatch.setattr(llguidance, "LLTokenizer", no_build)
    _, _, params = c.prepare("chat", {"model": test_model_dir.name, "response_format": SCHEMA,
                                      "messages": [{"role": "user", "content": "hi"}]})
    assert params.grammar


def test_a_coordinator_without_a_tokenizer_file_says_why_at_start(test_model_dir, tmp_path):
    c = coordinator(test_model_dir)
    c._grammar_tokens.model_dir = tmp_path  # a model directory without tokenizer.json
    assert "tokenizer.json" in c.prepare_grammars()
    with pytest.raises(Exception, match="tokenizer.json"):
        c.prepare("chat", {"model": test_model_dir.name, "response_format": SCHEMA,
                           "messages": [{"role": "user", "content": "hi"}]})
