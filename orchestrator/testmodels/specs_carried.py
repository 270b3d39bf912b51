"""Specs of the families whose stage boundary carries more than the hidden state: Gemma 4
(gemma4_text, and gemma4 as published, its decoder under `text_config` beside a vision tower)
Hunyuan-Large (hunyuan), RWKV-7 (rwkv7), Talkie (talkie) and Kimi-K3 (kimi_k3).

Six layers, sliding windows of 8 with a global layer every 3rd (S S F S S F); the last two
reuse the K/V of layers 3 (sliding) and 2 (global), so a boundary before layer 3, 4 or 5 is
refused (support.shared_kv_cuts) and the matrix cuts at 1 and 2; each layer gets an 8-wide
per-layer input from the token ids, which crosses every boundary (engine/stage/carry.py).

Hunyuan: six MoE layers in cross-layer-attention pairs (0-1, 2-3, 4-5): the second of each pair
attends with the first one's K/V projections, which cross a boundary at 1, 3 or 5. RWKV-7:
four layers; layer 0's value residual (v_first, [1, L, heads, head_dim]) crosses every boundary.
Talkie: four layers that each take the normalised token embedding (their first argument, the
hidden state their second) and add it back with a learned gain; it crosses every boundary.
Kimi-K3: Kimi-Linear's six hybrid layers with attention residuals in blocks of two: each layer's
input mixes the outputs of every block so far, which cross each boundary (one block at 1 and 2,
two at 3, three at 5).

AFM (afm7): six layers, the last two KV-reuse layers (its second layer list) attending over
layer 3's K/V; a boundary before layer 4 or 5 is refused, so the matrix cuts at 1, 2 and 3.
"""

from __future__ import annotations

from types import MappingProxyType

from orchestrator.testmodels.specs import BASE, FamilySpec

_VOCAB = 512  # families.VOCAB

_GEMMA4 = {
    **BASE, "num_hidden_layers": 6, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 2,
    "sliding_window": 8, "sliding_window_pattern": 3, "num_kv_shared_layers": 2,
    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": _VOCAB, "final_logit_softcapping": 30.0,
    "rope_parameters": {
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
    },
}
_PATTERN = "SD SD FD SD -D -D"  # -: a KV-shared layer (attends over layer 3's / 2's cache, keeps none)

