"""Which models the engine serves exactly, and a clear reason for every other one.

One registry, read by the stage at start (it refuses to load what it cannot serve), by the
node agent's model report (the dashboard shows "Unsupported: <reason>") and by the planner
(a refusal, not a warning). A family is listed only when the exactness matrix
(`tests/engine/test_families.py`) proves that a split equals single-process mlx-lm for it;
the stage runs each family's own mlx-lm code, so no family needs an adapter today.

Pure: no MLX import, so the agent and the planner can use it cheaply.
"""

from __future__ import annotations

from typing import Any

from orchestrator.families.decoder_config import decoder_view
from orchestrator.families.names import FAMILIES  # the served families (re-exported: support.FAMILIES)

# The one kind of adapter: families whose attention uses the keys it fetched from the cache
# itself instead of handing them to mlx-lm's shared attention (gemma2's soft-capped scores,
# MLA's absorbed projections, DeepSeek-V3.2's indexer). In a micro-batched decode step their
# attention module (this attribute of each layer, or each module of a list of them) runs once
# per request; MLP and MoE stay batched (engine/stage/batch.py).
ROW_ATTENTION: dict[str, str] = {"gemma2": "self_attn", "deepseek_v3": "self_attn", "glm4_moe_lite": "self_attn",
                                 "deepseek_v32": "self_attn", "kimi_linear": "self_attn", "longcat_flash": "self_attn",
                                 "glm_moe_dsa": "self_attn", "mistral4": "self_attn", "bailing_moe_v3": "attention",
                                 "kimi_vl": "self_attn", "kimi_k25": "self_attn",
                                 "minimax_m3_vl": "self_attn", "gpt_bigcode": "attn", "stablelm": "self_attn",
                                 "plamo": "self_attn", "plamo2": "mixer", "longcat_flash_ngram": "self_attn",
                                 "bailing_hybrid": "attention", "gemma4_text": "self_attn", "gemma4": "self_attn",
                                 "kimi_k3": "self_attn", "afm7": "self_attn", "gemma3n": "self_attn"}
# Families whose ROW_ATTENTION applies to the layers of this class only (AFM's KV-reuse layers,
# handed each request's K/V one entry per row: batch.RowCaches.keys_and_values); their other
# layers' attention goes through mlx-lm's shared attention, batched.
ROW_ATTENTION_LAYERS: dict[str, str] = {"afm7": "KVReuseTransformerBlock"}

# Families served exactly whose decode steps run one request at a time (batch.py refuses
# their batch, and says why in the stage's stats): the reason, for the README.
UNBATCHED: dict[str, str] = {
    "deepseek_v41": "its layer cache holds one offset and one sliding window for the whole batch",
    "llama4": "its model builds one chunked-attention mask for the whole batch from the first layer's cache",
    "gpt_bigcode": "its model computes the learned positions with numpy from one offset for the whole batch",
}

# Families whose forward over a chunk of positions is not the computation of one step per position
# (measured: tests/engine/test_speculation_families.py): every forward that stands for decode steps — a
# verification chunk, a rollback's replay — runs on their stages as one-position forwards in a row
# ("stepwise", engine/stage/rewind.py), so it is the decode steps; nothing is batched. The reason.
STEPWISE: dict[str, str] = {
    "plamo3": "its sliding-window layers attend one key more in a chunk of positions than in a decode step "
              "(mlx-lm's window_size + 1 mask), so it verifies drafts one position at a time",
}

# Families whose stages cannot verify drafted tokens exactly, with the reason (none in mlx-lm 0.32.2: PLaMo 3
# verifies stepwise, DeepSeek-V4.1's boundaries are sliced by group, engine/stage/hyper_streams.py).
SPECULATION_REFUSED: dict[str, str] = {}


def speculation_refusal(family: str) -> str | None:
    """Why a stage of this family cannot verify drafts exactly, or None (the stages' and the planner's rule)."""
    return SPECULATION_REFUSED.get(family)


