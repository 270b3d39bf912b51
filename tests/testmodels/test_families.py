"""Tiny models of mlx-lm families: they load with mlx-lm, generate varied tokens in every
dtype and quantization offered, are byte-for-byte reproducible, and the CLI makes them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from tokenizers import Tokenizer

from orchestrator.families.decoder_config import layer_count
from orchestrator.testmodels.families import FAMILIES, build_family_model
from tests.support import matrix

REPO = Path(__file__).resolve().parents[2]
# About 40 tokens: longer than the 8-token sliding windows, so rotating caches wrap.
PROMPT = ("The first stage embeds the tokens, the last stage applies the final norm and the head. "
          "Hidden states travel from one stage")
DENSE = [name for name, spec in FAMILIES.items() if not spec.moe]
# Families whose sanitize() changes weights on every load, saved ones too (PLaMo 2 re-lays
# its conv1d weights, Baichuan-M1 normalises its head): what mlx-lm loads is not the file's
# tensors, and both the reference and every stage run what it loads.
CHANGED_ON_LOAD = {"plamo2", "baichuan_m1"}
# Families whose module names the mixed recipe (families._mixed_predicate: v_proj, down_proj,
# o_proj, lm_head, embed_tokens...) does not know (GPT-2's c_attn / c_proj, Mamba's mixer,
# Qwen 1's w1 / w2, Talkie's blocks.N.attn and bare head): their "mixed" models are 4-bit with
# fewer or no per-module overrides.
RECIPE_NAMES_UNKNOWN = {"dbrx", "phixtral", "exaone", "gpt2", "gpt_bigcode", "gpt_neox", "gptj", "granite", "mamba",
                        "mamba2", "nanochat", "phi", "qwen", "spark2_5", "talkie"}


def file_hashes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def greedy_from_dir(path: Path, n: int = 24) -> list[int]:
    """Load with mlx-lm and decode greedily from PROMPT; returns the new tokens. Also
    checks that the loader (the family's sanitize included) keeps every saved tensor as is."""
    from mlx.utils import tree_flatten
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    saved = mx.load(str(path / "model.safetensors"))
    loaded = dict(tree_flatten(model.parameters()))
    tower = FAMILIES[config_of(path)["pipeserve"]["family"]].tower
    # A published vision tower is in the file and dropped by the loader (it is never loaded).
    saved = {k: v for k, v in saved.items() if not (tower and k.startswith(tower + "."))}
    assert set(loaded) == set(saved)
    if config_of(path)["pipeserve"]["family"] not in CHANGED_ON_LOAD:
        assert all(mx.array_equal(loaded[k], saved[k]).item() for k in saved)
    prompt = Tokenizer.from_file(str(path / "tokenizer.json")).encode(PROMPT).ids
    assert 35 <= len(prompt) <= 45
    steps = generate_step(mx.array(prompt), model, max_tokens=n)
    return [int(token) for (token, _), _ in zip(steps, range(n))]


def config_of(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_table_covers_the_families_with_interesting_stacks():
    wanted = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe",
              "gemma2", "gemma3_text", "glm4", "glm4_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss",
              "llama4_text", "phi3", "olmo2", "nemotron_h", "jamba",
              # mlx-lm 0.32's other decoder families the split engine covers
              "gemma", "starcoder2", "internlm2", "internlm3", "minicpm", "seed_oss", "apertus", "smollm3",
              "exaone4", "cohere2", "olmo3", "hunyuan_v1_dense", "lfm2", "falcon_h1", "qwen2_moe", "olmoe",
              "phimoe", "granitemoe", "minimax", "ernie4_5_moe", "dots1", "bailing_moe", "lfm2_moe",
              "glm4_moe_lite", "deepseek_v32", "kimi_linear", "mimo_v2_flash", "step3p5", "granitemoehybrid",
              "longcat_flash"}
    assert wanted <= set(FAMILIES)
    for name, spec in FAMILIES.items():
        config = spec.config
        layers = layer_count(config)
        assert 4 <= layers <= 8 and len(spec.layers) == layers, name
        assert spec.notes and spec.model_type
    mixers = {name: {code[0] for code in spec.layers} for name, spec in FAMILIES.items()}
    for name in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h", "jamba", "lfm2", "lfm2_moe", "kimi_linear",
                 "granitemoehybrid"):
        assert len(mixers[name] - {"-"}) >= 2, name  # attention and linear / SSM / convolution layers
    for name in ("mistral", "gemma3_text", "gpt_oss", "olmo3", "exaone4", "cohere2", "step3p5"):
        assert {"S", "F"} <= mixers[name] and FAMILIES[name].config["sliding_window"] <= 16, name
    for name in ("glm4_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "dots1", "bailing_moe", "glm4_moe_lite",
                 "deepseek_v32"):
        assert FAMILIES[name].config["first_k_dense_replace"] == 1
        assert FAMILIES[name].layers[0].endswith("D") and FAMILIES[name].layers[1].endswith("E"), name
    assert FAMILIES["gemma2"].config["attn_logit_softcapping"] and FAMILIES["gemma2"].config["final_logit_softcapping"]


