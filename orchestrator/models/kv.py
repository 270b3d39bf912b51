"""What each layer of a model keeps per request, derived from config.json alone (pure).

A layer's cache is one of four kinds, mirroring the family's own mlx-lm `make_cache()`:

- `attention`: keys and values for every token (mlx-lm's KVCache, grown in 256-token steps);
- `sliding`: keys and values for at most `window` tokens (RotatingKVCache: sliding-window
  layers of Mistral, Gemma 3, GPT-OSS);
- `state`: a constant recurrent state per request, whatever the context (ArraysCache:
  Qwen3-Next / Qwen3.5 gated-delta linear attention, Nemotron-H Mamba2, Jamba Mamba);
- `none`: nothing (Nemotron-H MLP-only and MoE-only layers).

`token_bytes` is what one token costs in an `attention` / `sliding` layer; `state_bytes`
what a `state` layer holds. Both follow the tensors mlx-lm stores: DeepSeek-V3's
multi-head latent attention keeps the compressed latent plus the RoPE key (one "head"),
DeepSeek-V2's mlx-lm code keeps full per-head keys and values. The rules are checked
against the caches mlx-lm really builds (tests/planner/test_memory_families.py).

Imports neither mlx nor the planner, so describe.py can call it for the agent's report.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.engine.support import family_of

CacheKind = Literal["attention", "sliding", "state", "none"]
# Recurrent states that mlx-lm keeps in float32 whatever the model's dtype: the gated-delta
# kernel starts its state as float32 zeros, Mamba2's ssm_update runs dt (and so the state) in float32.
FLOAT32 = 4


class LayerCache(BaseModel):
    """The cache one layer keeps per request."""

    model_config = ConfigDict(frozen=True)

    kind: CacheKind
    token_bytes: int = 0  # keys + values of one token (attention, sliding)
    window: int | None = None  # tokens a sliding layer keeps at most
    state_bytes: int = 0  # a state layer's constant size

    def bytes_for(self, tokens: int) -> int:
        """Bytes this layer holds for one request whose cache has room for `tokens` tokens
        (already rounded to mlx-lm's allocation step by the caller)."""
        if self.kind == "attention":
            return self.token_bytes * tokens
        if self.kind == "sliding":
            # RotatingKVCache grows in steps too but never past its window.
            return self.token_bytes * min(tokens, self.window or tokens)
        return self.state_bytes


def _get(cfg: dict[str, Any], key: str, default: Any) -> Any:
    value = cfg.get(key)
    return default if value is None else value


def _attention(cfg: dict[str, Any], dtype_bytes: int) -> LayerCache:
    """Standard (grouped-query) attention: keys and values of kv_heads x head_dim each."""
    heads = int(_get(cfg, "num_attention_heads", 1))
    kv_heads = int(_get(cfg, "num_key_value_heads", heads))
    head_dim = int(_get(cfg, "head_dim", int(cfg.get("hidden_size", heads)) // heads))
    return LayerCache(kind="attention", token_bytes=2 * kv_heads * head_dim * dtype_bytes)


def _sliding(attention: LayerCache, window: int) -> LayerCache:
    return LayerCache(kind="sliding", token_bytes=attention.token_bytes, window=int(window))


def _gated_delta_state(cfg: dict[str, Any], dtype_bytes: int) -> LayerCache:
    """Qwen3-Next / Qwen3.5 linear attention: a conv window over q, k and v (model dtype) and
    a value x key recurrent state per value head (float32)."""
    hk, dk = int(cfg["linear_num_key_heads"]), int(cfg["linear_key_head_dim"])
    hv, dv = int(cfg["linear_num_value_heads"]), int(cfg["linear_value_head_dim"])
    kernel = int(_get(cfg, "linear_conv_kernel_dim", 4))
    conv = (kernel - 1) * (2 * hk * dk + hv * dv) * dtype_bytes
    return LayerCache(kind="state", state_bytes=conv + hv * dv * dk * FLOAT32)


def _mamba2_state(cfg: dict[str, Any], dtype_bytes: int) -> LayerCache:
    """Nemotron-H Mamba2: conv window over x, B and C (model dtype), SSM state (float32)."""
    heads, head_dim = int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"])
    state, groups = int(cfg["ssm_state_size"]), int(_get(cfg, "n_groups", 1))
    kernel = int(_get(cfg, "conv_kernel", 4))
    conv = (kernel - 1) * (heads * head_dim + 2 * groups * state) * dtype_bytes
    return LayerCache(kind="state", state_bytes=conv + heads * head_dim * state * FLOAT32)


def _mamba_state(cfg: dict[str, Any], dtype_bytes: int) -> LayerCache:
    """Jamba's Mamba: conv window and SSM state over the expanded width, both in model dtype."""
    inner = int(_get(cfg, "mamba_expand", 2)) * int(cfg["hidden_size"])
    conv = (int(_get(cfg, "mamba_d_conv", 4)) - 1) * inner
    return LayerCache(kind="state", state_bytes=(conv + inner * int(_get(cfg, "mamba_d_state", 16))) * dtype_bytes)


def layer_caches(cfg: dict[str, Any], num_layers: int, dtype_bytes: int) -> tuple[LayerCache, ...]:
    """The cache of every layer of a model, from its (text) config.json as mlx-lm reads it.

    Families not named here use standard attention in every layer (Llama, Qwen2/3, Mixtral,
    GLM-4, Phi-3, OLMo 2, Llama 4 text, and Gemma 2, whose mlx-lm code ignores its
    configured sliding window).
    """
    family = family_of(cfg)
    attn = _attention(cfg, dtype_bytes)
    layers = range(num_layers)
    if family in ("llama", "mistral"):  # mlx-lm runs mistral with llama.py
        types = cfg.get("layer_types") or ["full_attention"] * num_layers
        window = cfg.get("sliding_window")
        return tuple(_sliding(attn, window) if types[i] == "sliding_attention" and window else attn for i in layers)
    if family == "gemma3_text":
        period, window = int(_get(cfg, "sliding_window_pattern", 6)), int(_get(cfg, "sliding_window", 512))
        return tuple(attn if i % period == period - 1 else _sliding(attn, window) for i in layers)
    if family == "gpt_oss":
        types = cfg.get("layer_types") or ["sliding_attention", "full_attention"] * (num_layers // 2)
        window = int(_get(cfg, "sliding_window", 128))
        return tuple(attn if types[i] == "full_attention" else _sliding(attn, window) for i in layers)
    if family in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        interval = int(_get(cfg, "full_attention_interval", 4))
        linear = _gated_delta_state(cfg, dtype_bytes)
        return tuple(linear if (i + 1) % interval else attn for i in layers)
    if family == "nemotron_h":
        pattern = cfg["hybrid_override_pattern"]
        kinds = {"M": _mamba2_state(cfg, dtype_bytes), "*": attn}
        return tuple(kinds.get(pattern[i], LayerCache(kind="none")) for i in layers)
    if family == "jamba":
        period, offset = int(_get(cfg, "attn_layer_period", 8)), int(_get(cfg, "attn_layer_offset", 4))
        mamba = _mamba_state(cfg, dtype_bytes)
        return tuple(attn if i % period == offset else mamba for i in layers)
    if family == "deepseek_v3":
        # Multi-head latent attention as mlx-lm caches it: the normalised latent and the
        # shared RoPE key, one "head" each, instead of per-head keys and values.
        width = int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"])
        return (LayerCache(kind="attention", token_bytes=width * dtype_bytes),) * num_layers
    if family == "deepseek_v2":
        # mlx-lm's deepseek_v2 decompresses before caching: every head's key (nope + rope
        # parts) and value.
        heads = int(cfg["num_attention_heads"])
        width = heads * (int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"]) + int(cfg["v_head_dim"]))
        return (LayerCache(kind="attention", token_bytes=width * dtype_bytes),) * num_layers
    return (attn,) * num_layers
