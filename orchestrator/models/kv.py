"""What each layer of a model keeps per request, derived from config.json alone (pure).

Each family's rule mirrors its mlx-lm `make_cache()` (which layer gets a KVCache, a
RotatingKVCache, an ArraysCache or a CacheList) and its attention module (how many key /
value heads of what width it stores). The kinds and their byte formulas live in
families/kv_layers.py. The rules are checked against the caches mlx-lm really builds
(tests/planner/test_memory_families.py, tests/models/test_kv.py).

Imports neither mlx nor the planner, so describe.py can call it for the agent's report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.families.kv_layers import (
    FLOAT32,
    NONE,
    CacheKind,
    LayerCache,
    attention,
    gated_delta_state,
    get,
    kimi_delta_state,
    kv_bytes,
    latent,
    mamba2_state,
    mamba_state,
    short_conv_state,
    sliding,
)
from orchestrator.families.support import family_of
from orchestrator.models.kv_classic import RULES as CLASSIC_RULES

__all__ = ["FLOAT32", "CacheKind", "LayerCache", "layer_caches"]

Layers = tuple[LayerCache, ...]

# Families whose mlx-lm attention takes head_dim = hidden_size / heads and ignores any
# head_dim in config.json.
HIDDEN_OVER_HEADS = frozenset({
    "apertus", "bailing_moe", "granitemoe", "granitemoehybrid", "internlm2", "internlm3", "jamba", "lfm2",
    "lfm2_moe", "minicpm", "mixtral", "phi3", "phimoe", "qwen2", "qwen2_moe", "starcoder2", "qwen2_vl",
})


def _by_types(types: list[str], n: int, kinds: dict[str, LayerCache], default: LayerCache) -> Layers:
    """One cache per layer from a per-layer type list (layer_types and the like)."""
    return tuple(kinds.get(types[i], default) if i < len(types) else default for i in range(n))


def _llama(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # mlx-lm runs mistral with llama.py: layer_types may interleave sliding windows.
    attn, window = attention(cfg, dt), cfg.get("sliding_window")
    types = cfg.get("layer_types") or ["full_attention"] * n
    return _by_types(types, n, {"sliding_attention": sliding(attn, window)} if window else {}, attn)


def _gemma3(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    attn = attention(cfg, dt)
    period, window = int(get(cfg, "sliding_window_pattern", 6)), int(get(cfg, "sliding_window", 512))
    return tuple(attn if i % period == period - 1 else sliding(attn, window) for i in range(n))


def _cohere2(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Every sliding_window_pattern-th layer global (and without RoPE), the rest windowed.
    attn = attention(cfg, dt)
    period, window = int(get(cfg, "sliding_window_pattern", 4)), int(get(cfg, "sliding_window", 4096))
    return tuple(attn if i % period == period - 1 else sliding(attn, window) for i in range(n))


def _exaone4(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # A string pattern such as "LLLG" repeated over the layers: L local (windowed), G global;
    # without one every layer is global.
    attn, pattern = attention(cfg, dt), cfg.get("sliding_window_pattern")
    window = cfg.get("sliding_window")
    if not isinstance(pattern, str) or not pattern or not window:
        return (attn,) * n
    return tuple(sliding(attn, window) if pattern[i % len(pattern)] == "L" else attn for i in range(n))


def _olmo3(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # mlx-lm's default when layer_types is missing: every 4th layer global.
    attn = attention(cfg, dt)
    types = cfg.get("layer_types") or ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n)]
    return tuple(attn if types[i] == "full_attention" else sliding(attn, int(cfg["sliding_window"])) for i in range(n))


def _gpt_oss(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    attn = attention(cfg, dt)
    types = cfg.get("layer_types") or ["sliding_attention", "full_attention"] * (n // 2)
    window = int(get(cfg, "sliding_window", 128))
    return tuple(attn if types[i] == "full_attention" else sliding(attn, window) for i in range(n))


def _mimo_v2(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Sliding layers have their own head counts and widths (swa_*); keys and values may
    # differ in width (v_head_dim).
    full = LayerCache(kind="attention", token_bytes=kv_bytes(
        int(cfg["num_key_value_heads"]), int(cfg["head_dim"]), int(cfg["v_head_dim"]), dt))
    local = LayerCache(kind="sliding", window=int(cfg["sliding_window_size"]), token_bytes=kv_bytes(
        int(cfg["swa_num_key_value_heads"]), int(cfg["swa_head_dim"]), int(cfg["swa_v_head_dim"]), dt))
    pattern = cfg["hybrid_layer_pattern"]
    return tuple(local if pattern[i] == 1 else full for i in range(n))


def _step3p5(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Key / value heads are num_attention_groups (not num_key_value_heads); sliding layers
    # take theirs from attention_other_setting. Without layer_types even layers slide.
    dim, other = int(cfg["head_dim"]), cfg.get("attention_other_setting")
    full = LayerCache(kind="attention", token_bytes=kv_bytes(int(cfg["num_attention_groups"]), dim, dim, dt))
    groups = int(other["num_attention_groups"]) if other else int(cfg["num_attention_groups"])
    local = LayerCache(kind="sliding", window=int(get(cfg, "sliding_window", 512)),
                       token_bytes=kv_bytes(groups, dim, dim, dt))
    types = cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    return tuple(local if types[i] == "sliding_attention" else full for i in range(n))


def _qwen3_next(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    interval, linear = int(get(cfg, "full_attention_interval", 4)), gated_delta_state(cfg, dt)
    attn = attention(cfg, dt)
    return tuple(linear if (i + 1) % interval else attn for i in range(n))


def _nemotron_h(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    mamba = LayerCache(kind="state", state_bytes=mamba2_state(
        int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"]), int(cfg["ssm_state_size"]),
        int(get(cfg, "n_groups", 1)), int(get(cfg, "conv_kernel", 4)), dt))
    kinds = {"M": mamba, "*": attention(cfg, dt)}
    return _by_types(list(cfg["hybrid_override_pattern"]), n, kinds, NONE)


def _granite_mamba2(cfg: dict[str, Any], dt: int) -> int:
    """Granite 4.0-H / Falcon-H1's Mamba2 keys."""
    return mamba2_state(int(cfg["mamba_n_heads"]), int(cfg["mamba_d_head"]), int(cfg["mamba_d_state"]),
                        int(get(cfg, "mamba_n_groups", 1)), int(get(cfg, "mamba_d_conv", 4)), dt)


