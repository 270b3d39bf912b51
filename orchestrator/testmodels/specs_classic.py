"""Specs of the older and smaller decoder families mlx-lm 0.32 ships (GPT-2, GPT-NeoX, GPT-J,
StarCoder 1, Phi, StableLM, Command R, DBRX, Granite, Nemotron, EXAONE 3, GLM, DeepSeek 1,
Qwen 1, Mamba 1/2, RecurrentGemma, PLaMo, MiniCPM3, OpenELM, Helium, Baichuan-M1, TeleChat3,
nanochat, MiMo, Klear, and the rest of mlx-lm's dense and MoE decoders).

Shaped as `families.py`'s docstring says: 4-6 layers of hidden 64, sliding windows of 8
tokens where the family has them.
"""

from __future__ import annotations

from types import MappingProxyType

from orchestrator.testmodels.specs import BASE, FamilySpec

_GPT = {"n_embd": 64, "n_head": 4, "n_layer": 4, "n_positions": 2048, "n_ctx": 2048, "layer_norm_epsilon": 1e-5}
# RoPE settings per layer type, as Mellum and Spark 2.5 publish them.
_ROPE_BY_TYPE = MappingProxyType({"sliding_attention": {"rope_theta": 10000.0},
                                  "full_attention": {"rope_theta": 10000.0}})
_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64}