# tests/engine/test_families.py generates from every family's float32 model (and checks the tokens
# vary); here a sample checks the directory itself, and each family is quantized the other way.
@pytest.mark.parametrize("family", matrix.sample(sorted(FAMILIES), every=("llama", "qwen3_next")))
def test_float32_model_loads_and_generates_varied_tokens(tmp_path, family):
    path = build_family_model(tmp_path / "m", family)
    assert {p.name for p in path.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json",
                                                "tokenizer_config.json"}
    assert sum(p.stat().st_size for p in path.iterdir()) < 5_000_000
    config = config_of(path)
    assert config["model_type"] == FAMILIES[family].model_type and "quantization" not in config
    out = greedy_from_dir(path)
    assert len(set(out)) >= 5, out


@pytest.mark.parametrize("family,quant", [(f, q) for f, q in matrix.rows(sorted(FAMILIES), ["q4", "mixed"], offset=1)
                                          if q in FAMILIES[f].quants])  # afm7: float only
def test_quantized_model_loads_and_generates_varied_tokens(tmp_path, family, quant):
    path = build_family_model(tmp_path / "m", family, quant=quant)
    quantization = config_of(path)["quantization"]
    assert (quantization["group_size"], quantization["bits"]) == (64, 4)
    overrides = {k: v for k, v in quantization.items() if isinstance(v, dict)}
    if quant == "mixed" and family not in RECIPE_NAMES_UNKNOWN:  # per-module overrides, as mlx-community's have
        # bailing_moe_v3's own quant_predicate keeps the embedding and head in float (no 6-bit).
        assert {v["bits"] for v in overrides.values()} >= ({8} if family == "bailing_moe_v3" else {6, 8}), overrides
        # granitemoe's own quant_predicate pins every o_proj to 8-bit group 64, and the family's
        # predicate decides first (families.py), so its last o_proj never gets group 32; rwkv7's
        # gives its LoRA and embeddings 8 bits with no group size of their own.
        assert family == "granitemoe" or any(v.get("group_size") == 32 for v in overrides.values()), overrides
    weights = mx.load(str(path / "model.safetensors"))
    assert any(k.endswith(".scales") for k in weights)
    out = greedy_from_dir(path)
    assert len(set(out)) >= 5, out


@pytest.mark.parametrize("family", matrix.sample(DENSE, stride=3))
def test_bfloat16_model_generates_varied_tokens(tmp_path, family):
    # MoE families also build in half precision, but mlx's CPU backend runs expert
    # matmuls (GatherMM) in float32 only, so they are generated from on Metal only.
    path = build_family_model(tmp_path / "m", family, dtype="bfloat16")
    weights = mx.load(str(path / "model.safetensors"))
    # Vectors a family's cast_predicate keeps in float32 (qwen3_5's A_log) may remain.
    assert {v.dtype for k, v in weights.items() if k.endswith("_proj.weight") or "embed" in k} == {mx.bfloat16}
    out = greedy_from_dir(path)
    assert len(set(out)) >= 5, out


@pytest.mark.parametrize(("family", "options"), [
    ("gpt_oss", {"quant": "mxfp4"}),
    ("qwen3_moe", {"quant": "mxfp4"}),
    ("llama", {"quant": "q6"}),
    ("gemma3_text", {"quant": "q8"}),
    ("qwen3_next", {"dtype": "bfloat16"}),  # MoE: builds; loads on CPU
    ("llama4_text", {"dtype": "float16"}),
])
def test_other_formats(tmp_path, family, options):
    path = build_family_model(tmp_path / "m", family, **options)
    config = config_of(path)
    if options.get("quant") == "mxfp4":
        # Plus 8-bit routers where the family's own quant_predicate asks for them.
        assert config["quantization"].items() >= {"group_size": 32, "bits": 4, "mode": "mxfp4"}.items()
    elif "quant" in options:
        assert config["quantization"]["bits"] == {"q6": 6, "q8": 8}[options["quant"]]
    if FAMILIES[family].moe and options.get("dtype", "float32") != "float32":
        from mlx_lm.utils import load_model

        load_model(path)
        return
    out = greedy_from_dir(path)
    assert len(set(out)) >= 5, out