CARRIED = MappingProxyType({
    "gemma4_text": FamilySpec(
        "gemma4_text",
        dict(_GEMMA4),
        _PATTERN,
        "Gemma 4 E2B/E4B shape: per-layer inputs from the token ids on every layer, the last two layers "
        "reuse earlier layers' K/V (KV sharing), layers return (hidden, K/V, offset); tied, soft-capped head",
        embed_std=0.125,
    ),
    "gemma4": FamilySpec(
        "gemma4",
        dict(_GEMMA4),
        _PATTERN,
        "Gemma 4 as published: gemma4_text under text_config, vocab_size at the top level, vision tower "
        "beside it",
        embed_std=0.125,
        text_config=True,
        text_model_type="gemma4_text",
        outer={"vocab_size": _VOCAB},
        tower="vision_tower",
    ),
    "hunyuan": FamilySpec(
        "hunyuan",
        {**BASE, "num_hidden_layers": 6, "attention_bias": False, "use_qk_norm": True, "use_cla": True,
         "cla_share_factor": 2, "num_experts": 4, "moe_topk": 2, "num_shared_expert": 1, "use_mixed_mlp_moe": True,
         "moe_intermediate_size": 64, "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
         "tie_word_embeddings": True},
        "FE FE FE FE FE FE",
        "Hunyuan-Large shape: cross-layer attention (pairs share the first layer's K/V projections), "
        "mixed shared + routed experts, q/k norm after RoPE, NTK-alpha RoPE; tied head",
    ),
    "rwkv7": FamilySpec(
        "rwkv7",
        {"hidden_size": 64, "intermediate_size": 128, "norm_eps": 1e-5, "head_dim": 16, "num_hidden_layers": 4,
         "a_low_rank_dim": 16, "v_low_rank_dim": 16, "gate_low_rank_dim": 16, "decay_low_rank_dim": 16,
         "tie_word_embeddings": False},
        "LD LD LD LD",
        "RWKV-7: recurrent state caches, token shift, the first layer's value residual read by every later "
        "layer (crosses each boundary beside the hidden state)",
    ),
    "talkie": FamilySpec(
        "talkie",
        {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
         "head_dim": 16, "rope_theta": 10000.0, "max_position_embeddings": 2048,
         "rms_norm_eps": 1.1920928955078125e-07},
        "FD FD FD FD",
        "Talkie shape: weightless norms, every block adds the normalised token embedding back with a learned "
        "gain (it crosses each boundary beside the hidden state), a bare gained output projection",
        fills=(("embed_skip.a_g", 16.0),),
    ),
    "kimi_k3": FamilySpec(
        "kimi_k3",
        {**BASE, "num_hidden_layers": 6, "num_key_value_heads": 4,
         "linear_attn_config": {"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3, 6], "num_heads": 4,
                                "head_dim": 16, "short_conv_kernel_size": 4},
         "num_experts": 8, "moe_intermediate_size": 64, "num_experts_per_token": 2, "num_shared_experts": 1,
         "kv_lora_rank": 64, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
         "mla_use_nope": True, "first_k_dense_replace": 1, "moe_router_activation_func": "sigmoid",
         "routed_scaling_factor": 2.5, "hidden_act": "situ", "activation_situ_beta": 4.0,
         "attn_res_block_size": 2, "tie_word_embeddings": False},
        "LD LE NE LE LE NE",
        "Kimi-K3 as published: its decoder under text_config beside a vision tower; Kimi delta attention "
        "with MLA every 3rd layer, experts from layer 1, attention residuals over blocks of two layers "
        "(every block's output so far crosses each boundary)",
        text_config=True,
        text_model_type="kimi_k3_text",
        tower="vision_tower",
    ),
    "gemma3n": FamilySpec(
        "gemma3n",
        {"hidden_size": 64, "num_hidden_layers": 6, "intermediate_size": 128, "num_attention_heads": 4,
         "head_dim": 16, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "num_kv_shared_layers": 2,
         "vocab_size_per_layer_input": _VOCAB, "sliding_window": 8, "max_position_embeddings": 2048,
         "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0, "final_logit_softcapping": 30.0,
         "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                         "sliding_attention", "full_attention"],
         "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0], "hidden_size_per_layer_input": 8,
         "altup_num_inputs": 4, "altup_coef_clip": 120.0, "altup_correct_scale": True, "altup_active_idx": 0,
         "laurel_rank": 16},
        _PATTERN,
        "Gemma 3n as published: its decoder under text_config beside vision and audio towers; AltUp's four "
        "hidden streams stacked before the batch axis, per-layer inputs from the token ids, the last two layers "
        "attending over layer 3's / 2's cache (KV sharing), top-k sparse GELU in the first two MLPs",
        embed_std=0.125,
        text_config=True,
        text_model_type="gemma3n_text",
        tower="model.vision_tower",
        outer={"audio_config": {"model_type": "gemma3n_audio", "hidden_size": 32, "num_hidden_layers": 12}},
        fills=(("correct_output_scale", 1.0),),
    ),
    "deepseek_v41": FamilySpec(
        "deepseek_v41",
        {"hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4, "head_dim": 32, "q_lora_rank": 32,
         "qk_rope_head_dim": 16, "o_groups": 2, "o_lora_rank": 32, "moe_intermediate_size": 64,
         "n_routed_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-6, "sliding_window": 8,
         "compress_ratios": [0, 4, 4, 4, 4, 4], "kv_source_layer_ids": [1, 3], "index_source_layer_ids": [1, 2, 4],
         "candidate_source_layer_id": 2, "candidate_topk_blocks": 2, "candidate_block_size": 2,
         "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4, "hc_mult": 4, "hc_sinkhorn_iters": 4,
         "max_position_embeddings": 2048, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 512},
         "tie_word_embeddings": False},
        "SE FE SE FE SE SE",
        "DeepSeek-V4.1 as published: its decoder under text_config; four hyper-connection residual streams "
        "mixed by each layer; a sliding window of 8 everywhere; layers 1-5 also attend over compressed K/V "
        "(groups of 4 tokens) that layers 1 and 3 make and keep (F), picked by the indexers of layers 1, 2, 4 "
        "(layer 2 also picks candidate blocks for layer 4); what a later layer reads of that crosses each "
        "boundary",
        text_config=True,
        text_model_type="deepseek_v41",
    ),
    "afm7": FamilySpec(
        "afm7",
        {"hidden_dim": 64, "num_layers": 6, "num_kv_reuse_layers": 2, "num_heads": 4, "num_kv_heads": 2,
         "hidden_dim_scale_factor": 2.0, "rope_theta": 10000.0, "rms_norm_eps": 1e-5},
        "FD FD FD FD -D -D",
        "Apple Foundation Model shape: fused QKV projection, q/k norm after RoPE, fake 8-bit K/V; the last two "
        "layers (model.kv_reuse_layers) keep no cache and attend over layer 3's K/V; tied head; float only "
        "(mlx-lm 0.32.2 cannot quantize or load a quantized afm7: its FusedLinear.to_quantized takes no mode)",
        quants=(),
    ),
})