CLASSIC = MappingProxyType({
    "gpt2": FamilySpec("gpt2", dict(_GPT), "FD FD FD FD", "GPT-2: learned positions, LayerNorm, tied head"),
    "gpt_bigcode": FamilySpec(
        "gpt_bigcode", {**_GPT, "n_inner": 128, "multi_query": True}, "FD FD FD FD",
        "StarCoder 1 / SantaCoder: multi-query attention, learned positions, tied head"),
    "gpt_neox": FamilySpec(
        "gpt_neox",
        {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4, "max_position_embeddings": 2048,
         "layer_norm_eps": 1e-5, "rotary_emb_base": 10000, "rotary_pct": 0.25, "use_parallel_residual": True},
        "FD FD FD FD", "GPT-NeoX / Pythia: partial RoPE (25 %), parallel attention and MLP"),
    "gptj": FamilySpec(
        "gptj", {"n_embd": 64, "n_head": 4, "n_layer": 4, "n_positions": 2048, "rotary_dim": 8,
                 "layer_norm_epsilon": 1e-5},
        "FD FD FD FD", "GPT-J: interleaved partial RoPE, parallel attention and MLP, untied head"),
    "phi": FamilySpec(
        "phi", {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 4,
                "intermediate_size": 128, "partial_rotary_factor": 0.5, "max_position_embeddings": 2048},
        "FD FD FD FD", "Phi-1 / Phi-2: partial RoPE, parallel attention and MLP, biased head"),
    "stablelm": FamilySpec(
        "stablelm", {**BASE, "num_hidden_layers": 4, "use_qkv_bias": True, "partial_rotary_factor": 0.25,
                     "layer_norm_eps": 1e-5, "qk_layernorm": True},
        "FD FD FD FD", "StableLM 2: partial RoPE, LayerNorm, q/k LayerNorms per head"),
    "cohere": FamilySpec(
        "cohere", {**BASE, "num_hidden_layers": 4, "logit_scale": 0.25, "layer_norm_eps": 1e-5, "use_qk_norm": True},
        "FD FD FD FD", "Command R: parallel blocks, q/k norms, scaled logits, tied head"),
    "dbrx": FamilySpec(
        "dbrx", {"d_model": 64, "n_heads": 4, "n_layers": 4,
                 "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
                 "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}},
        "FE FE FE FE", "DBRX: fused clipped qkv, every layer 4 experts top-2"),
    "granite": FamilySpec(
        "granite", {**BASE, "num_hidden_layers": 4, "logits_scaling": 2.0, "attention_multiplier": 0.25,
                    "embedding_multiplier": 2.0, "residual_multiplier": 0.5, "attention_bias": False,
                    "mlp_bias": False},
        "FD FD FD FD", "Granite 3 dense: muP multipliers on embedding, attention, residual and logits"),
    "nemotron": FamilySpec(
        "nemotron", {**BASE, "num_hidden_layers": 4, "hidden_act": "relu2", "norm_eps": 1e-5},
        "FD FD FD FD", "Nemotron 4 / Minitron: squared-ReLU MLP, LayerNorm1p, partial RoPE"),
    "exaone": FamilySpec(
        "exaone", {**BASE, "num_layers": 4, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False},
        "FD FD FD FD", "EXAONE 3 / 3.5 (num_layers), untied head"),
    "ernie4_5": FamilySpec(
        "ernie4_5", {**BASE, "num_hidden_layers": 4, "use_bias": False, "tie_word_embeddings": True},
        "FD FD FD FD", "ERNIE 4.5 dense"),
    "glm": FamilySpec(
        "glm", {**BASE, "num_hidden_layers": 4}, "FD FD FD FD", "GLM-4 0414 base family (glm): partial RoPE"),
    "deepseek": FamilySpec(
        "deepseek", {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
                     "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                     "first_k_dense_replace": 1, "moe_layer_freq": 1},
        "FD FE FE FE", "DeepSeek 1 MoE: layer 0 dense, then 8 experts top-2 plus a shared expert"),
    "qwen": FamilySpec(
        "qwen", {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4, "kv_channels": 16,
                 "intermediate_size": 256, "max_position_embeddings": 2048},
        "FD FD FD FD", "Qwen 1: fused c_attn with biases, untied head"),
    "helium": FamilySpec(
        "helium", {**BASE, "num_hidden_layers": 4, "attention_bias": False, "mlp_bias": False,
                   "tie_word_embeddings": False},
        "FD FD FD FD", "Helium (Kyutai)"),
    "telechat3": FamilySpec(
        "telechat3", {**BASE, "num_hidden_layers": 4}, "FD FD FD FD", "TeleChat 3"),
    "mimo": FamilySpec(
        "mimo", {**BASE, "num_hidden_layers": 4, "num_nextn_predict_layers": 0}, "FD FD FD FD",
        "MiMo 7B: Qwen2-shaped, multi-token-prediction layers dropped"),
    "nanochat": FamilySpec(
        "nanochat", {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
                     "intermediate_size": 256, "max_position_embeddings": 2048},
        "FD FD FD FD", "nanochat: ReLU-squared MLP, q/k norms, no norm weights"),
    "Klear": FamilySpec(
        "Klear", {**BASE, "num_hidden_layers": 4, "attention_bias": False, "mlp_only_layers": [0], **_MOE,
                  "decoder_sparse_step": 1, "n_shared_experts": 1, "norm_topk_prob": True},
        "FD FE FE FE", "Klear MoE: layer 0 dense, then 8 experts top-2 plus a shared expert"),
    "nanbeige": FamilySpec(
        "nanbeige", {**BASE, "num_hidden_layers": 4}, "FD FD FD FD", "Nanbeige (one loop)"),
    "olmo_hybrid": FamilySpec(
        "olmo_hybrid",
        {**BASE, "num_hidden_layers": 6, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
         "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
         "linear_allow_neg_eigval": True, "tie_word_embeddings": False, "attention_bias": False,
         "layer_types": ["linear_attention", "linear_attention", "full_attention"] * 2},
        "LD LD FD LD LD FD", "OLMo hybrid: gated-delta linear attention with full attention every 3rd"),
    "minicpm3": FamilySpec(
        "minicpm3",
        {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "dim_model_base": 32, "q_lora_rank": 64,
         "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "kv_lora_rank": 64, "scale_depth": 1.4, "scale_emb": 2.0,
         "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 8, "short_factor": [1.0] * 8,
                          "original_max_position_embeddings": 2048}},
        "FD FD FD FD", "MiniCPM3: MLA with q LoRA and muP scalings"),
    "openelm": FamilySpec(
        "openelm",
        {"head_dim": 16, "num_transformer_layers": 4, "model_dim": 64, "ffn_dim_divisor": 64,
         "num_query_heads": [4, 4, 4, 4], "num_kv_heads": [2, 2, 2, 2], "ffn_multipliers": [2.0, 2.0, 2.0, 2.0],
         "max_context_length": 2048},
        "FD FD FD FD", "OpenELM: layer-wise head counts and MLP widths, q/k norms, tied head"),
    "mamba": FamilySpec(
        "mamba", {"hidden_size": 64, "intermediate_size": 128, "state_size": 8, "num_hidden_layers": 4,
                  "conv_kernel": 4, "use_bias": False, "use_conv_bias": True, "time_step_rank": 4},
        "M- M- M- M-", "Mamba 1: selective SSM layers only, tied head"),
    "mamba2": FamilySpec(
        "mamba2", {"num_heads": 8, "head_dim": 16, "hidden_size": 64, "intermediate_size": 128, "state_size": 16,
                   "num_hidden_layers": 4, "layer_norm_epsilon": 1e-5, "conv_kernel": 4, "n_groups": 1,
                   "use_bias": False, "use_conv_bias": True, "tie_word_embeddings": True,
                   "time_step_limit": [0.0, float("inf")], "time_step_rank": 4},
        "M- M- M- M-", "Mamba 2 / Codestral Mamba: SSD layers only"),
    "recurrent_gemma": FamilySpec(
        "recurrent_gemma",
        {**BASE, "num_hidden_layers": 6, "num_key_value_heads": 1, "attention_bias": False, "conv1d_width": 4,
         "logits_soft_cap": 30.0, "attention_window_size": 8,
         "block_types": ["recurrent", "recurrent", "attention"]},
        "LD LD SD LD LD SD", "RecurrentGemma / Griffin: RG-LRU recurrent blocks with local attention every 3rd",
        embed_std=0.125),
    "plamo": FamilySpec(
        "plamo", {**BASE, "num_hidden_layers": 4, "n_shared_head": 2}, "FD FD FD FD",
        "PLaMo 1: parallel attention and MLP, shared K/V heads"),
    "plamo2": FamilySpec(
        "plamo2", {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "hidden_size_per_head": 16, "max_position_embeddings": 2048, "attention_window_size": 8,
                   "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_num_heads": 4, "mamba_step": 2,
                   "mamba_chunk_size": 16, "intermediate_size": 128, "rms_norm_eps": 1e-5},
        "MD FD MD FD", "PLaMo 2: Mamba2 layers alternating with attention", embed_std=0.06),
    "plamo3": FamilySpec(
        "plamo3", {"hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "head_dim": 16, "max_position_embeddings": 2048, "window_size": 8, "sliding_window": 8,
                   "sliding_window_pattern": 3, "intermediate_size": 128, "rms_norm_eps": 1e-5},
        "SD SD FD SD SD FD", "PLaMo 3: sliding/global pattern", scale=0.5, embed_std=0.03),
    "baichuan_m1": FamilySpec(
        "baichuan_m1", {**BASE, "num_hidden_layers": 4, "sliding_window": 8, "sliding_window_layers": [0, 2],
                        "conv_window": 2},
        "SD FD SD FD", "Baichuan-M1: windowed layers interleaved with global ones, a 2-tap conv over k/v"),
    "lille-130m": FamilySpec(
        "lille-130m", {"block_size": 2048, "layer_norm_eps": 1e-5, "n_embd": 64, "n_head": 4, "n_kv_heads": 2,
                       "n_layer": 4, "rope_theta": 10000.0},
        "FD FD FD FD", "Lille 130M"),
    "youtu_llm": FamilySpec(
        "youtu_llm", {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 4, "kv_lora_rank": 64,
                      "q_lora_rank": 64, "qk_rope_head_dim": 16, "v_head_dim": 16, "qk_nope_head_dim": 16},
        "FD FD FD FD", "Youtu-LLM: MLA, dense"),
    "mellum": FamilySpec(
        "mellum", {**BASE, "num_hidden_layers": 6, **_MOE, "tie_word_embeddings": False, "norm_topk_prob": True,
                   "sliding_window": 8, "rope_parameters": dict(_ROPE_BY_TYPE),
                   "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2},
        "SE SE FE SE SE FE", "Mellum: sliding/global pattern, every layer MoE"),
    "spark2_5": FamilySpec(
        "spark2_5", {**BASE, "num_hidden_layers": 6, "sliding_window": 8, "rope_parameters": dict(_ROPE_BY_TYPE),
                     "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2},
        "SD SD FD SD SD FD", "Spark 2.5: head-wise gated attention, sliding/global pattern"),
    "laguna": FamilySpec(
        "laguna", {**BASE, "num_hidden_layers": 6, "sliding_window": 8, **_MOE, "shared_expert_intermediate_size": 64,
                   "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
                   "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse", "sparse"]},
        "SD SE FE SE SE FE", "Laguna: gated attention, sliding/global, layer 0 dense then MoE"),
    "bailing_moe_linear": FamilySpec(
        "bailing_moe_linear",
        {**BASE, "num_hidden_layers": 8, "num_experts": 8, "num_shared_experts": 1, "norm_topk_prob": True,
         "num_experts_per_tok": 2, "moe_intermediate_size": 64, "first_k_dense_replace": 1, "layer_group_size": 4,
         "group_norm_size": 1},
        "LD LE LE FE LE LE LE FE", "Ling-Linear: lightning linear attention with full attention every 4th, MoE"),
    "gear": FamilySpec(
        "gear", {**BASE, "num_hidden_layers": 6,
                 "layer_types": ["conv_mixer", "sliding_attention", "full_attention"] * 2,
                 "sliding_window": 8, "query_pre_attn_scalar": 16},
        "CD SD FD CD SD FD", "Gear: short convolutions, sliding and global attention", scale=16.0,
        embed_std=0.03),
    "longcat_flash_ngram": FamilySpec(
        "longcat_flash_ngram",
        {"hidden_size": 64, "num_layers": 4, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "zero_expert_type": "identity", "ffn_hidden_size": 128, "moe_topk": 2,
         "expert_ffn_hidden_size": 64, "n_routed_experts": 8, "zero_expert_num": 2, "num_attention_heads": 4,
         "kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
         "routed_scaling_factor": 2.0, "mla_scale_q_lora": True, "mla_scale_kv_lora": True,
         "ngram_vocab_size_ratio": 2, "emb_neighbor_num": 2, "emb_split_num": 2},
        "FE FE FE FE", "LongCat-Flash n-gram: LongCat-Flash with n-gram hashed embeddings"),
    "bailing_hybrid": FamilySpec(
        "bailing_hybrid",
        {**BASE, "num_hidden_layers": 8, **_MOE, "num_shared_experts": 1, "n_group": 2, "topk_group": 1,
         "first_k_dense_replace": 1, "layer_group_size": 4, "group_norm_size": 1, "routed_scaling_factor": 2.5,
         "kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16},
        "LD LE LE FE LE LE LE FE",
        "Ling 2.0 hybrid (bailing_hybrid): lightning linear attention with MLA every 4th layer, layer 0 "
        "dense, then 8 experts in 2 groups top-2 plus a shared expert"),
    "phixtral": FamilySpec(
        "phixtral", {"num_vocab": 512, "model_dim": 64, "num_heads": 4, "num_layers": 4, "rotary_dim": 8,
                     "num_experts_per_tok": 2, "num_local_experts": 4},
        "FE FE FE FE", "Phixtral: Phi-2 blocks whose MLPs are 4 experts top-2"),
    "nemotron-nas": FamilySpec(
        "nemotron-nas", {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                         "block_configs": [
                             {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 2.0}},
                             {"attention": {"no_op": True}, "ffn": {"ffn_mult": 2.0}},
                             {"attention": {"replace_with_linear": True}, "ffn": {"ffn_mult": 2.0}},
                             {"attention": {"n_heads_in_group": 2}, "ffn": {"no_op": True}}]},
        "FD -D -D F-",
        "Nemotron-NAS (Llama-3.1-Nemotron Super / Ultra): per-layer blocks, attention skipped or "
        "replaced by a linear map, MLP skipped"),
    "muse_glimmer": FamilySpec(
        "muse_glimmer", {**BASE, "num_hidden_layers": 6, "sliding_window": 8,
                         "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
                         "tie_word_embeddings": False},
        "SD SD FD SD SD FD",
        "Muse Glimmer (text tower): 8-token sliding windows with a global layer every 3rd, post-norms, "
        "final soft-capping"),
})