def _granitemoehybrid(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    kinds = {"mamba": LayerCache(kind="state", state_bytes=_granite_mamba2(cfg, dt)),
             "attention": attention(cfg, dt, use_head_dim=False)}
    return _by_types(cfg["layer_types"], n, kinds, NONE)


def _falcon_h1(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Every layer runs attention and Mamba2 side by side: CacheList(ArraysCache, KVCache).
    # mlx-lm's defaults stand in for missing keys; the Mamba2 x is mamba_d_ssm wide.
    heads = int(get(cfg, "num_attention_heads", 8))
    kv = kv_bytes(int(get(cfg, "num_key_value_heads", heads)), int(get(cfg, "head_dim", 64)),
                  int(get(cfg, "head_dim", 64)), dt)
    state = mamba2_state(int(get(cfg, "mamba_n_heads", 24)), int(get(cfg, "mamba_d_head", 64)),
                         int(get(cfg, "mamba_d_state", 128)), int(get(cfg, "mamba_n_groups", 1)),
                         int(get(cfg, "mamba_d_conv", 4)), dt, inner=int(get(cfg, "mamba_d_ssm", 1536)))
    return (LayerCache(kind="attention", token_bytes=kv, state_bytes=state),) * n


def _jamba(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    period, offset = int(get(cfg, "attn_layer_period", 8)), int(get(cfg, "attn_layer_offset", 4))
    attn, mamba = attention(cfg, dt, use_head_dim=False), mamba_state(cfg, dt)
    return tuple(attn if i % period == offset else mamba for i in range(n))


def _lfm2(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Attention at full_attn_idxs (else where layer_types says full_attention); every other
    # layer a gated short convolution with a constant state.
    full = cfg.get("full_attn_idxs")
    if full is None:
        full = [i for i, t in enumerate(cfg.get("layer_types") or []) if t == "full_attention"]
    attn, conv = attention(cfg, dt, use_head_dim=False), short_conv_state(cfg, dt)
    return tuple(attn if i in full else conv for i in range(n))


def _kimi_linear(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # linear_attn_config numbers layers from 1: kda_layers are Kimi delta attention (constant
    # state), the others MLA, cached as latent + RoPE key (the RoPE part may be absent).
    linear = cfg["linear_attn_config"]
    kda, mla = kimi_delta_state(linear, dt), LayerCache(kind="attention", token_bytes=latent(cfg, dt))
    return tuple(kda if i + 1 in linear["kda_layers"] else mla for i in range(n))


def _mla(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # DeepSeek-V3 (Kimi-K2, JoyAI), GLM-4.7-Flash: latent + shared RoPE key.
    return (LayerCache(kind="attention", token_bytes=latent(cfg, dt)),) * n


def _deepseek_v32(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # CacheList(latent KVCache, indexer KVCache): the lightning indexer stores its one key
    # head (index_head_dim) as both keys and values of its own cache.
    index = 2 * int(get(cfg, "index_head_dim", 128)) * dt
    return (LayerCache(kind="attention", token_bytes=latent(cfg, dt) + index),) * n


def _deepseek_v41(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Its own LayerCache: a sliding window of single-head rows (head_dim, keys and values at
    # once); a compressing source layer also keeps one entry per `ratio` tokens (and, when it
    # indexes, an index key of index_head_dim), plus the open group's rows in float32.
    head, window = int(get(cfg, "head_dim", 512)), int(get(cfg, "sliding_window", 128))
    ratios = list(get(cfg, "compress_ratios", []))
    kv, index = set(get(cfg, "kv_source_layer_ids", [])), set(get(cfg, "index_source_layer_ids", []))
    out = []
    for i in range(n):
        ratio = int(ratios[i]) if i < len(ratios) else 0
        rows = sliding(LayerCache(kind="sliding", token_bytes=head * dt), window)
        if not (ratio and i in kv):
            out.append(rows)
            continue
        entry = head * dt + (int(get(cfg, "index_head_dim", 128)) * dt if i in index else 0)
        open_group = 2 * (ratio - 1) * head * FLOAT32  # pending K/V and gate rows
        out.append(LayerCache(kind="attention", token_bytes=entry // ratio,
                              state_bytes=window * head * dt + open_group, exact=True))
    return tuple(out)


def _longcat_flash(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Two MLA blocks per layer, CacheList(KVCache, KVCache): two latents per token.
    return (LayerCache(kind="attention", token_bytes=2 * latent(cfg, dt)),) * n


def _deepseek_v2(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # mlx-lm's deepseek_v2 decompresses before caching: every head's key (nope + rope parts)
    # and value.
    heads = int(cfg["num_attention_heads"])
    key = int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    return (LayerCache(kind="attention", token_bytes=kv_bytes(heads, key, int(cfg["v_head_dim"]), dt)),) * n


def _bailing_moe_v3(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Kimi delta attention (num_attention_heads x head_dim) except every layer_group_size-th
    # layer and the tail past the last whole group, which run MLA (latent + RoPE key).
    group = int(get(cfg, "layer_group_size", 4))
    kda = kimi_delta_state({"num_heads": get(cfg, "num_attention_heads", 16), "head_dim": get(cfg, "head_dim", 128),
                            "short_conv_kernel_size": get(cfg, "short_conv_kernel_size", 4)}, dt)
    mla = LayerCache(kind="attention", token_bytes=latent(cfg, dt))
    return tuple(mla if (i + 1) % group == 0 or i >= n // group * group else kda for i in range(n))


def _mistral3(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # mistral3.py has no make_cache of its own: every layer gets a plain KVCache (windows
    # unused), holding MLA latents when the decoder is mistral4.
    return _mla(cfg, n, dt) if cfg.get("kv_lora_rank") else (attention(cfg, dt),) * n


def _llama4(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Three layers in four keep a ChunkedKVCache, trimmed to attention_chunk_size before each
    # step and then grown by one 256-token allocation step: a decoding request holds chunk +
    # 256 tokens there (only the one request prefilling holds its chunk's tokens on top,
    # transiently). Every 4th layer is global.
    attn, chunk = attention(cfg, dt), int(get(cfg, "attention_chunk_size", 8192))
    return tuple(attn if (i + 1) % 4 == 0 else sliding(attn, chunk + 256) for i in range(n))


def _minimax_m3(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Block-sparse layers keep CacheList(KVCache, KVCache): keys and values, plus the
    # indexer's one key of index_head_dim per token; the others one KVCache.
    sparse = cfg.get("sparse_attention_config") or {}
    freq = sparse.get("sparse_attention_freq", cfg.get("sparse_attention_freq"))
    types = cfg.get("layer_types")
    index = int(sparse.get("sparse_index_dim", get(cfg, "index_head_dim", 0))) * dt
    block = sparse.get("sparse_block_size", cfg.get("index_block_size"))
    attn = attention(cfg, dt)
    with_index = LayerCache(kind="attention", token_bytes=attn.token_bytes + index)

    def is_sparse(i: int) -> bool:
        if block is None:
            return False
        if types is not None:
            return types[i] != "full_attention"
        return bool(freq[i]) if freq is not None else True

    return tuple(with_index if is_sparse(i) else attn for i in range(n))


def _gemma3n(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # make_cache() covers the layers before the KV-shared ones (a RotatingKVCache per sliding
    # layer, a KVCache per global one); the last num_kv_shared_layers read those and keep none.
    attn, window = attention(cfg, dt), int(get(cfg, "sliding_window", 512))
    first_shared = n - int(get(cfg, "num_kv_shared_layers", 0))
    types = list(get(cfg, "layer_types", ["full_attention"] * n))
    return tuple(NONE if i >= first_shared else sliding(attn, window) if types[i] == "sliding_attention" else attn
                 for i in range(n))


def _gemma4(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # Sliding layers: head_dim and num_key_value_heads in a RotatingKVCache; global layers:
    # global_head_dim and num_global_key_value_heads; the last num_kv_shared_layers reuse
    # earlier layers' K/V and have no cache at all (make_cache stops before them).
    shared = int(get(cfg, "num_kv_shared_layers", 20))
    kv_heads = int(get(cfg, "num_key_value_heads", 1))
    local_dim, global_dim = int(get(cfg, "head_dim", 256)), int(get(cfg, "global_head_dim", 512))
    global_kv = int(get(cfg, "num_global_key_value_heads", kv_heads))
    pattern = int(get(cfg, "sliding_window_pattern", 5))
    types = cfg.get("layer_types") or ((["sliding_attention"] * (pattern - 1) + ["full_attention"]) * n)[:n]
    window = int(get(cfg, "sliding_window", 512))
    full = LayerCache(kind="attention", token_bytes=kv_bytes(global_kv, global_dim, global_dim, dt))
    local = sliding(LayerCache(kind="attention", token_bytes=kv_bytes(kv_heads, local_dim, local_dim, dt)), window)
    return tuple(NONE if i >= n - shared else full if types[i] == "full_attention" else local for i in range(n))


def _rwkv7(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # ArraysCache(3): the attention's token shift [1, hidden], its wkv state [1, heads, head_dim,
    # head_dim] and the FFN's token shift [1, hidden], all in the model dtype.
    hidden, head_dim = int(cfg["hidden_size"]), int(cfg["head_dim"])
    return (LayerCache(kind="state", state_bytes=(2 * hidden + hidden * head_dim) * dt),) * n


def _afm7(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    # model.layers: standard attention, num_kv_heads of hidden_dim / num_heads; the last
    # num_kv_reuse_layers (model.kv_reuse_layers) attend over the last one's K/V and keep no cache.
    reuse = int(get(cfg, "num_kv_reuse_layers", 0))
    heads = int(cfg["num_heads"])
    dim = int(cfg["hidden_dim"]) // heads
    attn = LayerCache(kind="attention", token_bytes=kv_bytes(int(get(cfg, "num_kv_heads", heads)), dim, dim, dt))
    return tuple(NONE if i >= n - reuse else attn for i in range(n))


Rule = Callable[[dict[str, Any], int, int], Layers]
RULES: dict[str, Rule] = {
    "llama": _llama, "mistral": _llama, "ministral3": _llama, "exaone_moe": _llama, "afmoe": _llama,
    "gemma3_text": _gemma3, "gemma4_text": _gemma4, "gemma4": _gemma4, "rwkv7": _rwkv7, "afm7": _afm7,
    "cohere2": _cohere2, "exaone4": _exaone4, "olmo3": _olmo3, "gpt_oss": _gpt_oss,
    "mimo_v2_flash": _mimo_v2, "step3p5": _step3p5,
    "qwen3_next": _qwen3_next, "qwen3_5": _qwen3_next, "qwen3_5_moe": _qwen3_next,
    "nemotron_h": _nemotron_h, "granitemoehybrid": _granitemoehybrid, "falcon_h1": _falcon_h1, "jamba": _jamba,
    "lfm2": _lfm2, "lfm2_moe": _lfm2, "kimi_linear": _kimi_linear, "kimi_k3": _kimi_linear,
    "deepseek_v3": _mla, "glm4_moe_lite": _mla, "mistral4": _mla, "deepseek_v32": _deepseek_v32,
    "deepseek_v41": _deepseek_v41, "gemma3n": _gemma3n,
    "glm_moe_dsa": _deepseek_v32, "longcat_flash": _longcat_flash, "bailing_moe_v3": _bailing_moe_v3,
    "deepseek_v2": _deepseek_v2,
    # Text decoders of multimodal checkpoints (the decoder view of describe.py).
    "gemma3": _gemma3, "mistral3": _mistral3, "kimi_vl": _mla, "kimi_k25": _mla, "lfm2_vl": _lfm2,
    "llama4": _llama4, "minimax_m3_vl": _minimax_m3,
    # Layer-type lists of the older / smaller decoders.
    "mellum": _llama, "spark2_5": _llama, "laguna": _llama, "muse_glimmer": _llama,
    **CLASSIC_RULES,
}


def layer_caches(cfg: dict[str, Any], num_layers: int, dtype_bytes: int) -> Layers:
    """The cache of every layer of a model, from its (text) config.json as mlx-lm reads it.

    Families without a rule in RULES use standard attention in every layer (Qwen2/3,
    Mixtral, GLM-4, Phi-3, OLMo 2, Llama 4 text, Gemma 1, StarCoder2, InternLM2/3, the
    plain MoE families, and Gemma 2, whose mlx-lm code ignores its configured sliding
    window), with head_dim as the family's module computes it.
    """
    family = family_of(cfg) or ""
    rule = RULES.get(family)
    if rule is not None:
        return rule(cfg, num_layers, dtype_bytes)
    return (attention(cfg, dtype_bytes, use_head_dim=family not in HIDDEN_OVER_HEADS),) * num_layers
