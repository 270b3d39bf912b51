"""Specs of the 2026 families whose code is a served shape: Ministral 3 and Mistral 4 (Llama-4
attention scaling by position), EXAONE-MoE, AFMoE, Solar-Open, GLM-5 (glm_moe_dsa: MLA with a
sparse indexer) and Ling 2.5 (bailing_moe_v3: Kimi delta attention with MLA).

Shaped as `families.py`'s docstring says; positions past 16 tokens get the Llama-4 scale,
so a 40-token prompt exercises it on every stage.
"""

from __future__ import annotations

from types import MappingProxyType

from orchestrator.testmodels.specs import BASE, YARN_DEEPSEEK, FamilySpec

# Ministral 3 / Mistral 4 publish YaRN with the Llama-4 attention scaling beta; the original
# length is cut to 16 tokens so the scale changes inside the test prompt.
_LLAMA4_SCALED_YARN = MappingProxyType({
    "type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
    "llama_4_scaling_beta": 0.1, "rope_theta": 10000.0, "beta_fast": 32, "beta_slow": 1,
    "mscale": 1.0, "mscale_all_dim": 1.0,
})
_SLIDING = ["sliding_attention", "sliding_attention", "full_attention"]
_MLA = {"kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16}
_ROUTED = {"moe_intermediate_size": 64, "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
           "norm_topk_prob": True, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5}

RECENT = MappingProxyType({
    "ministral3": FamilySpec(
        "ministral3",
        {**BASE, "num_hidden_layers": 6, "sliding_window": 8, "layer_types": _SLIDING * 2,
         "rope_parameters": dict(_LLAMA4_SCALED_YARN), "tie_word_embeddings": False},
        "SD SD FD SD SD FD",
        "Ministral 3: Llama with YaRN and the Llama-4 attention scale by position (past 16 tokens), "
        "8-token sliding windows with a global layer every 3rd, untied head",
    ),
    "mistral4": FamilySpec(
        "mistral4",
        {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, **_MLA, **_ROUTED, "first_k_dense_replace": 1,
         "rope_parameters": dict(_LLAMA4_SCALED_YARN), "tie_word_embeddings": False},
        "FD FE FE FE",
        "Mistral 4: MLA with q LoRA scaled per position (Llama-4 scale, one row each in a batch); "
        "layer 0 dense, then 8 experts in 2 groups top-2 plus a shared expert",
    ),
    "exaone_moe": FamilySpec(
        "exaone_moe",
        {**BASE, "num_hidden_layers": 6, "sliding_window": 8, "layer_types": _SLIDING * 2,
         "is_moe_layer": [False, True, True, True, True, True], "moe_intermediate_size": 64, "num_experts": 8,
         "num_experts_per_tok": 2, "num_shared_experts": 1, "n_group": 2, "topk_group": 1,
         "tie_word_embeddings": False},
        "SD SE FE SE SE FE",
        "EXAONE-MoE: RoPE only in the 8-token sliding layers, a global NoPE layer every 3rd; "
        "layer 0 dense, then 8 experts (sigmoid + bias, 2 groups) top-2 plus a shared expert",
    ),
    "afmoe": FamilySpec(
        "afmoe",
        {**BASE, "num_hidden_layers": 6, "sliding_window": 8, "layer_types": _SLIDING * 2,
         "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1,
         "num_dense_layers": 1, "route_scale": 2.0, "n_group": 2, "topk_group": 1, "mup_enabled": True,
         "tie_word_embeddings": False},
        "SD SE FE SE SE FE",
        "AFMoE (Trinity): gated attention, 8-token sliding windows with a global layer every 3rd, "
        "muP-scaled embedding; layer 0 dense, then 8 experts top-2 plus a shared expert",
        embed_std=0.125,
    ),
    "solar_open": FamilySpec(
        "solar_open",
        {**BASE, "num_hidden_layers": 4, **_ROUTED, "first_k_dense_replace": 1, "partial_rotary_factor": 0.5,
         "use_qk_norm": True, "tie_word_embeddings": False},
        "FD FE FE FE",
        "Solar-Open: GLM-4.5-shaped, partial RoPE, q/k norms; layer 0 dense, then 8 experts in 2 "
        "groups top-2 (sigmoid + bias) plus a shared expert",
    ),
    "glm_moe_dsa": FamilySpec(
        "glm_moe_dsa",
        {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, **_MLA, **_ROUTED, "topk_method": "noaux_tc",
         "scoring_func": "sigmoid", "first_k_dense_replace": 1, "moe_layer_freq": 1,
         "index_head_dim": 32, "index_n_heads": 4, "index_topk": 12, "attention_bias": False,
         "rope_parameters": {**YARN_DEEPSEEK, "rope_theta": 10000.0}, "tie_word_embeddings": False},
        "FD FE FE FE",
        "GLM-5: DeepSeek-V3.2's MLA whose indexer keeps the 12 best keys past 12 tokens; layer 0 "
        "dense, then MoE (8 routed experts in 2 groups, top-2, 1 shared)",
    ),
    "bailing_moe_v3": FamilySpec(
        "bailing_moe_v3",
        {**BASE, "num_hidden_layers": 8, "layer_group_size": 4, **_MLA, "head_dim": 16,
         "moe_intermediate_size": 64, "moe_shared_expert_intermediate_size": 64, "num_experts": 8,
         "num_experts_per_tok": 2, "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2,
         "topk_group": 1, "short_conv_kernel_size": 4, "tie_word_embeddings": False},
        "LD LE LE FE LE LE LE FE",
        "Ling 2.5 (BailingMoeV3): Kimi delta attention with MLA every 4th layer; layer 0 dense, "
        "then 8 experts in 2 groups top-2 plus a shared expert",
    ),
})