def test_same_arguments_same_bytes_and_the_cli_agrees(tmp_path):
    # qwen3_next: mlx-lm draws its SSM decay with mx.random, so this also checks seeding.
    a = build_family_model(tmp_path / "a", "qwen3_next", quant="mixed")
    b = build_family_model(tmp_path / "b", "qwen3_next", quant="mixed")
    assert file_hashes(a) == file_hashes(b)
    cli = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "make-test-model", str(cli), "--family", "qwen3_next",
         "--quant", "mixed"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    assert result.stdout.strip() == str(cli)  # only the path: mlx-lm's quantization note is kept off stdout
    assert file_hashes(cli) == file_hashes(a)
    other = build_family_model(tmp_path / "seed1", "qwen3_next", quant="mixed", seed=1)
    assert file_hashes(other)["model.safetensors"] != file_hashes(a)["model.safetensors"]
    assert file_hashes(other)["tokenizer.json"] == file_hashes(a)["tokenizer.json"]


def test_full_mlx_lm_load_with_tokenizer(tmp_path):
    from mlx_lm import load

    path = build_family_model(tmp_path / "m", "gemma3_text", quant="q4")
    model, tokenizer = load(str(path))
    assert tokenizer.eos_token_ids == {2}
    assert "lm_head" not in model  # published Gemma 3 ties the head; so does this one


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--family", "llama", "--layers", "3"], "--layers"),
        (["--family", "qwen3", "--untied", "--shards", "2"], "--untied, --shards"),
        (["--quant", "q4"], "--quant needs --family"),
    ],
)
def test_cli_refuses_llama_options_with_a_family(tmp_path, capsys, argv, message):
    from orchestrator.cli import main

    out = tmp_path / "m"
    assert main(["make-test-model", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_cli_makes_a_family_model_and_keeps_the_llama_one(tmp_path, capsys):
    from orchestrator.cli import main

    assert main(["make-test-model", str(tmp_path / "g"), "--family", "gpt_oss", "--quant", "mxfp4",
                 "--dtype", "bfloat16", "--seed", "3"]) == 0
    config = config_of(tmp_path / "g")
    assert (config["model_type"], config["pipeserve"]["seed"], config["torch_dtype"]) == ("gpt_oss", 3, "bfloat16")
    assert main(["make-test-model", str(tmp_path / "g"), "--family", "gpt_oss"]) == 2  # exists, no --force
    assert main(["make-test-model", str(tmp_path / "l"), "--layers", "2"]) == 0
    assert config_of(tmp_path / "l")["num_hidden_layers"] == 2
    assert capsys.readouterr().out.split() == [str(tmp_path / "g"), str(tmp_path / "l")]


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown family"):
        build_family_model(tmp_path / "m", "gpt5")
    with pytest.raises(ValueError):
        build_family_model(tmp_path / "m", "llama", dtype="int8")
    with pytest.raises(ValueError):
        build_family_model(tmp_path / "m", "llama", quant="q3")
    assert not (tmp_path / "m").exists()


def test_config_overrides_reshape_a_family_with_its_own_code(tmp_path):
    # What the benchmark's family rows use: a family's keys, scaled up, and a larger vocabulary.
    overrides = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "vocab_size": 1024,
                 "num_experts": 4}
    path = build_family_model(tmp_path / "m", "qwen3_moe", config_overrides=overrides)
    config = config_of(path)
    assert {k: config[k] for k in overrides} == overrides
    assert config["pipeserve"]["config_overrides"] == overrides
    assert config["eos_token_id"] == 2  # the token ids are not overridable
    assert Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab_size() == 1024
    weights = mx.load(str(path / "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape == (1024, 128)
    assert weights["model.layers.1.mlp.switch_mlp.gate_proj.weight"].shape[0] == 4
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    prompt = Tokenizer.from_file(str(path / "tokenizer.json")).encode(PROMPT).ids  # fewer tokens: larger vocab
    out = [int(token) for (token, _), _ in zip(generate_step(mx.array(prompt), model, max_tokens=24), range(24))]
    assert len(set(out)) >= 5, out
    # Without overrides nothing changes: the default model is still the tiny one.
    assert "config_overrides" not in config_of(build_family_model(tmp_path / "d", "qwen3_moe"))["pipeserve"]
