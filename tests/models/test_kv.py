"""Per-layer cache kinds from config.json, for every family the test models cover (pure:
the configs of orchestrator/testmodels/families.py, no weights)."""

from __future__ import annotations

import pytest

from orchestrator.models.kv import LayerCache, layer_caches
from orchestrator.testmodels.families import FAMILIES, FamilySpec

# families.py's mixer codes: F full attention, N attention without RoPE (still a full
# cache), S sliding window, L linear attention, M Mamba, C gated short convolution (a
# constant state), P attention and Mamba in parallel (keys and values grow, the Mamba state
# rides along as the layer's state_bytes), - no mixer.
MIXER_KIND = {"F": "attention", "N": "attention", "S": "sliding", "L": "state", "M": "state", "C": "state",
              "P": "attention", "-": "none"}
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
# worked out from the tensors mlx-lm's cache holds (float32 model). Every family is listed,
# so a new family needs its row.
WINDOWED = {"attention": STANDARD, "sliding": (STANDARD, 8)}
# MLA latent (kv_lora_rank 64) plus the shared RoPE key (16), one "head"
LATENT = (64 + 16) * F32
# Mamba2 of 4 heads x 16, state 16, 1 group, kernel 4: conv 3 x (64 + 2 x 16), float32 state 4 x 16 x 16
MAMBA2 = 3 * (64 + 2 * 16) * F32 + 4 * 16 * 16 * 4
PLAIN = ("llama", "qwen2", "qwen3", "glm4", "llama4_text", "phi3", "olmo2", "gemma", "starcoder2", "internlm2",
         "internlm3", "minicpm", "seed_oss", "apertus", "hunyuan_v1_dense", "smollm3", "mixtral", "qwen3_moe",
         "glm4_moe", "qwen2_moe", "olmoe", "phimoe", "granitemoe", "minimax", "minimax_m2", "ernie4_5_moe", "dots1",
         "bailing_moe", "solar_open", "mistral3", "mistral3_ministral3", "pixtral", "qwen2_vl", "qwen3_vl",
         "qwen3_vl_moe", "minimax_m3_vl")
