"""Specs of the families whose MLPs are all dense (attention-only, hybrid linear / SSM).

Shaped as `families.py`'s docstring says: 4-6 layers of hidden 64, sliding windows of 8
tokens, sliding/global and hybrid patterns of period 2-3.
"""

from __future__ import annotations

from types import MappingProxyType

from orchestrator.testmodels.specs import BASE, FamilySpec

DENSE = MappingProxyType({
    "llama": FamilySpec(
        "llama",
        {**BASE, "num_hidden_layers": 6, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False},
        "FD FD FD FD FD FD",
        "plain Llama, tied head",
    ),
    "mistral": FamilySpec(
        "mistral",
        {
            **BASE,
            "num_hidden_layers": 6,
            "tie_word_embeddings": False,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
        },
        "SD SD FD SD SD FD",
        "mlx-lm maps mistral onto llama.py; layer_types interleave 8-token sliding windows "
        "with global layers (period 3), untied head",
    ),
    "qwen2": FamilySpec(
        "qwen2",
        {**BASE, "num_hidden_layers": 6, "tie_word_embeddings": True},
        "FD FD FD FD FD FD",
        "q/k/v biases, tied head",
    ),
    "qwen3": FamilySpec(
        "qwen3",
        {**BASE, "num_hidden_layers": 6, "tie_word_embeddings": True},
        "FD FD FD FD FD FD",
        "q/k norms, tied head",
    ),
    "qwen3_5": FamilySpec(
        "qwen3_5",
        {**BASE, "num_hidden_layers": 6, "full_attention_interval": 3,
         "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
         "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "tie_word_embeddings": True,
         "rope_parameters": {"type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}},
        "LD LD FD LD LD FD",
        "config nested under text_config as published (vision tower omitted); dense MLP, "
        "gated-delta linear attention, full attention every 3rd layer, tied head",
        text_config=True,
    ),
    "gemma2": FamilySpec(
        "gemma2",
        {**BASE, "num_hidden_layers": 4, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 10.0,
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
        {**BASE, "num_hidden_layers": 6, "query_pre_attn_scalar": 16, "sliding_window": 8,
         "sliding_window_pattern": 3, "rope_local_base_freq": 10000.0},
        "SD SD FD SD SD FD",
        "8-token sliding windows with a global layer every 3rd; head tied by the loader "
        "(no lm_head in the weights, as published)",
        omit=("lm_head.",),
        embed_std=0.125,
    ),
    "glm4": FamilySpec(
        "glm4",
        {**BASE, "num_hidden_layers": 4, "attention_bias": True, "partial_rotary_factor": 0.5},
        "FD FD FD FD",
        "partial RoPE (half the head), q/k/v biases, extra post-attention / post-MLP norms",
    ),
    "llama4_text": FamilySpec(
        "llama4_text",
        {**BASE, "num_hidden_layers": 6, "intermediate_size_mlp": 128, "use_qk_norm": True,
         "no_rope_layers": [1, 1, 0] * 2, "tie_word_embeddings": False},
        "FD FD ND FD FD ND",
        "every 3rd layer without RoPE (no_rope_layers), q/k norm on the RoPE layers",
    ),
    "phi3": FamilySpec(
        "phi3",
        {**BASE, "num_hidden_layers": 4, "tie_word_embeddings": False},
        "FD FD FD FD",
        "fused qkv_proj and gate_up_proj",
    ),
    "olmo2": FamilySpec(
        "olmo2",
        {**BASE, "num_hidden_layers": 4, "tie_word_embeddings": False},
        "FD FD FD FD",
        "post-norms and full-width q/k norms",
    ),
    "gemma": FamilySpec(
        "gemma",
        {**BASE, "num_hidden_layers": 4},
        "FD FD FD FD",
        "Gemma 1: embedding x sqrt(hidden), GeGLU, (1 + w) RMSNorm, tied head",
        embed_std=0.125,
    ),
    "starcoder2": FamilySpec(
        "starcoder2",
        {**BASE, "num_hidden_layers": 4, "norm_epsilon": 1e-5, "tie_word_embeddings": True},
        "FD FD FD FD",
        "LayerNorm with biases, biased projections, GELU MLP (c_fc / c_proj), tied head",
    ),
    "internlm2": FamilySpec(
        "internlm2",
        {**BASE, "num_hidden_layers": 4, "bias": False, "tie_word_embeddings": False},
        "FD FD FD FD",
        "fused wqkv (grouped per key/value head), w1/w2/w3 MLP, untied output head",
    ),
    "internlm3": FamilySpec(
        "internlm3",
        {**BASE, "num_hidden_layers": 4, "bias": False, "qkv_bias": False, "tie_word_embeddings": False},
        "FD FD FD FD",
        "Llama-shaped with InternLM's config keys, untied head",
    ),
    "minicpm": FamilySpec(
        "minicpm",
        {**BASE, "num_hidden_layers": 4, "dim_model_base": 32, "scale_depth": 1.4, "scale_emb": 4.0,
         "tie_word_embeddings": False},
        "FD FD FD FD",
        "muP scalings: embedding x scale_emb, residuals x scale_depth / sqrt(layers), head "
        "input / (hidden / dim_model_base)",
        embed_std=0.25,
    ),
    "seed_oss": FamilySpec(
        "seed_oss",
        {**BASE, "num_hidden_layers": 4, "attention_bias": True, "attention_out_bias": False,
         "tie_word_embeddings": False},
        "FD FD FD FD",
        "q/k/v biases, explicit head_dim, untied head",
    ),
    "apertus": FamilySpec(
        "apertus",
        {**BASE, "num_hidden_layers": 4, "mlp_bias": False, "attention_bias": False, "post_norm": False,
         "qk_norm": True, "tie_word_embeddings": False},
        "FD FD FD FD",
        "xIELU MLP (up / down only), q/k norms, untied head",
    ),
    "smollm3": FamilySpec(
        "smollm3",
        {**BASE, "num_hidden_layers": 6, "no_rope_layer_interval": 3, "tie_word_embeddings": True},
        "FD FD ND FD FD ND",
        "llama.py with every 3rd layer without RoPE (no_rope_layer_interval), tied head",
    ),
    "exaone4": FamilySpec(
        "exaone4",
        {**BASE, "num_hidden_layers": 6, "sliding_window": 8, "sliding_window_pattern": "LLG",
         "rope_scaling": None, "tie_word_embeddings": False},
        "SD SD FD SD SD FD",
        "8-token sliding windows with a global layer every 3rd (pattern LLG), q/k norms, post-norms",
    ),
    "cohere2": FamilySpec(
        "cohere2",
        {**BASE, "num_hidden_layers": 6, "layer_norm_eps": 1e-5, "logit_scale": 0.25, "sliding_window": 8,
         "sliding_window_pattern": 3},
        "SD SD FD SD SD FD",
        "Command R7B / A: parallel attention + MLP off one LayerNorm, 8-token sliding windows "
        "with RoPE and a global layer without RoPE every 3rd, scaled logits, tied head",
    ),
    "olmo3": FamilySpec(
        "olmo3",
        {**BASE, "num_hidden_layers": 6, "sliding_window": 8,
         "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
         "tie_word_embeddings": False},
        "SD SD FD SD SD FD",
        "layer_types interleave 8-token sliding windows with global layers (period 3), "
        "post-norms and full-width q/k norms",
    ),
    "hunyuan_v1_dense": FamilySpec(
        "hunyuan_v1_dense",
        {**BASE, "num_hidden_layers": 4, "use_qk_norm": True, "tie_word_embeddings": True},
        "FD FD FD FD",
        "Hunyuan dense: q/k norms after RoPE, tied head",
    ),
    "lfm2": FamilySpec(
        "lfm2",
        {**BASE, "num_hidden_layers": 6, "norm_eps": 1e-5, "conv_bias": False, "conv_L_cache": 3,
         "block_dim": 64, "block_ff_dim": 128, "block_multiple_of": 64, "block_ffn_dim_multiplier": 1.0,
         "block_auto_adjust_ff_dim": False,
         "layer_types": ["conv", "conv", "full_attention"] * 2, "tie_word_embeddings": True},
        "CD CD FD CD CD FD",
        "LFM2: gated short-convolution layers (3-token state) with attention every 3rd, q/k norms",
    ),
    "falcon_h1": FamilySpec(
        "falcon_h1",
        {**BASE, "num_hidden_layers": 4, "mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16,
         "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_chunk_size": 16,
         "mamba_expand": 1, "embedding_multiplier": 1.0, "lm_head_multiplier": 1.0, "tie_word_embeddings": False},
        "PD PD PD PD",
        "Falcon-H1: attention and Mamba2 in parallel in every layer (P), muP multipliers",
    ),
})
