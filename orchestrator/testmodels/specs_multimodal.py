"""Specs of multimodal checkpoints served by their text decoder (Gemma 3, Llama 4, Mistral 3,
Qwen2/3-VL, Kimi-VL, Kimi-K2.5, LFM2-VL, Pixtral, MiniMax-M3-VL).

Each is written as it is published: the decoder's config under `text_config`, a
`vision_config` beside it, and the vision tower's tensors in the weights (NaN-filled, so
a stage that computed with one would produce NaN). The family's mlx-lm module loads the
text decoder and its sanitize() drops the tower; a stage then loads only its layers.
The decoder shapes reuse the text families' specs, so each row differs from its text
family by the layout (and the wrapper module's own code) only.
"""

from __future__ import annotations

from types import MappingProxyType

from orchestrator.testmodels.specs import BASE, FamilySpec
from orchestrator.testmodels.specs_dense import DENSE
from orchestrator.testmodels.specs_moe import MOE
from orchestrator.testmodels.specs_recent import RECENT

_VOCAB = 512  # families.VOCAB: gemma3 takes the vocabulary from the top level


def _text(spec: FamilySpec, **changes: object) -> dict[str, object]:
    """A text family's config as a multimodal checkpoint's text_config."""
    return {**spec.config, **changes}


MULTIMODAL = MappingProxyType({
    "gemma3": FamilySpec(
        "gemma3",
        _text(DENSE["gemma3_text"]),
        DENSE["gemma3_text"].layer_pattern,
        "Gemma 3 (4B-27B) as published: gemma3_text under text_config, vocab_size at the top level "
        "(gemma3.py overrides the text config's), SigLIP tower beside it; tied head",
        omit=("language_model.lm_head.",),
        embed_std=0.125,
        text_config=True,
        text_model_type="gemma3_text",
        outer={"vocab_size": _VOCAB},
        tower="vision_tower",
    ),
    "llama4": FamilySpec(
        "llama4",
        {**BASE, "num_hidden_layers": 4, "attention_bias": False, "attention_chunk_size": 8,
         "interleave_moe_layer_step": 2, "intermediate_size_mlp": 128, "num_experts_per_tok": 1,
         "num_local_experts": 4, "rope_scaling": None, "use_qk_norm": True, "tie_word_embeddings": False},
        "SD SE SD NE",
        "Llama 4 Scout / Maverick as published: 8-token chunked attention (S) with a global NoPE layer "
        "every 4th, MoE every 2nd layer (4 experts top-1 plus a shared expert), vision tower beside it",
        text_config=True,
        text_model_type="llama4_text",
        tower="vision_model",
    ),
    "mistral3": FamilySpec(
        "mistral3",
        _text(DENSE["mistral"]),
        "FD FD FD FD FD FD",
        "Mistral Small 3.1 / 3.2 as published: a mistral (llama.py) decoder under text_config, "
        "Pixtral tower beside it; mistral3.py has no make_cache, so the 8-token windows are masks "
        "over full caches",
        text_config=True,
        text_model_type="mistral",
        tower="vision_tower",
    ),
    "mistral3_ministral3": FamilySpec(
        "mistral3",
        _text(RECENT["ministral3"]),
        "FD FD FD FD FD FD",
        "Ministral 3 (3B-14B) as published: mistral3 with a ministral3 decoder (Llama-4 scaling; "
        "windows masked over full caches, as mistral3)",
        text_config=True,
        text_model_type="ministral3",
        tower="vision_tower",
    ),
    "mistral3_mistral4": FamilySpec(
        "mistral3",
        _text(RECENT["mistral4"]),
        RECENT["mistral4"].layer_pattern,
        "Mistral 4 as published: mistral3 with a mistral4 decoder (MLA, MoE)",
        text_config=True,
        text_model_type="mistral4",
        tower="vision_tower",
    ),
    "pixtral": FamilySpec(
        "pixtral",
        _text(DENSE["llama"], tie_word_embeddings=False),
        DENSE["llama"].layer_pattern,
        "Pixtral 12B as published: a llama decoder under text_config (pixtral.py unties the head)",
        text_config=True,
        text_model_type="mistral",
        tower="vision_tower",
    ),
    "qwen2_vl": FamilySpec(
        "qwen2_vl",
        _text(DENSE["qwen2"]),
        DENSE["qwen2"].layer_pattern,
        "Qwen2-VL / Qwen2.5-VL as published: a qwen2 decoder under text_config, visual tower",
        text_config=True,
        tower="visual",
    ),
    "qwen3_vl": FamilySpec(
        "qwen3_vl",
        _text(DENSE["qwen3"]),
        DENSE["qwen3"].layer_pattern,
        "Qwen3-VL dense as published: a qwen3 decoder under text_config, visual tower",
        text_config=True,
        tower="visual",
    ),
    "qwen3_vl_moe": FamilySpec(
        "qwen3_vl_moe",
        _text(MOE["qwen3_moe"]),
        MOE["qwen3_moe"].layer_pattern,
        "Qwen3-VL MoE as published: a qwen3_moe decoder under text_config, visual tower",
        text_config=True,
        tower="visual",
    ),
    "kimi_vl": FamilySpec(
        "kimi_vl",
        _text(MOE["deepseek_v3"]),
        MOE["deepseek_v3"].layer_pattern,
        "Kimi-VL as published: a DeepSeek-V3 decoder (MLA, MoE) under text_config, MoonViT tower",
        text_config=True,
        text_model_type="deepseek_v3",
        tower="vision_tower",
    ),
    "kimi_k25": FamilySpec(
        "kimi_k25",
        _text(MOE["kimi_k2"]),
        MOE["kimi_k2"].layer_pattern,
        "Kimi-K2.5 as published: a Kimi-K2 (DeepSeek-V3) decoder under text_config, vision tower",
        text_config=True,
        text_model_type="kimi_k2",
        tower="vision_tower",
    ),
    "lfm2-vl": FamilySpec(
        "lfm2-vl",
        _text(DENSE["lfm2"], tie_word_embeddings=False),
        DENSE["lfm2"].layer_pattern,
        "LFM2-VL as published: an lfm2 decoder under text_config (lfm2-vl.py unties the head), "
        "SigLIP2 tower",
        text_config=True,
        text_model_type="lfm2",
        tower="vision_tower",
    ),
    "minimax_m3_vl": FamilySpec(
        "minimax_m3_vl",
        {**BASE, "num_hidden_layers": 4, "intermediate_size": 64, "dense_intermediate_size": 128,
         "shared_intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2,
         "partial_rotary_factor": 0.5, "moe_layer_freq": [0, 1, 1, 1],
         "sparse_attention_config": {"sparse_num_index_heads": 2, "sparse_index_dim": 16, "sparse_block_size": 4,
                                     "sparse_topk_blocks": 2, "sparse_local_block": 1,
                                     "sparse_attention_freq": [0, 1, 1, 1]},
         "tie_word_embeddings": False},
        "FD FE FE FE",
        "MiniMax-M3-VL as published: block-sparse attention (an indexer keeps the 2 best 4-token "
        "blocks beside the local one) after a dense first layer, 8 experts top-2 plus a shared MLP",
        text_config=True,
        tower="vision_tower",
    ),
})
