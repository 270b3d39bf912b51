"""The description of a tiny family test model (`FamilySpec`) and the config pieces shared by
the spec tables, `family_specs_dense.py` (every MLP dense) and `family_specs_moe.py` (some
layers route through experts); `families.py` merges the two tables and builds the models.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class FamilySpec:
    """One model family: its mlx-lm `model_type`, the config.json it gets, and notes.

    `config` holds the family-specific keys (vocabulary and token ids are added when
    building). `layer_pattern` describes the layer stack, one space-separated code per
    layer: the mixer (F full attention, S sliding-window attention, N attention without
    RoPE, L linear attention, M Mamba, P attention and Mamba in parallel, C gated short
    convolution, - none) then the MLP (D dense, E mixture of experts, - none). `scale` is the
    weight scale that gives varied greedy output and `embed_std` the embedding's. `omit` lists
    weight-name prefixes left out of the saved file because published checkpoints lack them (the
    loader then ties the head).
    `quants` are the quantizations this family accepts; all five load and generate with
    mlx-lm 0.32.2 (for every family but afm7, which mlx-lm cannot quantize: none).
    `text_config` nests the config as the published multimodal checkpoints do, with
    `text_model_type` (default `<model_type>_text`) as the inner model_type and `outer`
    as further top-level keys. `tower` names the prefix of a vision tower the published
    checkpoints carry beside the decoder: the builder then writes a `vision_config` and a few
    NaN-filled tensors under that prefix, which the family's mlx-lm sanitize() must drop (a
    stage that read them would produce NaN). `fills` sets vectors (which the builder leaves
    as mlx-lm initialises them) whose initial value would leave a path dead: Talkie's
    embedding-skip gains start at 0, so the embedding carried to every stage would not count.
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
    text_model_type: str | None = None
    outer: dict[str, Any] | None = None
    tower: str | None = None
    fills: tuple[tuple[str, float], ...] = ()  # (name suffix, value) for vectors the builder does not draw

    @property
    def layers(self) -> list[str]:
        """The per-layer codes of `layer_pattern`."""
        return self.layer_pattern.split()

    @property
    def moe(self) -> bool:
        """Whether any layer routes through experts (mlx's CPU backend runs expert
        matmuls in float32 only, so float16/bfloat16 MoE models need Metal)."""
        return any(code.endswith("E") for code in self.layers)


def attn(heads: int = 4, kv_heads: int = 2, head_dim: int = 16) -> dict[str, Any]:
    """Attention head keys of a config."""
    return {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim}


# YaRN RoPE scaling as published DeepSeek-V2/V3 configs have it (mlx-lm's deepseek_v2
# requires rope_scaling); factor and original length scaled down to the tiny model.
YARN_DEEPSEEK = MappingProxyType({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                                  "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707})

# Shared by most families: 64 wide, 4 query heads of 16 over 2 key/value heads.
BASE = MappingProxyType({
    "hidden_size": 64,
    "intermediate_size": 128,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    **attn(),
})
