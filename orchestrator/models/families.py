"""Tiny deterministic random-weight models of many mlx-lm model families.

Each family in `FAMILIES` is built with mlx-lm's own `Model` class for its `model_type`,
so a test that compares a pipeline split against single-process mlx-lm exercises the
family's real code: its attention variants (sliding windows, soft-capping, MLA, partial
RoPE, no-RoPE layers), its MoE routing, its linear-attention / SSM layers and its cache
types. The models are shaped to make splits interesting (4-8 layers whose kinds alternate
with a period of 2-3, sliding windows of 8 tokens so a 40-token prompt overflows them,
dense-then-MoE stacks) and small (hidden 64, vocabulary 512, well under 5 MB), so that a
test builds one in a fraction of a second.

Weights: the module tree comes from mlx-lm under `mx.random.seed(seed)` (which fixes the
few vectors mlx-lm initialises at random, such as biases); every float matrix (ndim >= 2)
is then redrawn from `numpy.random.default_rng(seed)` as normal(0, scale / sqrt(fan_in))
(embeddings normal(0, 1), or smaller where a family scales them up), the recipe of
`testmodel.py`. mlx-lm's own init makes a random
model repeat one token; the larger scale makes greedy output vary token to token, so a
wrong pipeline cannot pass a comparison by accident. Vectors with a meaning (norm weights,
SSM A_log / D / dt_bias, router score biases, attention sinks) keep mlx-lm's init.

Quantization goes through `mlx_lm.utils.quantize_model`, exactly as `mlx_lm.convert` does
(cast first, then quantize), and the tokenizer is the one `testmodel.py` trains.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from orchestrator.models import testmodel
from orchestrator.models.files import mx_dtype, save_weights, staged_directory, write_json
from orchestrator.models.testmodel import SPECIAL_TOKENS, train_tokenizer, write_tokenizer

VOCAB = 512
QUANTS = ("q4", "q6", "q8", "mixed", "mxfp4")
# Affine bits per quant name; group 64 is what mlx-community publishes (and mlx-lm's
# default). The shapes below keep every in-dimension a multiple of 64 so nothing is left
# in float by mlx-lm's "in-dim divisible by group" rule unless a family says so.
_AFFINE_BITS = MappingProxyType({"q4": 4, "q6": 6, "q8": 8})
_GROUP = 64

# Ids of the test tokenizer's special tokens (see testmodel.SPECIAL_TOKENS).
_TOKEN_IDS = MappingProxyType({
    "bos_token_id": SPECIAL_TOKENS.index("<|im_start|>"),
    "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"),
    "pad_token_id": SPECIAL_TOKENS.index("<|endoftext|>"),
})


@dataclass(frozen=True)
class FamilySpec:
    """One model family: its mlx-lm `model_type`, the config.json it gets, and notes.

    `config` holds the family-specific keys (vocabulary and token ids are added when
    building). `layer_pattern` describes the layer stack, one space-separated code per
    layer: the mixer (F full attention, S sliding-window attention, N attention without
    RoPE, L linear attention, M Mamba, - none) then the MLP (D dense, E mixture of
    experts, - none). `scale` is the weight scale that gives varied greedy output and
    `embed_std` the embedding's. `omit` lists weight-name prefixes left out of the saved
    file because published checkpoints lack them (the loader then ties the head).
    `quants` are the quantizations this family accepts; all five load and generate with
    mlx-lm 0.32.2. `text_config` nests the config as the published multimodal checkpoints do.
    """

    model_type: str
    config: dict[str, Any]
    layer_pattern: str
    notes: str
    scale: float = 4.0
    embed_std: float = 1.0
    omit: tuple[str, ...] = ()
    quants: tuple[str, ...] = ("q4", "q6", "q8", "mixed", "mxfp4")
    text_config: bool = False

    @property
    def layers(self) -> list[str]:
        """The per-layer codes of `layer_pattern`."""
        return self.layer_pattern.split()

    @property
    def moe(self) -> bool:
        """Whether any layer routes through experts (mlx's CPU backend runs expert
        matmuls in float32 only, so float16/bfloat16 MoE models need Metal)."""
        return any(code.endswith("E") for code in self.layers)


def _attn(heads: int = 4, kv_heads: int = 2, head_dim: int = 16) -> dict[str, Any]:
    """Attention head keys of a config."""
    return {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim}


# YaRN RoPE scaling as published DeepSeek-V2/V3 configs have it (mlx-lm's deepseek_v2
# requires rope_scaling); factor and original length scaled down to the tiny model.
_YARN_DEEPSEEK = MappingProxyType({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                                   "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707})

# Shared by most families: 64 wide, 4 query heads of 16 over 2 key/value heads.
_BASE = MappingProxyType({
    "hidden_size": 64,
    "intermediate_size": 128,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    **_attn(),
})


FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(
        "llama",
        {**_BASE, "num_hidden_layers": 6, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False},
        "FD FD FD FD FD FD",
        "plain Llama, tied head",
    ),
    "mistral": FamilySpec(
        "mistral",
        {
            **_BASE,
            "num_hidden_layers": 6,
            "tie_word_embeddings": False,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
        },
        "SD SD FD SD SD FD",
        "mlx-lm maps mistral onto llama.py; layer_types interleave 8-token sliding windows "
        "with global layers (period 3), untied head",
    ),
    "mixtral": FamilySpec(
        "mixtral",
        {**_BASE, "num_hidden_layers": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
         "tie_word_embeddings": False},
        "FE FE FE FE",
        "every layer MoE: 4 experts, top-2",
    ),
    "qwen2": FamilySpec(
        "qwen2",
        {**_BASE, "num_hidden_layers": 6, "tie_word_embeddings": True},
        "FD FD FD FD FD FD",
        "q/k/v biases, tied head",
    ),
    "qwen3": FamilySpec(
        "qwen3",
        {**_BASE, "num_hidden_layers": 6, "tie_word_embeddings": True},
        "FD FD FD FD FD FD",
        "q/k norms, tied head",
    ),
    "qwen3_moe": FamilySpec(
        "qwen3_moe",
        {**_BASE, "num_hidden_layers": 6, "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
         "mlp_only_layers": [0], "moe_intermediate_size": 64, "norm_topk_prob": True, "tie_word_embeddings": False},
        "FD FE FE FE FE FE",
        "layer 0 dense (mlp_only_layers), then MoE: 8 experts, top-2",
    ),
    "qwen3_next": FamilySpec(
        "qwen3_next",
        {**_BASE, "num_hidden_layers": 6, "full_attention_interval": 3,
         "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
         "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
         "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
         "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "norm_topk_prob": True,
         "partial_rotary_factor": 0.25, "tie_word_embeddings": False},
        "LE LE FE LE LE FE",
        "gated-delta linear attention with a gated full-attention layer every 3rd; all MoE "
        "(4 experts top-2 plus a shared expert)",
    ),
    "qwen3_5": FamilySpec(
        "qwen3_5",
        {**_BASE, "num_hidden_layers": 6, "full_attention_interval": 3,
         "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
         "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "tie_word_embeddings": True,
         "rope_parameters": {"type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}},
        "LD LD FD LD LD FD",
        "config nested under text_config as published (vision tower omitted); dense MLP, "
        "gated-delta linear attention, full attention every 3rd layer, tied head",
        text_config=True,
    ),
    "qwen3_5_moe": FamilySpec(
        "qwen3_5_moe",
        {**_BASE, "num_hidden_layers": 6, "full_attention_interval": 3,
         "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
         "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "tie_word_embeddings": False,
         "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
         "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "norm_topk_prob": True,
         "rope_parameters": {"type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}},
        "LE LE FE LE LE FE",
        "as qwen3_5 with every MLP a MoE (4 experts top-2 plus a shared expert)",
        text_config=True,
    ),
    "gemma2": FamilySpec(
        "gemma2",
        {**_BASE, "num_hidden_layers": 4, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 10.0,
         "query_pre_attn_scalar": 16, "sliding_window": 8, "hidden_activation": "gelu_pytorch_tanh"},
        "FD FD FD FD",
        "attention and final logit soft-capping; mlx-lm's gemma2 ignores sliding_window "
        "(every layer attends globally), so the window in config.json is informational",
        # Gemma multiplies the embedding by sqrt(hidden) = 8; unit-variance draws would
        # then swamp the layers and, with the tied head, predict the input token again.
        embed_std=0.125,
    ),
    "gemma3_text": FamilySpec(
        "gemma3_text",
        {**_BASE, "num_hidden_layers": 6, "query_pre_attn_scalar": 16, "sliding_window": 8,
         "sliding_window_pattern": 3, "rope_local_base_freq": 10000.0},
        "SD SD FD SD SD FD",
        "8-token sliding windows with a global layer every 3rd; head tied by the loader "
        "(no lm_head in the weights, as published)",
        omit=("lm_head.",),
        embed_std=0.125,
    ),
    "glm4": FamilySpec(
        "glm4",
        {**_BASE, "num_hidden_layers": 4, "attention_bias": True, "partial_rotary_factor": 0.5},
        "FD FD FD FD",
        "partial RoPE (half the head), q/k/v biases, extra post-attention / post-MLP norms",
    ),
    "glm4_moe": FamilySpec(
        "glm4_moe",
        {**_BASE, "num_hidden_layers": 4, "moe_intermediate_size": 64, "norm_topk_prob": True, "n_group": 1,
         "topk_group": 1, "n_shared_experts": 1, "n_routed_experts": 8, "routed_scaling_factor": 1.0,
         "num_experts_per_tok": 2, "first_k_dense_replace": 1, "rope_scaling": None, "use_qk_norm": True,
         "tie_word_embeddings": False, "attention_bias": True, "partial_rotary_factor": 0.5},
        "FD FE FE FE",
        "first_k_dense_replace=1: layer 0 dense, then MoE (8 routed experts top-2, sigmoid "
        "scores with correction bias, 1 shared expert)",
    ),
    "deepseek_v2": FamilySpec(
        "deepseek_v2",
        {**_BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
         "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "topk_method": "greedy",
         "routed_scaling_factor": 1.0, "kv_lora_rank": 64, "q_lora_rank": None, "qk_rope_head_dim": 16,
         "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1, "moe_layer_freq": 1,
         "rope_scaling": dict(_YARN_DEEPSEEK), "tie_word_embeddings": False},
        "FD FE FE FE",
        "multi-head latent attention (no q LoRA, as V2-Lite); layer 0 dense, then MoE "
        "(8 routed experts top-2, greedy, 1 shared)",
    ),
    "deepseek_v3": FamilySpec(
        "deepseek_v3",
        {**_BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
         "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "topk_method": "noaux_tc",
         "scoring_func": "sigmoid", "norm_topk_prob": True, "n_group": 2, "topk_group": 1,
         "routed_scaling_factor": 2.5, "kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 16,
         "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1, "moe_layer_freq": 1,
         "rope_scaling": dict(_YARN_DEEPSEEK), "tie_word_embeddings": False},
        "FD FE FE FE",
        "MLA with q LoRA; layer 0 dense, then MoE (8 routed experts in 2 groups, top-2 of the "
        "best group, sigmoid + correction bias, 1 shared)",
    ),
    "kimi_k2": FamilySpec(
        "kimi_k2",
        {**_BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
         "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "topk_method": "noaux_tc",
         "scoring_func": "sigmoid", "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
         "routed_scaling_factor": 2.827, "kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 16,
         "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1, "moe_layer_freq": 1,
         "tie_word_embeddings": False},
        "FD FE FE FE",
        "model_type kimi_k2, which mlx-lm maps onto deepseek_v3.py (one expert group); no "
        "rope_scaling: transformers (which mlx_lm.load uses for the tokenizer) cannot "
        "standardise YaRN parameters for a model type it does not know",
    ),
    "joyai_llm_flash": FamilySpec(
        "joyai_llm_flash",
        {**_BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
         "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "topk_method": "noaux_tc",
         "scoring_func": "sigmoid", "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
         "routed_scaling_factor": 1.0, "kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 16,
         "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1, "moe_layer_freq": 1,
         "tie_word_embeddings": False},
        "FD FE FE FE",
        "model_type joyai_llm_flash, the other name mlx-lm maps onto deepseek_v3.py; no "
        "rope_scaling, as for kimi_k2",
    ),
    "gpt_oss": FamilySpec(
        "gpt_oss",
        {**_BASE, "num_hidden_layers": 4, "intermediate_size": 64, "num_local_experts": 4,
         "num_experts_per_tok": 2, "sliding_window": 8,
         "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                          "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
         "layer_types": ["sliding_attention", "full_attention"] * 2},
        "SE FE SE FE",
        "alternating 8-token sliding / full attention with attention sinks; every layer MoE "
        "(4 experts top-2, clamped SwiGLU with biases)",
    ),
    "llama4_text": FamilySpec(
        "llama4_text",
        {**_BASE, "num_hidden_layers": 6, "intermediate_size_mlp": 128, "use_qk_norm": True,
         "no_rope_layers": [1, 1, 0] * 2, "tie_word_embeddings": False},
        "FD FD ND FD FD ND",
        "every 3rd layer without RoPE (no_rope_layers), q/k norm on the RoPE layers",
    ),
    "phi3": FamilySpec(
        "phi3",
        {**_BASE, "num_hidden_layers": 4, "tie_word_embeddings": False},
        "FD FD FD FD",
        "fused qkv_proj and gate_up_proj",
    ),
    "olmo2": FamilySpec(
        "olmo2",
        {**_BASE, "num_hidden_layers": 4, "tie_word_embeddings": False},
        "FD FD FD FD",
        "post-norms and full-width q/k norms",
    ),
    "nemotron_h": FamilySpec(
        "nemotron_h",
        {"hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 2048, **_attn(),
         "attention_bias": False, "mamba_num_heads": 4, "mamba_head_dim": 16, "mamba_proj_bias": False,
         "ssm_state_size": 16, "conv_kernel": 4, "n_groups": 2, "mlp_bias": False, "layer_norm_epsilon": 1e-5,
         "use_bias": False, "use_conv_bias": True, "hybrid_override_pattern": list("M*-ME*"),
         "moe_intermediate_size": 64, "moe_shared_expert_intermediate_size": 64, "n_group": 1,
         "n_routed_experts": 4, "n_shared_experts": 1, "topk_group": 1, "num_experts_per_tok": 2,
         "norm_topk_prob": True, "routed_scaling_factor": 1.0, "tie_word_embeddings": False},
        "M- F- -D M- -E F-",
        "one mixer per layer (hybrid_override_pattern M*-ME*): Mamba2, attention, ReLU² MLP, "
        "MoE (4 experts top-2 plus a shared expert)",
    ),
    "jamba": FamilySpec(
        "jamba",
        {"hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 6,
         "attn_layer_offset": 1, "attn_layer_period": 3, "expert_layer_offset": 1, "expert_layer_period": 2,
         "mamba_d_conv": 4, "mamba_d_state": 8, "mamba_expand": 2, "num_experts": 4, "num_experts_per_tok": 2,
         "tie_word_embeddings": True},
        "MD FE MD ME FD ME",
        "Mamba with attention at layers 1 and 4 (period 3) and MoE at odd layers (4 experts top-2)",
    ),
}


def _family_config(spec: FamilySpec, dtype: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The config.json content before quantization; `overrides` replace keys of the
    family's (inner, text) config, vocab_size included. The token ids always stay."""
    inner = {"model_type": spec.model_type, "vocab_size": VOCAB, **copy.deepcopy(spec.config),
             **copy.deepcopy(dict(overrides or {})), **_TOKEN_IDS}
    if not spec.text_config:
        return {**inner, "torch_dtype": dtype}
    # Published Qwen3.5 checkpoints nest the language model's settings; mlx-lm reads
    # text_config (and tie_word_embeddings from it).
    inner["model_type"] = f"{spec.model_type}_text"
    return {"model_type": spec.model_type, "text_config": inner, "tie_word_embeddings": inner["tie_word_embeddings"],
            "torch_dtype": dtype, **_TOKEN_IDS}


