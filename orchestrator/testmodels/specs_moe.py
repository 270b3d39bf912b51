"""Specs of the families with mixture-of-experts layers (dense-then-MoE stacks where the
family has them, 4-8 experts of width 64, top-2).
"""

from __future__ import annotations

from types import MappingProxyType

from orchestrator.testmodels.specs import BASE, YARN_DEEPSEEK, FamilySpec, attn

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
        "as qwen3_5 with every MLP a MoE (4 experts top-2 plus a shared expert); published "
        "with its vision tower (model.visual.*, vision_config), which the stages never load",
        text_config=True,
        tower="model.visual",
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
    "qwen2_moe": FamilySpec(
        "qwen2_moe",
        {**BASE, "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
         "shared_expert_intermediate_size": 128, "tie_word_embeddings": False},
        "FE FE FE FE",
        "Qwen1.5/2 MoE: every layer 8 experts top-2 plus a sigmoid-gated shared expert",
    ),
    "olmoe": FamilySpec(
        "olmoe",
        {**BASE, "num_hidden_layers": 4, "intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
         "norm_topk_prob": False, "tie_word_embeddings": False},
        "FE FE FE FE",
        "every layer MoE (8 experts top-2, unnormalised), full-width q/k norms",
    ),
    "phimoe": FamilySpec(
        "phimoe",
        {**BASE, "num_hidden_layers": 4, "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
         "rope_scaling": None},
        "FE FE FE FE",
        "Phi-3.5-MoE / Phi-mini-MoE: LayerNorms, every layer MoE (4 experts top-2, sparsemixer "
        "routing), plain RoPE (rope_scaling null)",
    ),
    "granitemoe": FamilySpec(
        "granitemoe",
        {**BASE, "num_hidden_layers": 4, "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
         "logits_scaling": 2.0, "attention_multiplier": 0.25, "embedding_multiplier": 2.0,
         "residual_multiplier": 0.5, "attention_bias": False, "tie_word_embeddings": True},
        "FE FE FE FE",
        "Granite 3 MoE: embedding / residual / attention / logit multipliers, every layer MoE "
        "(4 experts top-2), tied head",
        embed_std=0.5,
    ),
    "minimax": FamilySpec(
        "minimax",
        {**BASE, "num_hidden_layers": 4, "intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2,
         "shared_intermediate_size": 0, "rotary_dim": 8, "scoring_func": "sigmoid", "use_qk_norm": True,
         "tie_word_embeddings": False},
        "FE FE FE FE",
        "MiniMax-M2: partial RoPE (rotary_dim), full-width q/k norms, every layer MoE (8 "
        "experts top-2, sigmoid + correction bias)",
    ),
    "minimax_m2": FamilySpec(
        "minimax_m2",
        {**BASE, "num_hidden_layers": 4, "intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2,
         "shared_intermediate_size": 0, "rotary_dim": 8, "scoring_func": "sigmoid", "use_qk_norm": True,
         "tie_word_embeddings": False},
        "FE FE FE FE",
        "model_type minimax_m2, as published MiniMax-M2 checkpoints name it; mlx-lm maps it onto minimax.py",
    ),
    "ernie4_5_moe": FamilySpec(
        "ernie4_5_moe",
        {**BASE, "num_hidden_layers": 4, "use_bias": False, "moe_num_experts": 8, "moe_k": 2,
         "moe_layer_start_index": 1, "moe_layer_interval": 1, "moe_intermediate_size": 64,
         "moe_num_shared_experts": 1, "moe_use_aux_free": True, "tie_word_embeddings": False},
        "FD FE FE FE",
        "ERNIE 4.5 MoE: layer 0 dense (moe_layer_start_index), then 8 experts top-2 with "
        "correction bias plus a shared expert",
    ),
    "dots1": FamilySpec(
        "dots1",
        {**BASE, "num_hidden_layers": 4, "first_k_dense_replace": 1, "moe_intermediate_size": 64,
         "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": True, "num_experts_per_tok": 2,
         "routed_scaling_factor": 2.5, "scoring_func": "noaux_tc", "n_group": 1, "topk_group": 1,
         "tie_word_embeddings": False},
        "FD FE FE FE",
        "dots.llm1: q/k norms, layer 0 dense, then 8 experts top-2 (sigmoid + correction bias) "
        "plus a shared expert",
    ),
    "bailing_moe": FamilySpec(
        "bailing_moe",
        {**BASE, "num_hidden_layers": 4, "moe_intermediate_size": 64, "num_experts": 8, "num_shared_experts": 1,
         "norm_topk_prob": True, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "use_qk_norm": True,
         "partial_rotary_factor": 0.5, "moe_router_enable_expert_bias": True, "score_function": "sigmoid",
         "routed_scaling_factor": 2.5, "n_group": 2, "topk_group": 1, "tie_word_embeddings": False},
        "FD FE FE FE",
        "Ling 2.0: fused qkv, q/k norms, partial RoPE, layer 0 dense, then 8 experts in 2 groups "
        "top-2 (sigmoid + bias) plus a shared expert",
    ),
    "lfm2_moe": FamilySpec(
        "lfm2_moe",
        {**BASE, "num_hidden_layers": 6, "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
         "norm_topk_prob": True, "use_expert_bias": True, "num_dense_layers": 1, "norm_eps": 1e-5,
         "conv_bias": False, "conv_L_cache": 3, "layer_types": ["conv", "conv", "full_attention"] * 2,
         "tie_word_embeddings": True},
        "CD CE FE CE CE FE",
        "LFM2-MoE: short-convolution layers with attention every 3rd; layer 0 dense, then 8 "
        "experts top-2 (sigmoid + bias)",
    ),
    "glm4_moe_lite": FamilySpec(
        "glm4_moe_lite",
        {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
         "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "routed_scaling_factor": 1.8,
         "kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16,
         "v_head_dim": 16, "first_k_dense_replace": 1, "rope_scaling": None, "tie_word_embeddings": False},
        "FD FE FE FE",
        "GLM-4.7-Flash: MLA with q LoRA, layer 0 dense, then 8 experts top-2 (sigmoid + bias) "
        "plus a shared expert",
    ),
    "deepseek_v32": FamilySpec(
        "deepseek_v32",
        {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "moe_intermediate_size": 64,
         "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "topk_method": "noaux_tc",
         "scoring_func": "sigmoid", "norm_topk_prob": True, "n_group": 2, "topk_group": 1,
         "routed_scaling_factor": 2.5, "kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 16,
         "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1, "moe_layer_freq": 1,
         "index_head_dim": 32, "index_n_heads": 4, "index_topk": 12,
         "rope_scaling": dict(YARN_DEEPSEEK), "tie_word_embeddings": False},
        "FD FE FE FE",
        "DeepSeek-V3.2: MLA whose lightning indexer keeps the 12 best keys once the context "
        "passes 12 tokens (its own key cache beside the latent one); layer 0 dense, then MoE",
    ),
    "kimi_linear": FamilySpec(
        "kimi_linear",
        {**BASE, "num_hidden_layers": 6, "num_key_value_heads": 4, "model_max_length": 2048,
         "linear_attn_config": {"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3, 6], "num_heads": 4,
                                "head_dim": 16, "short_conv_kernel_size": 4},
         "num_experts": 8, "moe_intermediate_size": 64, "num_experts_per_token": 2, "num_shared_experts": 1,
         "kv_lora_rank": 64, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
         "mla_use_nope": True, "first_k_dense_replace": 1, "moe_router_activation_func": "sigmoid",
         "routed_scaling_factor": 2.5, "tie_word_embeddings": False},
        "LD LE NE LE LE NE",
        "Kimi-Linear: Kimi delta attention (gated linear, short convolutions) with MLA without "
        "RoPE every 3rd layer; layer 0 dense, then 8 experts top-2 plus a shared expert",
    ),
    "mimo_v2_flash": FamilySpec(
        "mimo_v2_flash",
        {**BASE, "num_hidden_layers": 6, "hybrid_layer_pattern": [0, 1, 1, 0, 1, 1],
         "moe_layer_freq": [0, 1, 1, 1, 1, 1], "add_swa_attention_sink_bias": True,
         "add_full_attention_sink_bias": False, "sliding_window_size": 8, "moe_intermediate_size": 64,
         "n_shared_experts": None, "n_routed_experts": 8, "num_experts_per_tok": 2, "routed_scaling_factor": 1.0,
         "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True, "n_group": 1,
         "topk_group": 1, "layernorm_epsilon": 1e-5, "swa_rope_theta": 10000.0, "swa_num_attention_heads": 8,
         "swa_num_key_value_heads": 2, "v_head_dim": 16, "swa_head_dim": 16, "swa_v_head_dim": 16,
         "partial_rotary_factor": 0.5, "attention_value_scale": 0.707, "tie_word_embeddings": False},
        "FD SE SE FE SE SE",
        "MiMo-V2-Flash: 8-token sliding windows (more heads, attention sinks) between global "
        "layers (period 3), partial RoPE; layer 0 dense, then 8 experts top-2",
    ),
    "step3p5": FamilySpec(
        "step3p5",
        {**BASE, "num_hidden_layers": 6, "num_attention_groups": 2, "sliding_window": 8,
         "layer_types": ["full_attention", "sliding_attention", "sliding_attention"] * 2,
         "attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 2},
         "partial_rotary_factors": [0.5, 1.0, 1.0] * 2, "use_head_wise_attn_gate": True,
         "moe_num_experts": 8, "moe_top_k": 2, "moe_intermediate_size": 64, "share_expert_dim": 64,
         "moe_layers_enum": "1,2,3,4,5", "moe_router_scaling_factor": 3.0,
         "swiglu_limits": [0, 0, 0, 0, 7.0, 7.0], "swiglu_limits_shared": [0, 0, 0, 0, 7.0, 7.0]},
        "FD SE SE FE SE SE",
        "Step-3.5-Flash: 8-token sliding windows with more heads between global layers "
        "(period 3), partial RoPE on global layers, head-wise attention gates; layer 0 dense, "
        "then 8 experts top-2 plus a shared expert, clamped SwiGLU in the last layers",
    ),
    "granitemoehybrid": FamilySpec(
        "granitemoehybrid",
        {**BASE, "num_hidden_layers": 6, "layer_types": ["mamba", "mamba", "attention"] * 2,
         "attention_bias": False, "embedding_multiplier": 2.0, "attention_multiplier": 0.25, "logits_scaling": 2.0,
         "residual_multiplier": 0.5, "num_local_experts": 4, "num_experts_per_tok": 2,
         "intermediate_size": 64, "shared_intermediate_size": 128, "mamba_n_heads": 4, "mamba_d_head": 16,
         "mamba_proj_bias": False, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_n_groups": 1,
         "mamba_conv_bias": True, "position_embedding_type": "nope", "tie_word_embeddings": True},
        "ME ME NE ME ME NE",
        "Granite 4.0-H: Mamba2 layers with attention without RoPE every 3rd; every layer 4 "
        "experts top-2 plus a shared MLP; muP multipliers",
        embed_std=0.5,
    ),
    "longcat_flash": FamilySpec(
        "longcat_flash",
        {"hidden_size": 64, "num_layers": 4, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "attention_method": "MLA", "zero_expert_type": "identity",
         "ffn_hidden_size": 128, "moe_topk": 2, "expert_ffn_hidden_size": 64, "n_routed_experts": 8,
         "zero_expert_num": 2, "num_attention_heads": 4, "kv_lora_rank": 64, "q_lora_rank": 64,
         "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "routed_scaling_factor": 2.0,
         "mla_scale_q_lora": True, "mla_scale_kv_lora": True, "attention_bias": False, "router_bias": True},
        "FE FE FE FE",
        "LongCat-Flash: each layer two MLA blocks and two dense MLPs with a shortcut MoE "
        "(8 experts plus 2 zero / identity experts, top-2) beside them",
    ),
})