def verifies_stepwise(family: str) -> bool:
    """Whether this family's stages run a verification chunk and a replay one position at a time (STEPWISE)."""
    return family in STEPWISE


# Names that mlx-lm loads with another family's code (mlx_lm.utils MODEL_REMAPPING).
ALIASES: dict[str, str] = {"kimi_k2": "deepseek_v3", "joyai_llm_flash": "deepseek_v3", "minimax_m2": "minimax",
                           "llava": "mistral3", "qwen2_5_vl": "qwen2_vl", "iquestcoder": "llama",
                           "xverse": "llama", "deepseek_v41_text": "deepseek_v41", "gemma4_unified": "gemma4",
                           "falcon_mamba": "mamba", "phi_msft": "phixtral"}
# (model_type, first architecture) pairs mlx-lm loads with another module
# (mlx_lm.utils MODEL_ARCHITECTURE_REMAPPING).
ARCHITECTURE_ALIASES: dict[tuple[str, str], str] = {("bailing_hybrid", "BailingMoeV3ForCausalLM"): "bailing_moe_v3"}

# Families whose mlx-lm module loads the text decoder of a multimodal checkpoint (its
# sanitize() drops the vision tower, which no stage then reads): served text-only.
TEXT_OF_MULTIMODAL = frozenset({"qwen3_5", "qwen3_5_moe", "gemma3", "gemma3n", "gemma4", "llama4", "mistral3",
                                "pixtral", "qwen2_vl", "kimi_k3",
                                "qwen3_vl", "qwen3_vl_moe", "kimi_vl", "kimi_k25", "lfm2_vl", "minimax_m3_vl"})

# Every other model module of mlx-lm 0.32.2, refused with the mechanism the split engine
# lacks for it (or why no split of it can be proven): the agent's report, the planner and
# the stage all show this reason. docs/families.md lists them.
REFUSED: dict[str, str] = {
    "iquestloopcoder": "IQuest-Coder-Loop runs the whole layer stack loop_num times per token from its model code "
                       "(missing: a step that crosses every stage boundary more than once)",
    "bitnet": "BitNet's BitLinear layers run a Metal-only kernel with no CPU path, so the CPU exactness matrix "
              "cannot prove a split",
    "muse_spark": "Muse Spark's layers run mlx-lm's Metal-only kernels (mlx_lm.kernels: norm_add_norm, "
                  "expert_routing...) with no CPU path, so the CPU exactness matrix cannot prove a split",
    "phi3small": "Phi-3-small's block-sparse attention aborts mlx's CPU backend (malloc: invalid size) on a "
                 "40-token prompt, so the CPU exactness matrix cannot prove a split",
    "olmo": "mlx-lm's olmo module needs the ai2-olmo package and exits at import without it (OLMo 2 and 3 are "
            "served: olmo2, olmo3)",
    "prism_hadamard_qwen35": "a pre-rotated 2-bit Hadamard pack of Qwen3.5: its packed module manifest comes only "
                             "from the publisher's packer, so no test checkpoint can be built and no split proven",
}


# Families whose decoder layers return a tuple, hidden state first (Gemma 4: hidden state,
# the K/V its KV-shared layers reuse, their offset): the arity the stand-ins must return.
TUPLE_LAYERS: dict[str, int] = {"gemma4_text": 3, "gemma4": 3, "hunyuan": 2, "rwkv7": 2, "kimi_k3": 2,
                                "deepseek_v41": 2}

# Families whose skipped layers must return one of their arguments as they got it, beside the
# hidden state, because the model's code reads it after the loop (Kimi-K3's residual blocks, a
# keyword; DeepSeek-V4.1's pre-mix of its residual streams, the second positional argument).
PASSED_ON: dict[str, int | str] = {"kimi_k3": "blocks", "deepseek_v41": 1}

# Families whose hidden state between layers is several residual streams, [B, L, streams, H]:
# the config key giving the number of streams (DeepSeek-V4.1's hyper-connections).
STREAMS: dict[str, str] = {"deepseek_v41": "hc_mult", "gemma3n": "altup_num_inputs"}
# Families whose model stacks those streams before the batch axis, [streams, B, L, H] (Gemma 3n's
# AltUp): the stage moves them behind the length axis for the wire and back.
STREAMS_FIRST = frozenset({"gemma3n"})


