"""A checkpoint's config.json as it ships, through every process: agent, planner, coordinator.

Each case builds a family test model with its published config layout (the decoder's keys
nested under `text_config` with a vision tower beside it; the layer count as `num_layers`;
flat `num_hidden_layers`), then: the node agent's inventory describes it (the model report),
the planner splits it into three stages from that description, and real stage processes
plus the coordinator process serve it through the official `openai` client. The tokens and
log-probs must be mlx-lm's own, and the coordinator's context length the checkpoint's.
Before the one reading of decoder_config.py, the coordinator refused the first two layouts
("model has None layers") after the agent and the planner had accepted them.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
import requests

from orchestrator import logs
from orchestrator.agent.inventory import Inventory
from orchestrator.engine.config import parse_layers
from orchestrator.families.decoder_config import ModelConfigError, decoder_facts
from orchestrator.planner import Plan, PlanSettings, plan_cluster
from orchestrator.testmodels.families import FAMILIES, build_family_model
from tests.support.builders import GB, facts_for
from tests.support.engine_harness import reference

PROMPT = [(i * 37 + 11) % 500 for i in range(24)]
TOKENS = 8

LAYOUTS = {
    "qwen3_5_moe": "text_config nested, vision_config and model.visual.* tensors beside it",
    "longcat_flash": "num_layers instead of num_hidden_layers",
    "llama": "flat num_hidden_layers (the common case)",
    "deepseek_v41": "text_config nested; residual streams, their pre-mix and compressed K/V cross the boundaries",
    "gemma3n": "text_config nested beside vision and audio towers; AltUp streams and per-layer inputs cross",
}
# Every other family whose published config is not flat num_hidden_layers: its decoder under text_config
# (the multimodal checkpoints), or another name for the layer count (num_layers, n_layer, n_layers).
_COUNT_KEYS = ("num_layers", "n_layer", "n_layers")
LAYOUTS.update({name: "text_config nested" if spec.text_config else "layer count as " + next(
    k for k in _COUNT_KEYS if k in spec.config) for name, spec in FAMILIES.items()
    if name not in LAYOUTS and (spec.text_config or any(k in spec.config for k in _COUNT_KEYS))})


# The context the coordinator serves is the checkpoint's (not the 4096 fallback), checked on the first cases.
_CHECKED_CONTEXT = ("qwen3_5_moe", "longcat_flash", "llama", "deepseek_v41", "gemma3n")


@pytest.mark.parametrize("family", sorted(LAYOUTS))
def test_published_layout_serves_through_agent_planner_and_coordinator(tmp_path: Path, launch, family: str) -> None:
    models = tmp_path / "models"
    model = build_family_model(models / family, family)
    config = json.loads((model / "config.json").read_text())
    spec = FAMILIES[family]
    if family == "qwen3_5_moe":
        assert "num_hidden_layers" not in config and "vision_config" in config
        assert config["vision_config"]["num_hidden_layers"] != len(spec.layers)
    if family == "longcat_flash":
        assert "num_layers" in config and "num_hidden_layers" not in config

    info = Inventory(models, tmp_path / "cache.json", logs.get("test")).describe(family)  # the agent's report
    assert info.mlx_format and info.supported, (info.reason, info.unsupported_reason)
    assert info.num_layers == len(spec.layers) == info.description.num_layers
    settings = PlanSettings(context_length=512, max_concurrent_sequences=2)
    plan = plan_cluster(info.description, facts_for(8 * GB, 8 * GB, 8 * GB), settings)  # the planner
    assert isinstance(plan, Plan), plan
    splits = [parse_layers(s.layers) for s in plan.stages]
    assert len(splits) == 3 and splits[-1][1] == len(spec.layers)

    cluster = launch(model, [(a, b - 1) for a, b in splits])  # real stages and the coordinator process
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    got = client.completions.create(model=model.name, prompt=PROMPT, max_tokens=TOKENS, temperature=0, logprobs=1)
    expected = reference(model, PROMPT, TOKENS)
    n = len(got.choices[0].logprobs.token_logprobs)  # fewer when mlx-lm's next token ends the answer
    assert n == TOKENS or (got.choices[0].finish_reason == "stop" and n == TOKENS - 1)
    assert got.choices[0].logprobs.token_logprobs == expected.logprobs[:n]
    context = decoder_facts(config).max_position_embeddings
    if family not in _CHECKED_CONTEXT:
        return
    assert context is not None and context != 4096
    too_long = requests.post(cluster.base_url + "/v1/completions", timeout=30,
                             json={"model": model.name, "prompt": [1] * (context + 1), "max_tokens": 1})
    assert too_long.status_code == 400 and f"maximum context length is {context}" in too_long.text


def test_decoder_facts_read_every_layout() -> None:
    flat = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 10,
            "max_position_embeddings": 99}
    nested = {"model_type": "gemma3", "vision_config": {"num_hidden_layers": 27, "hidden_size": 8},
              "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 6, "hidden_size": 64,
                              "max_position_embeddings": 131072}}
    facts = decoder_facts(nested)
    assert (facts.model_type, facts.num_layers, facts.hidden_size) == ("gemma3", 6, 64)
    assert facts.vocab_size == 262208  # gemma3.py's default when the checkpoint gives none
    assert facts.max_position_embeddings == 131072 and facts.nested and facts.towers == ("vision_config",)
    assert decoder_facts({**flat, "num_hidden_layers": None, "num_layers": 5}).num_layers == 5
    gpt2 = {"model_type": "gpt2", "n_layer": 3, "n_embd": 8, "n_positions": 64}
    assert decoder_facts(gpt2).max_position_embeddings == 64
    assert decoder_facts({"model_type": "nemotron_h", "hybrid_override_pattern": "M*M-"}).num_layers == 4
    with pytest.raises(ModelConfigError, match="num_hidden_layers must be a positive integer"):
        decoder_facts({**flat, "num_hidden_layers": "4"})
    with pytest.raises(ModelConfigError, match="text_config gives no layer count"):
        decoder_facts({"model_type": "mistral3", "text_config": {"hidden_size": 8}})
