"""What each layer of the older and smaller decoder families keeps per request (pure): the
rules of kv.py for families whose keys or layouts differ from the common ones (GPT-2-style
names, per-layer head counts, SSM-only stacks, hybrid patterns). Checked against the caches
mlx-lm builds (tests/planner/test_memory_families.py, tests/models/test_kv.py)."""

from __future__ import annotations

from typing import Any

from orchestrator.families.kv_layers import (
    FLOAT32,
    LayerCache,
    attention,
    gated_delta_state,
    get,
    kv_bytes,
    latent,
    mamba2_state,
    sliding,
)

Layers = tuple[LayerCache, ...]


def _heads(cfg: dict[str, Any], heads_key: str, hidden_key: str, kv_heads: int | None = None) -> tuple[int, int]:
    """(kv heads, head width) of a family that names its keys GPT-2 style."""
    heads = int(cfg[heads_key])
    return (kv_heads or int(get(cfg, "num_key_value_heads", heads))), int(cfg[hidden_key]) // heads


def gpt2(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """GPT-2, GPT-J: n_head heads of n_embd / n_head."""
    kv, dim = _heads(cfg, "n_head", "n_embd")
    return (LayerCache(kind="attention", token_bytes=kv_bytes(kv, dim, dim, dt)),) * n


def gpt_bigcode(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """StarCoder 1: one key / value head under multi-query attention."""
    kv, dim = _heads(cfg, "n_head", "n_embd", 1 if get(cfg, "multi_query", True) else None)
    return (LayerCache(kind="attention", token_bytes=kv_bytes(kv, dim, dim, dt)),) * n


def phixtral(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """Phixtral: num_heads heads of model_dim / num_heads, no grouping."""
    kv, dim = _heads(cfg, "num_heads", "model_dim")
    return (LayerCache(kind="attention", token_bytes=kv_bytes(kv, dim, dim, dt)),) * n


def dbrx(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """DBRX: attn_config's kv_n_heads heads of d_model / n_heads."""
    kv = int(get(cfg.get("attn_config") or {}, "kv_n_heads", 1))
    dim = int(cfg["d_model"]) // int(cfg["n_heads"])
    return (LayerCache(kind="attention", token_bytes=kv_bytes(kv, dim, dim, dt)),) * n


def lille(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """Lille: n_kv_heads heads of n_embd / n_head."""
    kv, dim = int(cfg["n_kv_heads"]), int(cfg["n_embd"]) // int(cfg["n_head"])
    return (LayerCache(kind="attention", token_bytes=kv_bytes(kv, dim, dim, dt)),) * n


def openelm(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """OpenELM: per-layer key / value head counts of head_dim."""
    dim, kv = int(cfg["head_dim"]), cfg["num_kv_heads"]
    return tuple(LayerCache(kind="attention", token_bytes=kv_bytes(int(kv[i]), dim, dim, dt)) for i in range(n))


def decompressed_mla(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """MiniCPM3, Youtu-LLM: MLA decompressed before caching, every head's key and value."""
    heads = int(cfg["num_attention_heads"])
    key = int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    value = int(get(cfg, "v_head_dim", int(cfg["hidden_size"]) // heads))
    return (LayerCache(kind="attention", token_bytes=kv_bytes(heads, key, value, dt)),) * n


def olmo_hybrid(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """OLMo hybrid: gated-delta layers (mlx-lm's default: every 4th layer full attention)."""
    types = cfg.get("layer_types") or ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
    linear, attn = gated_delta_state(cfg, dt), attention(cfg, dt)
    return tuple(linear if types[i] == "linear_attention" else attn for i in range(n))


def mamba(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """Mamba 1: a conv window and an SSM state over intermediate_size, in the model dtype."""
    inner = int(cfg["intermediate_size"])
    state = (int(get(cfg, "conv_kernel", 4)) - 1) * inner + inner * int(cfg["state_size"])
    return (LayerCache(kind="state", state_bytes=state * dt),) * n


def mamba2(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """Mamba 2: conv window over x, B and C and a float32 SSM state."""
    state_size = int(get(cfg, "ssm_state_size", cfg["state_size"]))
    state = mamba2_state(int(cfg["num_heads"]), int(cfg["head_dim"]), state_size, int(get(cfg, "n_groups", 1)),
                         int(get(cfg, "conv_kernel", 4)), dt)
    return (LayerCache(kind="state", state_bytes=state),) * n


def recurrent_gemma(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """RecurrentGemma: RG-LRU blocks (a conv window and the recurrence, lru_width wide) and local
    attention over attention_window_size tokens, cycling through block_types."""
    width = int(get(cfg, "lru_width", cfg["hidden_size"]))
    recurrent = LayerCache(kind="state", state_bytes=((int(cfg["conv1d_width"]) - 1) * width + width) * dt)
    local = sliding(attention(cfg, dt, use_head_dim=False), int(cfg["attention_window_size"]))
    types = cfg.get("block_types") or cfg.get("_block_types") or ["recurrent", "recurrent", "attention"]
    return tuple(local if types[i % len(types)] == "attention" else recurrent for i in range(n))


def plamo2(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """PLaMo 2: Mamba2 layers except every mamba_step-th (from mamba_step // 2), attention."""
    step, heads = int(get(cfg, "mamba_step", 2)), int(get(cfg, "mamba_num_heads", 64))
    dim = int(get(cfg, "hidden_size_per_head", 128))
    conv = (int(get(cfg, "mamba_d_conv", 4)) - 1) * heads * dim * dt
    ssm = LayerCache(kind="state", state_bytes=conv + heads * dim * int(get(cfg, "mamba_d_state", 64)) * FLOAT32)
    kv = int(get(cfg, "num_key_value_heads", 4))
    attn = LayerCache(kind="attention", token_bytes=kv_bytes(kv, dim, dim, dt))
    if n <= step // 2:
        return tuple(ssm if i != n - 1 else attn for i in range(n))
    return tuple(ssm if i % step != step // 2 else attn for i in range(n))


def plamo3(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """PLaMo 3: every sliding_window_pattern-th layer global, the rest over window_size tokens."""
    attn, period = attention(cfg, dt), int(get(cfg, "sliding_window_pattern", 8))
    window = int(get(cfg, "window_size", 2048))
    return tuple(attn if i % period == period - 1 else sliding(attn, window) for i in range(n))


def baichuan_m1(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """Baichuan-M1: CacheList(the last conv_window - 1 keys and values, KV or windowed KV)."""
    attn = attention(cfg, dt, use_head_dim=False)
    conv = (int(get(cfg, "conv_window", 2)) - 1) * attn.token_bytes
    windowed = set(cfg.get("sliding_window_layers") or [])
    local = LayerCache(kind="sliding", token_bytes=attn.token_bytes, window=int(cfg["sliding_window"]),
                       state_bytes=conv)
    full = LayerCache(kind="attention", token_bytes=attn.token_bytes, state_bytes=conv)
    return tuple(local if i in windowed else full for i in range(n))


def gear(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """Gear: conv_mixer layers keep the last conv_L_cache - 1 keys and values; the others KV or
    windowed KV by layer_types."""
    attn = attention(cfg, dt)
    conv = LayerCache(kind="state", state_bytes=(int(get(cfg, "conv_L_cache", 3)) - 1) * attn.token_bytes)
    kinds = {"conv_mixer": conv, "sliding_attention": sliding(attn, int(get(cfg, "sliding_window", 512)))}
    return tuple(kinds.get(t, attn) for t in cfg["layer_types"][:n])


def grouped_linear(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """Ling-Linear: lightning attention (a float32 head_dim x head_dim state per head) except
    every layer_group_size-th layer and the tail past the last whole group."""
    group, heads = int(cfg["layer_group_size"]), int(cfg["num_attention_heads"])
    dim = int(get(cfg, "head_dim", int(cfg["hidden_size"]) // heads))
    linear = LayerCache(kind="state", state_bytes=heads * dim * dim * FLOAT32)
    attn = attention(cfg, dt)
    return tuple(attn if (i + 1) % group == 0 or i >= n // group * group else linear for i in range(n))


def bailing_hybrid(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """Ling 2.0 hybrid: lightning attention as Ling-Linear, MLA (latent + RoPE key) in its place."""
    mla = LayerCache(kind="attention", token_bytes=latent(cfg, dt))
    return tuple(mla if c.kind == "attention" else c for c in grouped_linear(cfg, n, dt))


def nemotron_nas(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """Nemotron-NAS: attention (heads / n_heads_in_group key / value heads) only in the blocks whose
    attention is neither a no-op nor replaced by a linear map."""
    heads = int(cfg["num_attention_heads"])
    dim = int(cfg["hidden_size"]) // heads
    out = []
    for block in cfg["block_configs"][:n]:
        attn = block.get("attention") or {}
        if attn.get("no_op") or attn.get("replace_with_linear"):
            out.append(LayerCache(kind="none"))
        else:
            kv = heads // int(attn["n_heads_in_group"])
            out.append(LayerCache(kind="attention", token_bytes=kv_bytes(kv, dim, dim, dt)))
    return tuple(out)


def longcat_ngram(cfg: dict[str, Any], n: int, dt: int) -> Layers:
    """LongCat-Flash n-gram: two MLA latents per layer (its n-gram context is a few token ids)."""
    return (LayerCache(kind="attention", token_bytes=2 * latent(cfg, dt)),) * n


RULES = {
    "gpt2": gpt2, "gptj": gpt2, "gpt_bigcode": gpt_bigcode, "dbrx": dbrx, "lille_130m": lille, "openelm": openelm,
    "minicpm3": decompressed_mla, "youtu_llm": decompressed_mla, "olmo_hybrid": olmo_hybrid, "mamba": mamba,
    "mamba2": mamba2, "recurrent_gemma": recurrent_gemma, "plamo2": plamo2, "plamo3": plamo3,
    "baichuan_m1": baichuan_m1, "gear": gear, "bailing_moe_linear": grouped_linear,
    "longcat_flash_ngram": longcat_ngram, "bailing_hybrid": bailing_hybrid, "nemotron_nas": nemotron_nas,
    "phixtral": phixtral,
}