def _fan_in(name: str, shape: tuple[int, ...]) -> int:
    # mlx Conv1d weights are (out, kernel, in / groups): the fan-in is kernel x in.
    # Linear and stacked-expert weights are (..., out, in).
    if "conv" in name:
        return int(np.prod(shape[1:]))
    return shape[-1]


def _randomize(model: nn.Module, seed: int, scale: float, embed_std: float) -> None:
    """Redraw every float matrix of `model` from numpy (see the module docstring)."""
    rng = np.random.default_rng(seed)
    params = dict(tree_flatten(model.parameters()))
    # By module type, not name: DeepSeek-V3's MLA has embed_q / unembed_out matrices.
    embeddings = {f"{path}.weight" for path, module in model.named_modules() if isinstance(module, nn.Embedding)}
    new = []
    for name in sorted(params):
        value = params[name]
        if value.ndim < 2 or not mx.issubdtype(value.dtype, mx.floating):
            continue
        draw = rng.standard_normal(value.shape, dtype=np.float32)
        if name in embeddings:
            draw *= np.float32(embed_std)
        else:
            draw *= np.float32(scale / np.sqrt(_fan_in(name, value.shape)))
        new.append((name, mx.array(draw)))
    model.update(tree_unflatten(new))


def _cast(model: nn.Module, dtype: mx.Dtype) -> None:
    """Cast float parameters as mlx_lm.convert does, honouring the model's cast_predicate
    (some families keep e.g. router biases or SSM decay in float32)."""
    keep = getattr(model, "cast_predicate", lambda _: True)
    params = tree_flatten(model.parameters())
    model.update(
        tree_unflatten(
            [(k, v.astype(dtype)) for k, v in params if keep(k) and mx.issubdtype(v.dtype, mx.floating)]
        )
    )