TABLE = {
    **{family: {"attention": STANDARD} for family in PLAIN},
    "mistral": WINDOWED,
    "gemma2": {"attention": STANDARD},  # mlx-lm ignores its sliding_window
    "gemma3_text": WINDOWED,
    # global layers: num_global_key_value_heads 2 x global_head_dim 32; the KV-shared last two: none
    **{f: {"attention": 2 * 2 * 32 * F32, "sliding": (STANDARD, 8), "none": 0} for f in ("gemma4_text", "gemma4")},
    "afm7": {"attention": STANDARD, "none": 0},  # head_dim = hidden_dim / num_heads; the two KV-reuse layers: none
    "hunyuan": {"attention": STANDARD},  # head_dim = hidden / heads; cross-layer pairs each keep their own cache
    # ArraysCache(3): two token shifts of 64 and a 4 x 16 x 16 wkv state
    "rwkv7": {"state": (2 * 64 + 4 * 16 * 16) * F32},
    "gpt_oss": WINDOWED,
    "cohere2": WINDOWED,
    "exaone4": WINDOWED,
    "olmo3": WINDOWED,
    # sliding layers: 8 query heads over swa_num_key_value_heads 2 (keys 16, values 16 wide)
    "mimo_v2_flash": WINDOWED,
    # key / value heads are num_attention_groups (2) on both kinds
    "step3p5": WINDOWED,
    "deepseek_v3": {"attention": LATENT},
    "kimi_k2": {"attention": LATENT},
    "joyai_llm_flash": {"attention": LATENT},
    "glm4_moe_lite": {"attention": LATENT},
    # plus the indexer's key (index_head_dim 32) stored as its cache's keys and values
    "deepseek_v32": {"attention": LATENT + 2 * 32 * F32},
    # two MLA blocks per layer
    "longcat_flash": {"attention": 2 * LATENT},
    # every head's key (16 nope + 16 rope) and value (16): 4 heads
    "deepseek_v2": {"attention": 4 * (16 + 16 + 16) * F32},
    # conv window 3 x (2 x 2x16 keys/queries + 4x16 values), float32 state 4 x 16 x 16
    "qwen3_next": {"attention": STANDARD, "state": 3 * 128 * F32 + 4 * 16 * 16 * 4},
    "qwen3_5": {"attention": STANDARD, "state": 3 * 128 * F32 + 4 * 16 * 16 * 4},
    "qwen3_5_moe": {"attention": STANDARD, "state": 3 * 128 * F32 + 4 * 16 * 16 * 4},
    # Mamba2: conv 3 x (4x16 + 2 groups x 2 x 16), float32 SSM state 4 x 16 x 16
    "nemotron_h": {"attention": STANDARD, "state": 3 * (64 + 64) * F32 + 4 * 16 * 16 * 4, "none": 0},
    "granitemoehybrid": {"attention": STANDARD, "state": MAMBA2},
    # every layer both: keys and values grow, the Mamba2 state (x is mamba_d_ssm 64 wide) is fixed
    "falcon_h1": {"attention": STANDARD, "state_beside": MAMBA2},
    # Mamba: width 2 x 64; conv 3 x 128, state 128 x 8
    "jamba": {"attention": STANDARD, "state": (3 * 128 + 128 * 8) * F32},
    # short convolution: the last conv_L_cache - 1 = 2 inputs, hidden 64 wide
    "lfm2": {"attention": STANDARD, "state": 2 * 64 * F32},
    "lfm2_moe": {"attention": STANDARD, "state": 2 * 64 * F32},
    # MLA without RoPE layers, Kimi delta attention: 3 convs of 3 x 4x16, float32 state 4 x 16 x 16
    "kimi_linear": {"attention": LATENT, "state": 3 * 3 * 64 * F32 + 4 * 16 * 16 * 4},
    "kimi_k3": {"attention": LATENT, "state": 3 * 3 * 64 * F32 + 4 * 16 * 16 * 4},  # Kimi-Linear's layers
    "ministral3": WINDOWED,
    "exaone_moe": WINDOWED,
    "afmoe": WINDOWED,
    "mistral4": {"attention": LATENT},
    "glm_moe_dsa": {"attention": LATENT + 2 * 32 * F32},
    # Kimi delta attention over num_attention_heads (4) x head_dim (16), MLA every 4th layer
    "bailing_moe_v3": {"attention": LATENT, "state": 3 * 3 * 64 * F32 + 4 * 16 * 16 * 4},
    # text decoders of multimodal checkpoints
    "gemma3": WINDOWED,
    # chunked layers: the 8-token chunk plus one 256-token allocation step
    "llama4": {"attention": STANDARD, "sliding": (STANDARD, 8 + 256)},
    "mistral3_mistral4": {"attention": LATENT},
    "kimi_vl": {"attention": LATENT},
    "kimi_k25": {"attention": LATENT},
    "lfm2-vl": {"attention": STANDARD, "state": 2 * 64 * F32},
    # older / smaller decoders (kv_classic.py); 4 key / value heads of 16 where the family has as
    # many as query heads (GPT-2 style n_head, phi, gpt_neox, deepseek, qwen, nanochat, Talkie)
    **{family: {"attention": 2 * STANDARD} for family in ("gpt2", "gpt_neox", "gptj", "phi", "deepseek", "qwen",
                                                          "nanochat", "talkie")},
    **{family: {"attention": STANDARD} for family in ("stablelm", "cohere", "dbrx", "granite", "nemotron", "exaone",
                                                      "ernie4_5", "glm", "helium", "telechat3", "mimo", "Klear",
                                                      "nanbeige", "openelm", "plamo", "lille-130m")},
    "gpt_bigcode": {"attention": 1 * (16 + 16) * F32},  # multi-query: one key / value head
    # MLA decompressed: 4 heads of keys 16 + 16 and values 16
    "minicpm3": {"attention": 4 * (16 + 16 + 16) * F32},
    "youtu_llm": {"attention": 4 * (16 + 16 + 16) * F32},
    "olmo_hybrid": {"attention": STANDARD, "state": 3 * 128 * F32 + 4 * 16 * 16 * 4},
    # Mamba 1 over intermediate 128: conv 3 x 128, state 128 x 8 (model dtype)
    "mamba": {"state": (3 * 128 + 128 * 8) * F32},
    # Mamba 2: conv 3 x (8x16 + 2 x 16), float32 state 8 x 16 x 16
    "mamba2": {"state": 3 * (128 + 2 * 16) * F32 + 8 * 16 * 16 * 4},
    # RG-LRU: conv 3 x 64 plus the recurrence 64; local attention of one key / value head over 8 tokens
    "recurrent_gemma": {"state": (3 * 64 + 64) * F32, "sliding": (1 * 32 * F32, 8)},
    # Mamba2 of 4 heads x 16, state 16: conv 3 x 64, float32 state 4 x 16 x 16
    "plamo2": {"attention": STANDARD, "state": 3 * 64 * F32 + 4 * 16 * 16 * 4},
    "plamo3": WINDOWED,
    "baichuan_m1": WINDOWED,
    "mellum": WINDOWED,
    "spark2_5": WINDOWED,
    "laguna": WINDOWED,
    "muse_glimmer": WINDOWED,
    # lightning attention: a float32 16 x 16 state per head (4)
    "bailing_moe_linear": {"attention": STANDARD, "state": 4 * 16 * 16 * 4},
    # conv mixer: the last 2 keys and values
    "gear": {"attention": STANDARD, "sliding": (STANDARD, 8), "state": 2 * STANDARD},
    "longcat_flash_ngram": {"attention": 2 * LATENT},
    "bailing_hybrid": {"attention": LATENT, "state": 4 * 16 * 16 * 4},
    "phixtral": {"attention": 2 * STANDARD},
    # attention only where the block has one; n_heads_in_group 2 of 4 heads: 2 key / value heads
    "nemotron-nas": {"attention": STANDARD, "none": 0},
    # its LayerCache: a window of 8 single-head rows (head_dim 32, keys and values at once) everywhere;
    # layer 1 also keeps one compressed entry (32) and index key (16) per 4 tokens
    "deepseek_v41": {"sliding": (32 * F32, 8), "attention": (32 + 16) * F32 // 4},
    "gemma3n": {"attention": STANDARD, "sliding": (STANDARD, 8), "none": 0},  # the KV-shared last two: none
}


def test_every_family_has_a_row() -> None:
    assert set(TABLE) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(TABLE))
