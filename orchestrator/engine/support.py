"""Which models the engine serves exactly, and a clear reason for every other one.

One registry, read by the stage at start (it refuses to load what it cannot serve), by the
node agent's model report (the dashboard shows "Unsupported: <reason>") and by the planner
(a refusal, not a warning). A family is listed only when the exactness matrix
(`tests/engine/test_families.py`) proves that a split equals single-process mlx-lm for it;
the stage runs each family's own mlx-lm code, so no family needs an adapter today.

Pure: no MLX import, so the agent and the planner can use it cheaply.
"""

from __future__ import annotations

from typing import Any

# model_type -> what the family is (for the README and the dashboard). Every entry is a
# parameter of the exactness matrix; adding one here without a passing matrix row is a bug.
FAMILIES: dict[str, str] = {
    "llama": "Llama 2/3, SmolLM, TinyLlama",
    "mistral": "Mistral",
    "mixtral": "Mixtral (MoE)",
    "qwen2": "Qwen2 / Qwen2.5",
    "qwen3": "Qwen3 dense",
    "qwen3_moe": "Qwen3 MoE",
    "qwen3_next": "Qwen3-Next (hybrid linear attention)",
    "qwen3_5": "Qwen3.5 (hybrid linear attention)",
    "qwen3_5_moe": "Qwen3.5 MoE (hybrid linear attention)",
    "gemma2": "Gemma 2 (soft-capping, sliding window)",
    "gemma3_text": "Gemma 3 text (sliding/global pattern)",
    "glm4": "GLM-4",
    "glm4_moe": "GLM-4.5 / 4.6 (MoE)",
    "deepseek_v2": "DeepSeek-V2 (MLA, MoE)",
    "deepseek_v3": "DeepSeek-V3 / R1, Kimi-K2 (MLA, MoE)",
    "gpt_oss": "GPT-OSS (sliding/global, sinks, MoE)",
    "llama4_text": "Llama 4 text (chunked attention, MoE)",
    "phi3": "Phi-3",
    "olmo2": "OLMo 2",
    "nemotron_h": "Nemotron-H (hybrid Mamba)",
    "jamba": "Jamba (hybrid Mamba, MoE)",
    "gemma": "Gemma 1",
    "starcoder2": "StarCoder2",
    "internlm2": "InternLM2 / 2.5",
    "internlm3": "InternLM3",
    "minicpm": "MiniCPM (muP scalings)",
    "seed_oss": "Seed-OSS",
    "apertus": "Apertus (xIELU)",
    "smollm3": "SmolLM3 (no-RoPE layers)",
    "exaone4": "EXAONE 4.0 (sliding/global pattern)",
    "cohere2": "Command R7B / Command A (sliding/global, parallel blocks)",
    "olmo3": "OLMo 3 (sliding/global pattern)",
    "hunyuan_v1_dense": "Hunyuan dense",
    "lfm2": "LFM2 (hybrid short convolutions)",
    "falcon_h1": "Falcon-H1 (parallel attention + Mamba2)",
    "qwen2_moe": "Qwen1.5 / Qwen2 MoE",
    "olmoe": "OLMoE",
    "phimoe": "Phi-3.5-MoE / Phi-mini-MoE",
    "granitemoe": "Granite 3 MoE",
    "minimax": "MiniMax-M2 (MoE)",
    "ernie4_5_moe": "ERNIE 4.5 MoE",
    "dots1": "dots.llm1 (MoE)",
    "bailing_moe": "Ling 2.0 (MoE)",
    "lfm2_moe": "LFM2-MoE (hybrid short convolutions)",
    "glm4_moe_lite": "GLM-4.7-Flash (MLA, MoE)",
    "deepseek_v32": "DeepSeek-V3.2 (MLA with sparse indexer, MoE)",
    "kimi_linear": "Kimi-Linear (hybrid delta attention, MLA, MoE)",
    "mimo_v2_flash": "MiMo-V2-Flash (sliding/global, sinks, MoE)",
    "step3p5": "Step-3.5-Flash (sliding/global, MoE)",
    "granitemoehybrid": "Granite 4.0-H (hybrid Mamba, MoE)",
    "longcat_flash": "LongCat-Flash (MLA, shortcut MoE with zero experts)",
}

# The one kind of adapter: families whose attention uses the keys it fetched from the cache
# itself instead of handing them to mlx-lm's shared attention (gemma2's soft-capped scores,
# MLA's absorbed projections, DeepSeek-V3.2's indexer). In a micro-batched decode step their
# attention module (this attribute of each layer, or each module of a list of them) runs once
# per request; MLP and MoE stay batched (engine/batch.py).
ROW_ATTENTION: dict[str, str] = {"gemma2": "self_attn", "deepseek_v3": "self_attn", "glm4_moe_lite": "self_attn",
                                 "deepseek_v32": "self_attn", "kimi_linear": "self_attn", "longcat_flash": "self_attn"}

# Names that mlx-lm loads with another family's code (mlx_lm.utils MODEL_REMAPPING).
ALIASES: dict[str, str] = {"kimi_k2": "deepseek_v3", "joyai_llm_flash": "deepseek_v3", "minimax_m2": "minimax"}

# Families whose mlx-lm module loads the text decoder of a multimodal checkpoint (it drops
# the vision tower): served text-only.
TEXT_OF_MULTIMODAL = {"qwen3_5", "qwen3_5_moe"}

# Quantization modes and bit widths the matrix covers.
QUANT_MODES: dict[str, set[int]] = {"affine": {2, 3, 4, 5, 6, 8}, "mxfp4": {4}}


def family_of(config: dict[str, Any]) -> str | None:
    """The registry's family for a config.json, or None when the model_type is missing."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return None
    name = model_type.replace("-", "_")
    return ALIASES.get(name, name)


def unsupported_reason(config: dict[str, Any]) -> str | None:
    """Why the engine cannot serve this model exactly, or None when it can."""
    family = family_of(config)
    if family is None:
        return "config.json has no model_type"
    if ("vision_config" in config or "audio_config" in config) and family not in TEXT_OF_MULTIMODAL:
        return f"{config['model_type']} is a multimodal model; pipeserve serves text-only decoders"
    if family not in FAMILIES:
        return (f"model family {config['model_type']!r} is not verified exact in pipeserve's split engine "
                f"(supported: {', '.join(sorted(FAMILIES))})")
    return _quantization_problem(config.get("quantization", config.get("quantization_config")))


def _quantization_problem(quant: Any) -> str | None:
    if quant is None:
        return None
    if not isinstance(quant, dict):
        return "config.json has an unreadable quantization entry"
    for where, spec in [("", quant), *((f" for {k}", v) for k, v in quant.items() if isinstance(v, dict))]:
        mode = spec.get("mode", "affine")
        bits = spec.get("bits")
        if mode not in QUANT_MODES:
            return f"quantization mode {mode!r}{where} is not supported (supported: {', '.join(QUANT_MODES)})"
        if bits is not None and bits not in QUANT_MODES[mode]:
            return f"{bits}-bit {mode} quantization{where} is not supported"
    if "quant_method" in quant and "bits" not in quant:
        return f"quantization {quant['quant_method']!r} is not an MLX format; convert the model with mlx-lm first"
    return None