def hidden_shape(config: dict[str, Any], hidden: int) -> tuple[int, ...]:
    """The hidden state's shape after [B, L]: (hidden,), or (streams, hidden) for a family in STREAMS."""
    key = STREAMS.get(family_of(config) or "")
    return (int(decoder_view(config).get(key) or 4), hidden) if key else (hidden,)

# Families that feed every layer a per-layer input computed from the token ids by these
# parts outside the layer list (when the config enables them): the first stage owns them, and
# the per-layer inputs of the layers downstream cross each boundary (engine/stage/carry.py).
PER_LAYER_INPUTS: dict[str, tuple[str, ...]] = {
    f: ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm")
    for f in ("gemma4_text", "gemma4", "gemma3n")
}
# Families that pass the per-layer input positionally (argument index), not as `per_layer_input=`.
PER_LAYER_ARG: dict[str, int] = {"gemma3n": 3}


def per_layer_width(config: dict[str, Any]) -> int:
    """The width of each layer's per-layer input (0: the family or this config has none)."""
    if family_of(config) not in PER_LAYER_INPUTS:
        return 0
    return int(decoder_view(config).get("hidden_size_per_layer_input", 256) or 0)


# Parts outside the layer list that the model's code reads on every stage, each a vector or two
# (Kimi-K3's output mix of its attention residuals runs after the layers, whatever the stage):
# kept, never hollowed.
KEPT_EVERYWHERE: dict[str, tuple[str, ...]] = {"kimi_k3": ("output_attn_res_proj", "output_attn_res_norm")}

# Families whose model code reads a cache's keys after the layer loop (AFM's KV-reuse layers
# attend over cache[-1].keys_and_values(), the last layer of model.layers): that cache's index
# in make_cache()'s list. A stage that skips its layer keeps it readable (and empty).
READ_AFTER_LAYERS: dict[str, int] = {"afm7": -1}

# Families whose layers take the hidden state as another positional argument than the first
# (Talkie's blocks take the normalised token embedding first): what the stand-ins replace.
HIDDEN_AT: dict[str, int] = {"talkie": 1}

# Families whose every layer also takes a tensor the model computes once before its layers
# (Talkie: the normalised token embedding, added back into every block's output): the
# position of that argument and its name on the wire. The first stage computes it; it crosses
# every boundary beside the hidden state, and each later stage's layers take the received one.
GIVEN_INPUT: dict[str, tuple[int, str]] = {"talkie": (0, "embedding")}


# Families whose layer hands the next one state beside the hidden state through the model's
# loop, which a boundary may fall between (Hunyuan's cross-layer attention: each group of
# cla_share_factor layers attends with the first one's K/V projections of this step; RWKV-7's
# first layer's value residual, v_first, which every later layer reads; Kimi-K3's attention
# residuals, the output of every block so far, which each layer mixes into its input). The
# layer's argument that takes it (a position, or a keyword the skipped layers hand on as they
# got it), and its parts' names on the wire.
HANDED_ON: dict[str, tuple[int | str, tuple[str, ...]]] = {
    "hunyuan": (3, ("keys", "values")), "rwkv7": (1, ("v_first",)), "kimi_k3": ("blocks", ("attn_res_blocks",)),
}


