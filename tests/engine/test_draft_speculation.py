"""A draft model on the coordinator, through real stage and coordinator processes and the official
`openai` client: greedy output with it equals greedy mlx-lm token for token, whether the draft
model agrees with the served one (itself: nearly every draft accepted) or not (a small random
sibling with the same tokenizer: most rejected); /metrics counts its passes. A draft model with
another tokenizer, or without speculative_tokens, is refused before anything starts."""

from __future__ import annotations

import openai
import pytest
import requests

from orchestrator.engine.config import ClusterSpec
from orchestrator.proc import wait_until
from tests.support.engine_harness import reference
from tests.support.tokenizers import with_swapped_tokens

PROMPT = [9, 8, 7, 3, 200, 41]
TOKENS = 24


def _spec(cluster) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1]) for line in
            requests.get(cluster.base_url + "/metrics", timeout=5).text.splitlines()
            if line.startswith("pipeserve_spec_") and line.split()[0].endswith("_total")}


def _greedy(cluster, model, speculating: bool = True) -> str:
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    # drafting starts once every stage's PONG said its caches roll back
    def ready() -> bool:
        stages = requests.get(cluster.base_url + "/health", timeout=5).json()["stages"]
        return not speculating or all(s.get("speculation") for s in stages)
    wait_until(ready, 30, message="the stages' PONGs saying they can speculate")
    got = client.completions.create(model=model.name, prompt=PROMPT, max_tokens=TOKENS, temperature=0)
    return got.choices[0].text


def _text(model, tokens: list[int]) -> str:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(model).decode(tokens)


@pytest.mark.parametrize("draft", ["itself", "sibling"])
def test_greedy_with_a_draft_model_equals_mlx_lm(model_factory, launch, draft):
    model = model_factory(layers=4)
    drafter = model if draft == "itself" else model_factory(layers=2, seed=3)
    cluster = launch(model, [(0, 1), (2, 3)], prefill_step_size=16, speculative_tokens=4, draft_model=str(drafter))
    cluster.wait_ready()
    plain = launch(model, [(0, 1), (2, 3)], prefill_step_size=16)
    plain.wait_ready()
    expected = reference(model, PROMPT, TOKENS, prefill_step=16)
    got, without = _greedy(cluster, model), _greedy(plain, model, speculating=False)
    assert got == without  # the text a client sees, by the same detokenizer
    assert got.lstrip() == _text(model, expected.tokens).lstrip()  # mlx-lm's tokens (decode drops a leading space)
    spec = _spec(cluster)
    assert spec["pipeserve_spec_passes_total"] > 0 and spec["pipeserve_spec_drafted_tokens_total"] > 0, spec
    rate = spec["pipeserve_spec_accepted_tokens_total"] / spec["pipeserve_spec_drafted_tokens_total"]
    if draft == "itself":
        assert rate > 0.8, spec  # its own drafts: the stages' verification accepts them
    else:
        assert rate < 0.8, spec  # another model's drafts: most are rejected, and the answer is still the target's


def test_a_draft_model_with_another_tokenizer_is_refused_before_the_coordinator_starts(model_factory, launch,
                                                                                     tmp_path):
    model = model_factory(layers=4)
    other = with_swapped_tokens(model_factory(layers=2, seed=3), tmp_path / "other-tokenizer")
    with pytest.raises(Exception, match="another tokenizer"):
        launch(model, [(0, 1), (2, 3)], speculative_tokens=4, draft_model=str(other), startup_timeout=60)


def test_a_draft_model_needs_speculative_tokens():
    with pytest.raises(ValueError, match="set speculative_tokens"):
        ClusterSpec(name="c", pipeline_parallel_size=2, draft_model="/models/small")