def test_bytes_per_kind(family: str) -> None:
    spec = FAMILIES[family]
    caches = layer_caches(config(spec), len(spec.layers), F32)
    for kind, expected in TABLE[family].items():
        if kind == "state_beside":
            assert {c.state_bytes for c in caches if c.kind == "attention"} == {expected}
            continue
        layer = next(c for c in caches if c.kind == kind)
        if kind == "sliding":
            assert (layer.token_bytes, layer.window) == expected
        elif kind == "attention":
            assert layer.token_bytes == expected
        elif kind == "none":
            assert layer.token_bytes == layer.state_bytes == expected
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


def test_dtype_halves_convolutions_but_not_float32_mamba2_states() -> None:
    spec = FAMILIES["falcon_h1"]
    bf16 = layer_caches(config(spec), 4, 2)[0]
    # keys and values halve; in the Mamba2 state only the conv window does
    assert (bf16.token_bytes, bf16.state_bytes) == (STANDARD // 2, 3 * 96 * 2 + 4 * 16 * 16 * 4)
    assert bf16.bytes_for(256) == STANDARD // 2 * 256 + bf16.state_bytes


def test_sliding_layers_with_their_own_geometry() -> None:
    """MiMo-V2 sliding layers read swa_* keys, Step-3.5's attention_other_setting: a config
    whose sliding layers keep more (and wider) heads than the global ones."""
    mimo = {**config(FAMILIES["mimo_v2_flash"]), "swa_num_key_value_heads": 4, "swa_v_head_dim": 32}
    caches = layer_caches(mimo, 6, F32)
    assert (caches[0].kind, caches[0].token_bytes) == ("attention", STANDARD)
    assert (caches[1].kind, caches[1].token_bytes, caches[1].window) == ("sliding", 4 * (16 + 32) * F32, 8)
    step = config(FAMILIES["step3p5"])
    step = {**step, "attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 4}}
    caches = layer_caches(step, 6, F32)
    assert [c.token_bytes for c in caches[:3]] == [STANDARD, 2 * STANDARD, 2 * STANDARD]
