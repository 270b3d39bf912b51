"""Models of the emulated-node benchmark (`e2e.bench.nodes`): the demo's SmolLM2 (as `make bench`
has always measured) and random-weight qwen2 models built with the project's own builder
(`orchestrator.testmodels.families.build_family_model`, what `pipeserve make-test-model --family qwen2`
runs), one whose decoder layers dominate its compute (a 512-entry vocabulary: the head is < 1 %).

qwen2 is a family both peers serve: `mlx_lm.server` and mlx-lm's own pipeline (`--pipeline` needs the
model's class to have `pipeline()`, and `model.safetensors.index.json` beside the weights, which a
one-file model lacks: `prepare` writes it). Generated once into the model cache, keyed by the
shape and the builder's code. Runs in a worker subprocess (`python -m e2e.bench.node_models NAME`),
so that the benchmark process never imports MLX.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import MappingProxyType

# name -> (description, build_family_model config_overrides)
QWEN2_MODELS = MappingProxyType({
    # Layers dominate: 16 layers of hidden 1024 (16 query heads of 64 over 4 KV heads, 2.75x MLP), float32.
    "qwen2-l16h1024": ("qwen2, 16 layers of hidden 1024 (MLP 2816, 16/4 heads), vocab 512, float32, ~200 M",
                       {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 16,
                        "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 16384,
                        "tie_word_embeddings": True}),
    # The smoke test's: seconds to build and to serve.
    "qwen2-tiny": ("qwen2, 4 layers of hidden 64, vocab 512, float32 (smoke test)",
                   {"num_hidden_layers": 4, "max_position_embeddings": 8192}),
})
MODELS = ("smollm2", *QWEN2_MODELS)


def describe(name: str) -> str:
    """The model in words, for the table."""
    if name == "smollm2":
        return "SmolLM2-135M-Instruct, float32 (30 layers of hidden 576, vocab 49152: the head ~ 8 layers)"
    return QWEN2_MODELS[name][0]


def family(name: str) -> str:
    """The model's family (mlx-lm's pipeline serves qwen2 here, not SmolLM2's llama)."""
    return "llama" if name == "smollm2" else "qwen2"


def end_tokens(model_dir: Path) -> list[int]:
    """Every id that may end an answer of this model, in any server here: the tokenizer's `eos_token`
    (what pipeserve's coordinator stops on) and config.json's and generation_config.json's
    `eos_token_id` (an int or a list; mlx-lm takes the second where both are given). A union: a bias
    against one id too many costs nothing, one too few lets answers end early."""
    from orchestrator.engine.stage.constraint import model_eos_ids

    ids = set(model_eos_ids(model_dir))
    for name in ("config.json", "generation_config.json"):
        try:
            found = json.loads((model_dir / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        ids |= {found} if isinstance(found, int) else {t for t in found or () if isinstance(t, int)}
    return sorted(ids)


def _write_index(path: Path) -> None:
    """model.safetensors.index.json for a one-file model (mlx-lm's pipeline loader reads it)."""
    index = path / "model.safetensors.index.json"
    if index.exists() or not (path / "model.safetensors").exists():
        return
    import mlx.core as mx

    weights = mx.load(str(path / "model.safetensors"))
    index.write_text(json.dumps({"metadata": {"total_size": sum(v.nbytes for v in weights.values())},
                                 "weight_map": {k: "model.safetensors" for k in sorted(weights)}}, indent=1))


def prepare(name: str) -> Path:
    """The directory of model `name`, generated once into the cache."""
    if name == "smollm2":
        from e2e.bench.models import prepare as prepare_bench_model

        path = prepare_bench_model("smollm2")
        return path
    if name not in QWEN2_MODELS:
        raise SystemExit(f"unknown model {name!r}; choose from {list(MODELS)}")
    from e2e.bench.models import _code_digest, _fresh
    from orchestrator.models import files
    from orchestrator.models.demo import cache_root
    from orchestrator.testmodels import families

    overrides = QWEN2_MODELS[name][1]
    path = _fresh(cache_root(), f"bench-{name}",
                  _code_digest(families, files, extra=json.dumps(overrides, sort_keys=True)))
    if not (path / "config.json").is_file():
        print(f"bench: generating {describe(name)} into {path}", file=sys.stderr)
        families.build_family_model(path, "qwen2", config_overrides=overrides, overwrite=True)
    _write_index(path)
    return path


if __name__ == "__main__":
    print(prepare(sys.argv[1]))
