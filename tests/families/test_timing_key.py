"""The reuse key of a timing (families/timing_key.py): equal for models one timing stands for,
different when family, shapes, dtype, quantization or backend differ (pure)."""

from __future__ import annotations

from orchestrator.families.timing_key import timing_key, timing_parts

CONFIG = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 512, "torch_dtype": "float32"}
TENSORS = {**{f"model.layers.{i}.mlp.up_proj.weight": ("F32", (128, 64)) for i in range(2)},
           "model.embed_tokens.weight": ("F32", (512, 64))}
BACKEND = {"blas": ["openblas"], "threads": [1, 1], "cpus": 2}


def key(config=CONFIG, tensors=TENSORS, backend=BACKEND) -> str:
    return timing_key(timing_parts(config, tensors, backend))


def test_the_same_shapes_give_the_same_key_whatever_the_name():
    assert key() == key(config={**CONFIG, "_name_or_path": "someone/fine-tune"})


def test_each_part_changes_the_key():
    others = [
        key(config={**CONFIG, "model_type": "mistral"}),                                       # family
        key(config={**CONFIG, "num_key_value_heads": 4}),                                      # shape
        key(tensors={**TENSORS, "model.embed_tokens.weight": ("F32", (1024, 64))}),            # head
        key(config={**CONFIG, "quantization": {"group_size": 64, "bits": 4}}),                 # quantization
        key(tensors={k: ("BF16", s) for k, (_, s) in TENSORS.items()}),                        # dtype
        key(backend={**BACKEND, "threads": [2, 2]}),                                           # backend
        key(config={**CONFIG, "num_hidden_layers": 3},                                         # shares of kinds
            tensors={**TENSORS, "model.layers.2.mlp.up_proj.weight": ("F32", (256, 64))}),
    ]
    assert len({key(), *others}) == 1 + len(others)


def test_more_layers_of_the_same_kind_share_the_key():
    # a per-layer figure does not depend on how many such layers there are
    deeper = {**TENSORS, **{f"model.layers.{i}.mlp.up_proj.weight": ("F32", (128, 64)) for i in range(2, 8)}}
    assert key(config={**CONFIG, "num_hidden_layers": 8}, tensors=deeper) == key()