def _mixed_predicate(model: nn.Module, layers: int):
    """Per-module quantization like mlx-community's mixed recipes: 4-bit group-64 by
    default (the global entry), with overrides recorded per module path: 6-bit for the
    embedding and head, 8-bit for v_proj / down_proj in the first and last layers, and
    group 32 for the last layer's output projection (o_proj / out_proj). The model's own
    predicate (e.g. 8-bit routers) is applied first, so such modules are treated as in the
    uniform quantizations (mlx_lm.convert's recipes would replace it instead)."""
    own = getattr(model, "quant_predicate", None)
    last = f".layers.{layers - 1}."

    def predicate(path: str, module: nn.Module) -> bool | dict[str, Any]:
        if own is not None:
            decided = own(path, module)
            if decided is False or isinstance(decided, dict):
                return decided
        in_dim = module.weight.shape[-1]
        if path.endswith(("embed_tokens", "lm_head", "embeddings", "output")):
            return {"group_size": _GROUP, "bits": 6, "mode": "affine"}
        edge = ".layers.0." in path or last in path
        if edge and any(k in path for k in ("v_proj", "down_proj", "kv_b_proj")):
            return {"group_size": _GROUP, "bits": 8, "mode": "affine"}
        if last in path and path.endswith(("o_proj", "out_proj")) and in_dim % 32 == 0:
            return {"group_size": 32, "bits": 4, "mode": "affine"}
        return True

    return predicate


