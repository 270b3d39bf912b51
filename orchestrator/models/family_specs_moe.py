"""Specs of the families with mixture-of-experts layers (dense-then-MoE stacks where the
family has them, 4-8 experts of width 64, top-2).
"""

from __future__ import annotations

from types import MappingProxyType

from orchestrator.models.family_specs import BASE, YARN_DEEPSEEK, FamilySpec, attn

MOE = MappingProxyType({
    "mixtral": FamilySpec(
        "mixtral",
        {**BASE, "num_hidden_layers": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
         "tie_word_embeddings": False},
        "FE FE FE FE",
        "every layer MoE: 4 experts, top-2",
    ),
    "qwen3_moe": FamilySpec(
        "qwen3_moe",
        {**BASE, "num_hidden_layers": 6, "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
         "mlp_only_layers": [0], "moe_intermediate_size": 64, "norm_topk_prob": True, "tie_word_embeddings": False},
        "FD FE FE FE FE FE",
        "layer 0 dense (mlp_only_layers), then MoE: 8 experts, top-2",
    ),
    "qwen3_next": FamilySpec(
        "qwen3_next",
        {**BASE, "num_hidden_layers": 6, "full_attention_interval": 3,
         "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
         "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
         "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
         "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "norm_topk_prob": True,
         "partial_rotary_factor": 0.25, "tie_word_embeddings": False},
        "LE LE FE LE LE FE",
        "gated-delta linear attention with a gated full-attention layer every 3rd; all MoE "
        "(4 experts top-2 plus a shared expert)",
    ),
    "qwen3_5_moe": FamilySpec(
        "qwen3_5_moe",
        {**BASE, "num_hidden_layers": 6, "full_attention_interval": 3,
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
    "glm4_moe": FamilySpec(
        "glm4_moe",
        {**BASE, "num_hidden_layers": 4, "moe_intermediate_size": 64, "norm_topk_prob": True, "n_group": 1,
         "topk_group": 1, "n_shared_experts": 1, "n_routed_experts": 8, "routed_scaling_factor": 1.0,
         "num_experts_per_tok": 2, "first_k_dense_replace": 1, "rope_scaling": None, "use_qk_norm": True,
         "tie_word_embeddings": False, "attention_bias": True, "partial_rotary_factor": 0.5},
        "FD FE FE FE",
        "first_k_dense_replace=1: layer 0 dense, then MoE (8 routed experts top-2, sigmoid "
        "scores with correction bias, 1 shared expert)",
    ),
    "deepseek_v2": FamilySpec(
        "deepseek_v2",
        {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
         "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "topk_method": "greedy",
         "routed_scaling_factor": 1.0, "kv_lora_rank": 64, "q_lora_rank": None, "qk_rope_head_dim": 16,
         "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1, "moe_layer_freq": 1,
         "rope_scaling": dict(YARN_DEEPSEEK), "tie_word_embeddings": False},
        "FD FE FE FE",
        "multi-head latent attention (no q LoRA, as V2-Lite); layer 0 dense, then MoE "
        "(8 routed experts top-2, greedy, 1 shared)",
    ),
    "deepseek_v3": FamilySpec(
        "deepseek_v3",
        {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
         "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "topk_method": "noaux_tc",
         "scoring_func": "sigmoid", "norm_topk_prob": True, "n_group": 2, "topk_group": 1,
         "routed_scaling_factor": 2.5, "kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 16,
         "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1, "moe_layer_freq": 1,
         "rope_scaling": dict(YARN_DEEPSEEK), "tie_word_embeddings": False},
        "FD FE FE FE",
        "MLA with q LoRA; layer 0 dense, then MoE (8 routed experts in 2 groups, top-2 of the "
        "best group, sigmoid + correction bias, 1 shared)",
    ),
    "kimi_k2": FamilySpec(
        "kimi_k2",
        {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
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
        {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
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
        {**BASE, "num_hidden_layers": 4, "intermediate_size": 64, "num_local_experts": 4,
         "num_experts_per_tok": 2, "sliding_window": 8,
         "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                          "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
         "layer_types": ["sliding_attention", "full_attention"] * 2},
        "SE FE SE FE",
        "alternating 8-token sliding / full attention with attention sinks; every layer MoE "
        "(4 experts top-2, clamped SwiGLU with biases)",
    ),
    "nemotron_h": FamilySpec(
        "nemotron_h",
        {"hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 2048, **attn(),
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
})
