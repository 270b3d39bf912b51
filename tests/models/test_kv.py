"""Per-layer cache kinds from config.json, for every family the test models cover (pure:
the configs of orchestrator/models/families.py, no weights)."""

from __future__ import annotations

import pytest

from orchestrator.models.families import FAMILIES, FamilySpec
from orchestrator.models.kv import LayerCache, layer_caches

# families.py's mixer codes: F full attention, N attention without RoPE (still a full
# cache), S sliding window, L linear attention, M Mamba, - no mixer.
MIXER_KIND = {"F": "attention", "N": "attention", "S": "sliding", "L": "state", "M": "state", "-": "none"}
F32 = 4
# The families' common geometry: 2 KV heads of 16 dims; keys and values.
STANDARD = 2 * 2 * 16 * F32


def config(spec: FamilySpec) -> dict:
    """The (text) config as describe.py reads it: nested text configs merged under the top level."""
    return {**spec.config, "model_type": spec.model_type}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kinds_follow_the_family_layer_pattern(family: str) -> None:
    spec = FAMILIES[family]
    caches = layer_caches(config(spec), len(spec.layers), F32)
    assert [c.kind for c in caches] == [MIXER_KIND[code[0]] for code in spec.layers]


# Bytes per token (attention, sliding) or per request (state) of one layer of each kind,
# worked out from the tensors mlx-lm's cache holds (float32 model).
TABLE = {
    "llama": {"attention": STANDARD},
    "mistral": {"attention": STANDARD, "sliding": (STANDARD, 8)},
    "gemma2": {"attention": STANDARD},  # mlx-lm ignores its sliding_window
    "gemma3_text": {"attention": STANDARD, "sliding": (STANDARD, 8)},
    "gpt_oss": {"attention": STANDARD, "sliding": (STANDARD, 8)},
    # MLA latent (kv_lora_rank 64) plus the shared RoPE key (16)
    "deepseek_v3": {"attention": (64 + 16) * F32},
    "kimi_k2": {"attention": (64 + 16) * F32},
    # every head's key (16 nope + 16 rope) and value (16): 4 heads
    "deepseek_v2": {"attention": 4 * (16 + 16 + 16) * F32},
    # conv window 3 x (2 x 2x16 keys/queries + 4x16 values), float32 state 4 x 16 x 16
    "qwen3_next": {"attention": STANDARD, "state": 3 * 128 * F32 + 4 * 16 * 16 * 4},
    "qwen3_5": {"attention": STANDARD, "state": 3 * 128 * F32 + 4 * 16 * 16 * 4},
    # Mamba2: conv 3 x (4x16 + 2 groups x 2 x 16), float32 SSM state 4 x 16 x 16
    "nemotron_h": {"attention": STANDARD, "state": 3 * (64 + 64) * F32 + 4 * 16 * 16 * 4, "none": 0},
    # Mamba: width 2 x 64; conv 3 x 128, state 128 x 8
    "jamba": {"attention": STANDARD, "state": (3 * 128 + 128 * 8) * F32},
}


@pytest.mark.parametrize("family", sorted(TABLE))
def test_bytes_per_kind(family: str) -> None:
    spec = FAMILIES[family]
    caches = layer_caches(config(spec), len(spec.layers), F32)
    for kind, expected in TABLE[family].items():
        layer = next(c for c in caches if c.kind == kind)
        if kind == "sliding":
            assert (layer.token_bytes, layer.window) == expected
        elif kind == "attention":
            assert layer.token_bytes == expected
        else:
            assert layer.state_bytes == expected


def test_what_a_layer_holds_at_a_context() -> None:
    """Full attention grows with the context, a window stops growing, a state never grows."""
    full = LayerCache(kind="attention", token_bytes=10)
    window = LayerCache(kind="sliding", token_bytes=10, window=1024)
    state = LayerCache(kind="state", state_bytes=77)
    assert [c.bytes_for(512) for c in (full, window, state)] == [5120, 5120, 77]
    assert [c.bytes_for(8192) for c in (full, window, state)] == [81920, 10240, 77]
    assert LayerCache(kind="none").bytes_for(8192) == 0


def test_dtype_halves_attention_but_not_float32_states() -> None:
    spec = FAMILIES["qwen3_next"]
    f32 = layer_caches(config(spec), 6, 4)
    bf16 = layer_caches(config(spec), 6, 2)
    assert bf16[2].token_bytes * 2 == f32[2].token_bytes
    # the conv window halves, the recurrent state stays float32
    assert bf16[0].state_bytes == 3 * 128 * 2 + 4 * 16 * 16 * 4
