"""What one layer keeps per request, and the byte formulas of each kind of cache (pure).

A layer's cache is one of four kinds, mirroring the family's own mlx-lm `make_cache()`:

- `attention`: keys and values for every token (mlx-lm's KVCache, grown in 256-token steps);
- `sliding`: keys and values for at most `window` tokens (RotatingKVCache);
- `state`: a constant recurrent state per request, whatever the context (ArraysCache of
  linear-attention, SSM and short-convolution layers);
- `none`: nothing (MLP-only and MoE-only layers).

`token_bytes` is what one token costs in an `attention` / `sliding` layer; `state_bytes`
what a `state` layer holds. A layer whose cache is a CacheList of a growing cache and a
constant one (Falcon-H1: attention and Mamba2 in parallel) is an `attention` layer with
`state_bytes` too: the kind says how it grows, the bytes add up.

models/kv.py decides which layer keeps what per family; this module only does the arithmetic, so
both stay readable. Neither imports mlx.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

CacheKind = Literal["attention", "sliding", "state", "none"]
# Recurrent states that mlx-lm keeps in float32 whatever the model's dtype: the gated-delta
# kernel (Qwen3-Next, Qwen3.5, Kimi-Linear) starts its state as float32 zeros, Mamba2's
# ssm_update runs dt (and so the state) in float32.
FLOAT32 = 4


class LayerCache(BaseModel):
    """The cache one layer keeps per request."""

    model_config = ConfigDict(frozen=True)

    kind: CacheKind
    token_bytes: int = 0  # keys + values of one token (attention, sliding)
    window: int | None = None  # tokens a sliding layer keeps at most
    state_bytes: int = 0  # a state layer's constant size (or the constant part beside keys / values)
    exact: bool = False  # grows by concatenation, token by token, not in mlx-lm's 256-token steps

    def bytes_for(self, tokens: int) -> int:
        """Bytes this layer holds for one request whose cache has room for `tokens` tokens
        (already rounded to mlx-lm's allocation step by the caller)."""
        if self.kind == "attention":
            return self.token_bytes * tokens + self.state_bytes
        if self.kind == "sliding":
            # RotatingKVCache grows in steps too but never past its window.
            return self.token_bytes * min(tokens, self.window or tokens) + self.state_bytes
        return self.state_bytes


NONE = LayerCache(kind="none")


def get(cfg: dict[str, Any], key: str, default: Any) -> Any:
    """cfg[key], or `default` when it is missing or null (as mlx-lm's ModelArgs defaults)."""
    value = cfg.get(key)
    return default if value is None else value


def kv_bytes(kv_heads: int, key_dim: int, value_dim: int, dtype_bytes: int) -> int:
    """One token's keys and values: KVCache allocates the two separately, so a family whose
    values are narrower than its keys (MiMo-V2, DeepSeek-V2) pays each its own width."""
    return kv_heads * (key_dim + value_dim) * dtype_bytes


def head_dim(cfg: dict[str, Any], use_config: bool = True) -> int:
    """A family's attention head width: config.json's head_dim when the family reads it,
    else hidden_size / heads (many mlx-lm modules compute it so and ignore head_dim)."""
    heads = int(get(cfg, "num_attention_heads", 1))
    derived = int(get(cfg, "hidden_size", heads)) // heads
    return int(get(cfg, "head_dim", derived)) if use_config else derived


def attention(cfg: dict[str, Any], dtype_bytes: int, use_head_dim: bool = True) -> LayerCache:
    """Standard (grouped-query) attention: keys and values of kv_heads x head_dim each."""
    heads = int(get(cfg, "num_attention_heads", 1))
    kv_heads = int(get(cfg, "num_key_value_heads", heads))
    dim = head_dim(cfg, use_head_dim)
    return LayerCache(kind="attention", token_bytes=kv_bytes(kv_heads, dim, dim, dtype_bytes))


def sliding(layer: LayerCache, window: int) -> LayerCache:
    """The same keys and values, kept for the last `window` tokens only."""
    return LayerCache(kind="sliding", token_bytes=layer.token_bytes, window=int(window))


def latent(cfg: dict[str, Any], dtype_bytes: int) -> int:
    """Bytes per token of multi-head latent attention as mlx-lm's DeepSeek-V3-style modules
    cache it: the normalised kv latent and the shared RoPE key, one "head" each, instead of
    per-head keys and values (DeepSeek-V3, GLM-4.7-Flash, Kimi-Linear, LongCat-Flash)."""
    return (int(get(cfg, "kv_lora_rank", 512)) + int(get(cfg, "qk_rope_head_dim", 0))) * dtype_bytes


def gated_delta_state(cfg: dict[str, Any], dtype_bytes: int) -> LayerCache:
    """Qwen3-Next / Qwen3.5 linear attention: a conv window over q, k and v (model dtype) and
    a value x key recurrent state per value head (float32)."""
    hk, dk = int(cfg["linear_num_key_heads"]), int(cfg["linear_key_head_dim"])
    hv, dv = int(cfg["linear_num_value_heads"]), int(cfg["linear_value_head_dim"])
    kernel = int(get(cfg, "linear_conv_kernel_dim", 4))
    conv = (kernel - 1) * (2 * hk * dk + hv * dv) * dtype_bytes
    return LayerCache(kind="state", state_bytes=conv + hv * dv * dk * FLOAT32)


def kimi_delta_state(linear: dict[str, Any], dtype_bytes: int) -> LayerCache:
    """Kimi delta attention (Kimi-Linear): three short convolutions (q, k, v, each heads x
    head_dim wide, model dtype) and a head_dim x head_dim float32 state per head."""
    heads, dim = int(linear["num_heads"]), int(linear["head_dim"])
    conv = 3 * (int(get(linear, "short_conv_kernel_size", 4)) - 1) * heads * dim * dtype_bytes
    return LayerCache(kind="state", state_bytes=conv + heads * dim * dim * FLOAT32)


def mamba2_state(heads: int, head_dim: int, state: int, groups: int, kernel: int, dtype_bytes: int,
                 inner: int | None = None) -> int:
    """Mamba2 (Nemotron-H, Granite 4.0-H, Falcon-H1): a conv window over x, B and C (model
    dtype; x is `inner` wide, heads x head_dim unless the family says otherwise) and the SSM
    state heads x head_dim x state (float32)."""
    width = (heads * head_dim if inner is None else inner) + 2 * groups * state
    return (kernel - 1) * width * dtype_bytes + heads * head_dim * state * FLOAT32


def mamba_state(cfg: dict[str, Any], dtype_bytes: int) -> LayerCache:
    """Jamba's Mamba: conv window and SSM state over the expanded width, both in model dtype."""
    inner = int(get(cfg, "mamba_expand", 2)) * int(cfg["hidden_size"])
    conv = (int(get(cfg, "mamba_d_conv", 4)) - 1) * inner
    return LayerCache(kind="state", state_bytes=(conv + inner * int(get(cfg, "mamba_d_state", 16))) * dtype_bytes)


def short_conv_state(cfg: dict[str, Any], dtype_bytes: int) -> LayerCache:
    """LFM2's gated short convolution: the last conv_L_cache - 1 inputs, hidden wide, in
    the model dtype."""
    return LayerCache(kind="state", state_bytes=(int(get(cfg, "conv_L_cache", 3)) - 1) * int(cfg["hidden_size"])
                      * dtype_bytes)