def _quantize(model: nn.Module, config: dict[str, Any], quant: str) -> dict[str, Any]:
    """Quantize `model` in place with mlx-lm; return the config with "quantization"."""
    from mlx_lm.utils import quantize_model

    layers = len(model.layers)
    # quantize_model prints a bits-per-weight line; keep stdout for the CLI's result.
    with contextlib.redirect_stdout(io.StringIO()):
        if quant in _AFFINE_BITS:
            _, config = quantize_model(model, config, _GROUP, _AFFINE_BITS[quant])
        elif quant == "mixed":
            _, config = quantize_model(model, config, _GROUP, 4, quant_predicate=_mixed_predicate(model, layers))
        elif quant == "mxfp4":
            _, config = quantize_model(model, config, 32, 4, mode="mxfp4")
        else:
            raise ValueError(f"unknown quant {quant!r}; choose one of {list(QUANTS)}")
    return config


def build_family_model(
    out_dir: Path,
    family: str,
    *,
    dtype: str = "float32",
    quant: str | None = None,
    seed: int = 0,
    overwrite: bool = False,
    config_overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Write a tiny random model of `family` (a key of FAMILIES) to `out_dir`; return it.

    The directory (config.json, model.safetensors, tokenizer files) loads with
    `mlx_lm.load` / `mlx_lm.utils.load_model`. `dtype` is float32, float16 or bfloat16
    (the float32 draws rounded); `quant` is None, "q4", "q6", "q8" (affine, group 64),
    "mixed" (4-bit with per-module overrides in config.json's "quantization") or "mxfp4",
    limited to the family's `quants`. The same arguments give byte-identical files. The
    directory appears atomically; an existing non-empty one is replaced only with
    `overwrite`.

    `config_overrides` reshapes the model with the family's own code and keys, e.g.
    `{"hidden_size": 1024, "num_hidden_layers": 6, "vocab_size": 32000}` for a model shaped
    like a published one (the benchmark's family rows). The family's `layer_pattern` then
    describes its defaults only; a vocab_size other than 512 trains a tokenizer of that
    size (a few seconds for 32000). Every override lands in config.json's "pipeserve" note.
    """
    from mlx_lm.utils import _get_classes

    try:
        spec = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(FAMILIES)}") from None
    target = mx_dtype(dtype)
    if quant is not None and quant not in spec.quants:
        raise ValueError(f"family {family} supports quant in {list(spec.quants)}, not {quant!r}")

    config = _family_config(spec, dtype, config_overrides)
    vocab = int((config.get("text_config") or config)["vocab_size"])
    # The loader's own lookup, so remapped names (mistral, kimi_k2) get the class that
    # mlx_lm.load will use.
    model_class, args_class = _get_classes(config)
    # mlx-lm initialises a few vectors (biases, SSM decay) with mx.random; seeding makes
    # them, and so the files, a function of the arguments.
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    _randomize(model, seed, spec.scale, spec.embed_std)
    _cast(model, target)
    if quant is not None:
        config = _quantize(model, config, quant)
    weights = {
        k: v for k, v in tree_flatten(model.parameters()) if not any(k.startswith(p) for p in spec.omit)
    }
    mx.eval(list(weights.values()))
    config["pipeserve"] = {"kind": "family-test-model", "family": family, "seed": seed, "quant": quant,
                           "scale": spec.scale}
    if config_overrides:
        config["pipeserve"]["config_overrides"] = dict(config_overrides)
    tokenizer = train_tokenizer(vocab)
    with staged_directory(Path(out_dir), overwrite=overwrite) as tmp:
        save_weights(tmp, [weights])
        write_json(tmp / "config.json", config)
        write_tokenizer(tmp, tokenizer, model_max_length=2048)
    return Path(out_dir)


# `pipeserve make-test-model` options that shape the Llama test model only, with the
# flag that changes each from its default. With --family they are refused.
_LLAMA_ONLY = MappingProxyType({
    "layers": "--layers",
    "hidden": "--hidden",
    "heads": "--heads",
    "kv_heads": "--kv-heads",
    "intermediate": "--intermediate",
    "vocab": "--vocab",
    "tied": "--untied",
    "shards": "--shards",
    "scale": "--scale",
})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `pipeserve make-test-model`: the Llama options plus --family / --quant."""
    testmodel.add_arguments(parser)
    parser.add_argument(
        "--family", choices=sorted(FAMILIES), default=None, metavar="NAME",
        help="build a tiny model of this mlx-lm family instead of the Llama test model: "
             f"{', '.join(sorted(FAMILIES))}. Its shape is fixed; the Llama shape options "
             f"({', '.join(_LLAMA_ONLY.values())}) are refused with it; --dtype (also float16 "
             "through the API), --seed and --force apply",
    )
    parser.add_argument("--quant", choices=QUANTS, default=None,
                        help="with --family: quantize (q4/q6/q8 affine group 64, mixed 4/6/8-bit "
                             "per module, mxfp4)")
    # The parser's own defaults, so run() can tell which Llama options were changed.
    parser.set_defaults(llama_defaults={dest: parser.get_default(dest) for dest in _LLAMA_ONLY})


def run(args: argparse.Namespace) -> int:
    """Make the model (a family's, or the Llama test model); print its path. Returns the
    exit status (2 for bad options)."""
    if args.family is None:
        if args.quant is not None:
            print("make-test-model: --quant needs --family", file=sys.stderr)
            return 2
        return testmodel.run(args)
    changed = [flag for dest, flag in _LLAMA_ONLY.items() if getattr(args, dest) != args.llama_defaults[dest]]
    if changed:
        print(f"make-test-model: {', '.join(changed)}: Llama test model options, not usable with "
              f"--family (a family's shape is fixed)", file=sys.stderr)
        return 2
    try:
        path = build_family_model(args.out_dir, args.family, dtype=args.dtype, quant=args.quant,
                                  seed=args.seed, overwrite=args.force)
    except (ValueError, FileExistsError) as e:
        print(f"make-test-model: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0
