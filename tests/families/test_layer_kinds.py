"""Which layers are alike (families/layer_kinds.py), so a timing of a few stands for all: read
from real test models' safetensors headers and configs, and the run that is timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engine.profiling.layers import body_plan
from orchestrator.engine.stage.shard import ModelInfo, read_config
from orchestrator.families import layer_kinds, support
from orchestrator.testmodels.families import build_family_model
from orchestrator.testmodels.llama import make_test_model


def _kinds(model: Path) -> list[str]:
    return layer_kinds.layer_kinds(layer_kinds.tensor_headers(model), read_config(model),
                                   ModelInfo.read(model).num_layers)


def _plan(model: Path, every: bool = False) -> tuple[int, int]:
    cfg = read_config(model)
    return body_plan(model, ModelInfo.read(model).num_layers, 64, support.shared_kv_cuts(cfg), every)


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, Path] = {}

    def build(name: str, **overrides: object) -> Path:
        key = name + "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
        if key not in made:
            made[key] = build_family_model(tmp_path_factory.mktemp(name) / name, name,
                                           config_overrides=overrides or None)
        return made[key]

    return build


# --- pure: the run that stands for all ----------------------------------------------------

@pytest.mark.parametrize("kinds, expected", [
    (["a"] * 29, 2),                    # all alike: the fewest
    (["a", "b"] * 8, 2),                # alternating: one of each
    (["s", "s", "g"] * 6, 3),           # Gemma's sliding, sliding, global: one period
    (["m", "m", "m", "a"] * 4, 4),      # a hybrid (Mamba with attention every 4th): one period
    (["d", "e", "e"], 3),               # dense first, then experts, too few to balance: all of them
    (["d"] * 3 + ["e"] * 5, 8),         # a few dense layers first never balance early: all
    ([], 0),
])
def test_the_shortest_balanced_run_from_the_first_layer(kinds, expected):
    assert layer_kinds.timed_layers(kinds, 64) == expected


def test_a_long_dense_then_experts_run_keeps_every_share_within_the_slack():
    kinds = ["d"] * 3 + ["e"] * 57  # DeepSeek-V3's body: 3 dense, then experts
    m = layer_kinds.timed_layers(kinds, 64)
    assert abs(kinds[:m].count("d") / m - 3 / 60) <= layer_kinds.SHARE_SLACK and m >= 30


def test_the_run_ends_where_a_stage_may_and_at_most_at_the_cap():
    assert layer_kinds.timed_layers(["a"] * 10, 64, refused={2}) == 3  # a split after layer 2 is refused
    assert layer_kinds.timed_layers(["d"] + ["e"] * 20, 8) == 8  # never balances: the cap, as before
    assert layer_kinds.timed_layers(["a", "b"] * 3, 64, refused=set(range(1, 7))) == 0


def test_a_quantized_layer_is_another_kind_than_the_same_layer_in_float():
    layer = {"model.layers.{i}.mlp.up_proj.weight": ("F32", (128, 64)),
             "model.layers.{i}.self_attn.q_proj.weight": ("F32", (64, 64))}
    tensors = {k.format(i=i): v for i in range(2) for k, v in layer.items()}
    tensors["model.layers.1.mlp.up_proj.weight"] = ("U32", (128, 8))
    tensors["model.layers.1.mlp.up_proj.scales"] = ("F32", (128, 1))
    kinds = layer_kinds.layer_kinds(tensors, {"model_type": "llama"}, 2)
    assert kinds[0] != kinds[1]
    assert layer_kinds.layer_bytes(tensors, 2) == [(128 * 64 + 64 * 64) * 4, 128 * 8 * 4 + 64 * 64 * 4 + 128 * 4]


# --- real models: headers and configs read from disk --------------------------------------

def test_a_dense_models_layers_are_all_alike_and_two_are_timed(tmp_path):
    model = make_test_model(tmp_path / "m", layers=6, hidden=64)
    kinds = _kinds(model)
    assert len(set(kinds)) == 1 and len(kinds) == 6
    timed, untimed = _plan(model)
    per_layer = layer_kinds.layer_bytes(layer_kinds.tensor_headers(model), 6)[0]
    assert (timed, untimed) == (2, 3 * per_layer)  # the body is layers 0-4: 2 timed, 3 read instead
    assert _plan(model, every=True) == (5, 0)


@pytest.mark.parametrize("name, pattern_key", [
    ("plamo3", "sliding_window_pattern"),   # S S F: the same weights, fewer keys attended
    ("spark2_5", "layer_types"),            # sliding_attention, sliding_attention, full_attention
    ("baichuan_m1", "sliding_window_layers"),
])
def test_a_sliding_window_layer_is_another_kind_than_a_global_one_with_the_same_weights(family, name, pattern_key):
    model = family(name)
    assert pattern_key in read_config(model)
    kinds = _kinds(model)
    headers = layer_kinds.tensor_headers(model)
    sizes = layer_kinds.layer_bytes(headers, len(kinds))
    glob = next((i for i, k in enumerate(kinds) if k != kinds[0]), None)  # layer 0 is windowed in each
    assert glob is not None, "every layer of one kind: the pattern was not read"
    assert sizes[glob] == sizes[0]  # the weights alone cannot tell them apart


def test_a_hybrid_is_timed_over_a_run_holding_each_of_its_kinds_in_its_share(family):
    # jamba: Mamba with attention at layers 1 and 4, experts at odd layers (6 layers)
    model = family("jamba", num_hidden_layers=12)
    kinds = _kinds(model)
    assert len(set(kinds)) >= 3
    timed, _ = _plan(model)
    body = kinds[:11]
    assert 2 <= timed <= 11 and set(kinds[:timed]) == set(body)
    for k in set(body):
        assert abs(kinds[:timed].count(k) / timed - body.count(k) / len(body)) <= layer_kinds.SHARE_SLACK


def test_a_mixture_of_experts_model_with_dense_first_layers_is_timed_whole(family):
    model = family("deepseek_v3")  # layer 0 dense, then experts: FD FE FE FE
    kinds = _kinds(model)
    assert kinds[0] != kinds[1] == kinds[2] == kinds[3]
    assert _plan(model) == (3, 0)


def test_weights_whose_headers_cannot_be_read_are_timed_whole(tmp_path):
    model = make_test_model(tmp_path / "m", layers=6, hidden=64)
    (model / "model.safetensors").write_bytes(b"\xff" * 16)  # a header of 2**64 - 1 bytes
    assert _plan(model) == (5, 0)
