"""The random test model: deterministic bytes, HF layout, loads in mlx-lm, varied output."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.testmodels.llama import make_test_model

REPO = Path(__file__).resolve().parents[2]


def file_hashes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def load(path: Path):
    from mlx_lm.utils import load as mlx_load

    return mlx_load(str(path))


def chat_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers 5 may return a BatchEncoding-like mapping
    return list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)


def greedy(model, prompt: list[int], n: int) -> list[int]:
    from mlx_lm.generate import generate_step

    out = []
    for (token, _), _ in zip(generate_step(mx.array(prompt), model, max_tokens=n), range(n)):
        out.append(int(token))
    return out


@pytest.fixture(scope="module")
def loaded(test_model_dir):
    return load(test_model_dir)


def test_default_is_small_and_complete(tmp_path):
    start = time.perf_counter()
    path = make_test_model(tmp_path / "m")
    print(f"the default test model took {time.perf_counter() - start:.2f} s")  # measured, not asserted
    names = {p.name for p in path.iterdir()}
    assert names == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert sum(p.stat().st_size for p in path.iterdir()) < 1_000_000
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (4, 64, 512)
    weights = mx.load(str(path / "model.safetensors"))
    assert "lm_head.weight" not in weights
    assert weights["model.layers.3.mlp.down_proj.weight"].shape == (64, 128)
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)  # 2 kv heads x 16


def test_same_options_same_bytes_even_in_another_process(tmp_path, test_model_dir):
    again = make_test_model(tmp_path / "again")
    assert file_hashes(again) == file_hashes(test_model_dir)
    # A fresh process (new hash seeds in the Rust tokenizer trainer) through the CLI.
    cli = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "make-test-model", str(cli)],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    assert result.stdout.strip() == str(cli)
    assert file_hashes(cli) == file_hashes(test_model_dir)


def test_other_seed_other_weights_same_tokenizer(tmp_path, test_model_dir):
    other = file_hashes(make_test_model(tmp_path / "seed1", seed=1))
    base = file_hashes(test_model_dir)
    assert other["model.safetensors"] != base["model.safetensors"]
    assert other["tokenizer.json"] == base["tokenizer.json"]


def test_shards_split_layers_with_index(tmp_path, test_model_dir):
    path = make_test_model(tmp_path / "sharded", shards=3)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    files = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sorted(set(index["weight_map"].values())) == files
    assert not (path / "model.safetensors").exists()
    whole = mx.load(str(test_model_dir / "model.safetensors"))
    assert set(index["weight_map"]) == set(whole)
    total = 0
    for name in files:
        part = mx.load(str(path / name))
        total += sum(v.nbytes for v in part.values())
        assert {k for k, f in index["weight_map"].items() if f == name} == set(part)
        for key, value in part.items():  # sharding moves tensors, never changes them
            assert mx.array_equal(value, whole[key]).item(), key
    assert index["metadata"]["total_size"] == total
    # 4 layers over 3 shards: contiguous ranges, embedding first, norm last.
    layer_file = {int(k.split(".")[2]): f for k, f in index["weight_map"].items() if k.startswith("model.layers.")}
    assert [layer_file[i] for i in range(4)] == [files[0], files[0], files[1], files[2]]
    assert index["weight_map"]["model.embed_tokens.weight"] == files[0]
    assert index["weight_map"]["model.norm.weight"] == files[2]
    model, _ = load(path)
    ref, _ = load(test_model_dir)
    prompt = mx.array([[5, 6, 7, 8]])
    assert mx.array_equal(model(prompt), ref(prompt)).item()


@pytest.mark.parametrize(
    "options", [{"dtype": "bfloat16"}, {"tied": False}, {"dtype": "bfloat16", "tied": False, "shards": 2}]
)
def test_variants_load_and_generate(tmp_path, options):
    path = make_test_model(tmp_path / "m", **options)
    model, tokenizer = load(path)
    weights = dict(mx.load(str(next(path.glob("model*.safetensors")))))
    expected = mx.bfloat16 if options.get("dtype") == "bfloat16" else mx.float32
    assert all(v.dtype == expected for v in weights.values())
    if options.get("tied") is False:
        index = path / "model.safetensors.index.json"
        names = json.loads(index.read_text())["weight_map"] if index.exists() else weights
        assert "lm_head.weight" in names
    out = greedy(model, chat_ids(tokenizer, [{"role": "user", "content": "hi"}]), 16)
    assert len(set(out)) >= 8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_output_is_varied(tmp_path, seed, test_model_dir):
    path = test_model_dir if seed == 0 else make_test_model(tmp_path / "m", seed=seed)
    model, tokenizer = load(path)
    out = greedy(model, chat_ids(tokenizer, [{"role": "user", "content": "Hello, who are you?"}]), 32)
    assert len(set(out)) >= 16, out


def test_tokenizer_specials_and_chat_template(loaded):
    _, tokenizer = loaded
    assert len(tokenizer.get_vocab()) == 512
    specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert [tokenizer.convert_tokens_to_ids(t) for t in specials] == [0, 1, 2]
    assert tokenizer.eos_token_ids == {2}
    ids = chat_ids(tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    assert ids[0] == 1 and ids.count(1) == 2  # one <|im_start|> per turn, no extra BOS
    assert tokenizer.decode(ids) == ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                                     "<|im_start|>assistant\n")


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=80))
def test_tokenizer_round_trips_any_text(loaded, text):
    _, tokenizer = loaded
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_vocab_size_is_exact_for_other_sizes(tmp_path):
    from orchestrator.testmodels.llama import train_tokenizer

    for vocab in (259, 1000, 4096):
        assert train_tokenizer(vocab).get_vocab_size() == vocab


@pytest.mark.parametrize(
    "options",
    [{"vocab": 100}, {"hidden": 60, "heads": 8}, {"heads": 4, "kv_heads": 3}, {"shards": 5}, {"dtype": "int8"}],
)
def test_bad_options_are_rejected(tmp_path, options):
    with pytest.raises(ValueError):
        make_test_model(tmp_path / "m", **options)
    assert not (tmp_path / "m").exists()


def test_existing_directory_is_kept_unless_overwrite(tmp_path):
    path = make_test_model(tmp_path / "m")
    with pytest.raises(FileExistsError):
        make_test_model(path, seed=1)
    make_test_model(path, seed=1, overwrite=True)
    assert json.loads((path / "config.json").read_text())["pipeserve"]["seed"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary leftovers


def test_cli_options_reach_the_api():
    from orchestrator.cli import build_parser

    argv = ["make-test-model", "out", "--untied", "--dtype", "bfloat16", "--shards", "2", "--kv-heads", "4"]
    parser, _ = build_parser(argv)
    args = parser.parse_args(argv)
    assert (args.tied, args.dtype, args.shards, args.kv_heads, args.seed) == (False, "bfloat16", 2, 4, 0)
    argv = ["make-test-model", "out"]
    parser, _ = build_parser(argv)
    assert parser.parse_args(argv).tied is True