def handed_on(config: dict[str, Any], boundary: int) -> dict[str, tuple[int, ...]]:
    """What crosses a boundary before layer `boundary` beside the hidden state, by the layers'
    hand-on (HANDED_ON): name -> shape after [1, L]; empty when nothing does."""
    family = family_of(config)
    if family not in HANDED_ON:
        return {}
    view = decoder_view(config)
    if family == "kimi_k3":  # one [B, L, hidden] per block begun before the boundary (blocks start at 0)
        size = view.get("attn_res_block_size")
        if not size or boundary <= 0:
            return {}
        return {"attn_res_blocks": (-(-boundary // int(size)), int(view["hidden_size"]))}
    if family == "rwkv7":  # v_first: [B, L, heads, head_dim], from layer 0 on
        head_dim = int(view["head_dim"])
        return {"v_first": (int(view["hidden_size"]) // head_dim, head_dim)} if boundary > 0 else {}
    share = int(view.get("cla_share_factor", 2) or 1)
    if not view.get("use_cla") or boundary % share == 0:
        return {}
    heads, kv_heads = int(view["num_attention_heads"]), int(view["num_key_value_heads"])
    width = kv_heads * (int(view["hidden_size"]) // heads)
    return {name: (width,) for name in HANDED_ON["hunyuan"][1]}


def shared_kv_cuts(config: dict[str, Any]) -> dict[int, str]:
    """Stage boundaries (a stage starting at that layer) that would separate a KV-shared layer
    from the earlier layer whose K/V it attends over, each with the reason it is refused.

    Gemma 4's last num_kv_shared_layers layers reuse the K/V (the whole cache, every position)
    of the last earlier layer of their attention type; sending that across a boundary would cost
    the context's K/V per step, so those layers stay on one stage with their sources. AFM's
    KV-reuse layers likewise stay with the layer whose K/V they read (`_kv_reuse_cuts`).
    """
    family = family_of(config)
    if family == "afm7":
        return _kv_reuse_cuts(decoder_view(config))
    if family not in ("gemma4_text", "gemma4", "gemma3n"):
        return {}
    view = decoder_view(config)
    n = int(view.get("num_hidden_layers", 35))
    shared = int(view.get("num_kv_shared_layers", 20) or 0)
    if shared <= 0 or shared >= n:
        return {}
    types = view.get("layer_types")
    if not isinstance(types, list) or len(types) != n:
        pattern = int(view.get("sliding_window_pattern", 5))
        types = ((["sliding_attention"] * (pattern - 1) + ["full_attention"]) * (n // pattern + 1))[:n]
    first_shared = n - shared
    last_of = {t: i for i, t in enumerate(types[:first_shared])}
    cuts: dict[int, str] = {}
    for j in range(first_shared, n):
        source = last_of.get(types[j])
        if source is None:
            continue
        for b in range(source + 1, j + 1):
            cuts.setdefault(b, f"a stage boundary before layer {b} separates KV-shared layer {j} from layer "
                               f"{source}, whose K/V it reuses (layers {source}-{j} must share a stage)")
    return cuts


def borrowed_cache_layers(config: dict[str, Any]) -> frozenset[int]:
    """Layers the model's loop hands another layer's cache, which they only read (Gemma 3n's
    KV-shared layers: the cache of the last earlier layer of their type): a skipped one must not
    move it (its owner does)."""
    if family_of(config) != "gemma3n":
        return frozenset()
    view = decoder_view(config)
    n = int(view.get("num_hidden_layers", 35))
    return frozenset(range(n - int(view.get("num_kv_shared_layers", 0) or 0), n))


def _kv_reuse_cuts(view: dict[str, Any]) -> dict[int, str]:
    """AFM's last num_kv_reuse_layers layers (its second layer list, model.kv_reuse_layers) all
    attend over the K/V of the last layer of model.layers, read from that layer's cache after the
    loop: no stage may start at a reuse layer, so they run on the stage of the layer they read."""
    n = int(view.get("num_layers", 0) or 0)
    reuse = int(view.get("num_kv_reuse_layers", 0) or 0)
    if reuse <= 0 or reuse >= n:
        return {}
    source = n - reuse - 1
    return {b: f"a stage boundary before layer {b} separates KV-reuse layer {b} from layer {source}, whose K/V "
               f"the KV-reuse layers {source + 1}-{n - 1} read (layers {source}-{n - 1} must share a stage)"
            for b in range(source + 1, n)}


def boundary_tensors(config: dict[str, Any], boundary: int) -> dict[str, tuple[int, ...]]:
    """The tensors that cross a boundary before layer `boundary` beside the hidden state (name ->
    shape after [1, L]): the per-layer inputs of the layers from there on, what a layer hands on,
    a tensor every layer takes (GIVEN_INPUT)."""
    out: dict[str, tuple[int, ...]] = {}
    width = per_layer_width(config)
    if width:
        n = int(decoder_view(config).get("num_hidden_layers", 35))
        out["per_layer"] = (n - boundary, width)  # engine/stage/carry.py PER_LAYER
    out.update(handed_on(config, boundary))
    given = GIVEN_INPUT.get(family_of(config) or "")
    if given and boundary > 0:  # Talkie's normalised embedding, [1, L, hidden]
        out[given[1]] = (int(decoder_view(config)["hidden_size"]),)
    return out


def _config_problem(family: str, config: dict[str, Any]) -> str | None:
    """Refusals that depend on a served family's settings."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if family == "nanbeige" and int(text.get("num_loops") or 1) > 1:
        return ("Nanbeige with num_loops > 1 runs its layer stack several times per token (missing: a step that "
                "crosses every stage boundary more than once)")
    if family == "afm7" and (config.get("quantization") or config.get("quantization_config")):
        return ("mlx-lm 0.32.2 cannot load a quantized AFM: its fused QKV projection's to_quantized takes no "
                "quantization mode")
    return None


# Quantization modes and bit widths the matrix covers.
QUANT_MODES: dict[str, set[int]] = {"affine": {2, 3, 4, 5, 6, 8}, "mxfp4": {4}}


def family_of(config: dict[str, Any]) -> str | None:
    """The registry's family for a config.json, or None when the model_type is missing."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return None
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    if (model_type, arch) in ARCHITECTURE_ALIASES:
        return ARCHITECTURE_ALIASES[model_type, arch]
    name = model_type.replace("-", "_").lower()  # lfm2-vl, nemotron-nas, Klear
    return ALIASES.get(name, name)


def row_attention(config: dict[str, Any]) -> str | None:
    """The attention attribute to run once per request in a batched step (ROW_ATTENTION), by
    the family or, for a multimodal checkpoint, by its text decoder's family (Mistral 3 with a
    Mistral 4 decoder runs MLA; with a Mistral decoder, shared attention)."""
    found = ROW_ATTENTION.get(family_of(config) or "")
    text = config.get("text_config")
    if found is None and isinstance(text, dict):
        found = ROW_ATTENTION.get(family_of(text) or "")
    return found


def unsupported_reason(config: dict[str, Any]) -> str | None:
    """Why the engine cannot serve this model exactly, or None when it can."""
    family = family_of(config)
    if family is None:
        return "config.json has no model_type"
    if ("vision_config" in config or "audio_config" in config) and family not in TEXT_OF_MULTIMODAL:
        return f"{config['model_type']} is a multimodal model; pipeserve serves text-only decoders"
    if family in REFUSED:
        return f"model family {config['model_type']!r}: {REFUSED[family]}"
    if family not in FAMILIES:
        return (f"model family {config['model_type']!r} is not verified exact in pipeserve's split engine "
                f"(supported: {', '.join(sorted(FAMILIES))})")
    return _config_problem(family, config) or _quantization_problem(
        config.get("quantization", config.get("quantization_config")))


def _quantization_problem(quant: Any) -> str | None:
    if quant is None:
        return None
    if not isinstance(quant, dict):
        return "config.json has an unreadable quantization entry"
    for where, spec in [("", quant), *((f" for {k}", v) for k, v in quant.items() if isinstance(v, dict))]:
        mode = spec.get("mode", "affine")
        bits = spec.get("bits")
        if mode not in QUANT_MODES:
            return f"quantization mode {mode!r}{where} is not supported (supported: {', '.join(QUANT_MODES)})"
        if bits is not None and bits not in QUANT_MODES[mode]:
            return f"{bits}-bit {mode} quantization{where} is not supported"
    if "quant_method" in quant and "bits" not in quant:
        return f"quantization {quant['quant_method']!r} is not an MLX format; convert the model with mlx-lm first"
    return None
