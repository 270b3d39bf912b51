"""`pipeserve make-test-model`: a deterministic random Llama model that mlx-lm loads.

The model is tiny by default (4 layers, 64 wide, 512 tokens: under 1 MB, made in well
under a second) and exists to test the pipeline exactly: the same options give
byte-identical files on every machine, so nodes can make their own copy and compare
checksums, and the weights are scaled so that greedy decoding produces varied tokens (a
model that repeats one token would let a wrong pipeline pass a comparison with the
reference).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from orchestrator.models.files import (
    CHATML_TEMPLATE,
    mx_dtype,
    save_weights,
    staged_directory,
    write_json,
    write_tokenizer_config,
)
from orchestrator.testmodels.tools import TOOL_CALL_TOKENS, TOOL_TEMPLATE, add_tool_tokens

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# 256 byte-level symbols plus the special tokens: the smallest vocabulary that can encode
# any text.
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)

# Training text for the tokenizer. It is embedded rather than read from the host (such as
# /usr/share/common-licenses) because those files differ between systems, and the tokenizer
# must be identical wherever the model is made.
CORPUS = """\
A language model reads text as a sequence of tokens and predicts the next one.
The model is split into stages; each stage holds a contiguous range of layers.
The first stage embeds the tokens, the last stage applies the final norm and the head.
Hidden states travel from one stage to the next over the network, one frame per step.
Each stage keeps its own key and value cache for every request it is serving.
When a request arrives, the coordinator sends the prompt to the first stage.
The answer comes back one token at a time, and the client sees it as a stream.
Pipeline parallelism lets a model that does not fit on one machine run on several.
It does not make a single request faster, but several requests can overlap in time.
Health checks must look at the stages themselves, not only at an open port.
If a stage stops, the coordinator reports the reason instead of hanging forever.
The quick brown fox jumps over the lazy dog, and the five boxing wizards jump quickly.
What is the capital of France? The capital of France is Paris.
How many layers does the model have? It has thirty layers and a hidden size of 576.
Numbers such as 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 100 and 2048 appear in text too.
Punctuation matters: commas, periods. Questions? Exclamations! Quotes "like this".
def forward(self, x, cache=None):
    return self.norm(self.layers(self.embed(x), cache))
{"role": "user", "content": "Hello, who are you?"}
"""

_ONSETS = ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou", "ee")
_CODAS = ("", "", "n", "r", "s", "t", "l", "nd")


def _corpus(vocab: int) -> Iterator[str]:
    """Yield training lines: the embedded text, then made-up words for larger vocabularies.

    The English text alone supports only a few hundred merges. Pseudo-words built from
    syllables by a fixed-seed generator keep the trainer supplied for any vocabulary size
    while staying identical on every machine. The English text is repeated so that its
    merges come first.
    """
    lines = CORPUS.splitlines()
    for _ in range(8):
        yield from lines
    rng = random.Random(20240229)
    words_needed = 12 * max(0, vocab - 400)
    for _start in range(0, words_needed, 16):
        yield " ".join(
            "".join(
                rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(rng.randint(1, 3))
            )
            for _ in range(16)
        )


def train_tokenizer(vocab: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer with exactly `vocab` entries (specials included).

    The special tokens take ids 0, 1, 2 (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`), as
    in SmolLM2. Training is deterministic: the same `vocab` gives the same tokenizer.json.
    """
    if vocab < MIN_VOCAB:
        raise ValueError(f"vocab must be at least {MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(vocab), trainer)
    if tokenizer.get_vocab_size() != vocab:
        raise RuntimeError(f"tokenizer training reached {tokenizer.get_vocab_size()} tokens, wanted {vocab}")
    return tokenizer


def _layer_split(layers: int, shards: int) -> list[range]:
    """Split layer indices into `shards` contiguous ranges, sizes differing by at most one."""
    base, extra = divmod(layers, shards)
    ranges, start = [], 0
    for i in range(shards):
        size = base + (1 if i < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def make_test_model(
    out_dir: str | Path,
    *,
    layers: int = 4,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    vocab: int = 512,
    dtype: str = "float32",
    tied: bool = True,
    seed: int = 0,
    shards: int = 1,
    scale: float = 4.0,
    overwrite: bool = False,
    tools: bool = False,
) -> Path:
    """Write a random Llama model directory that `mlx_lm.utils.load` accepts; return its path.

    Weights are drawn from `numpy.random.default_rng(seed)` (not mx.random, whose streams
    are not promised stable) as normal(0, scale / sqrt(fan_in)) for matrices and
    normal(0, 1) for the embedding; norms are ones. mlx-lm's own init corresponds to a
    scale of about 0.6 and makes a random model repeat one token; the default 4.0 gives
    varied greedy output. `intermediate` defaults to 2 * hidden (kept small on purpose).
    With `shards` > 1 the layers are spread over HF-style shard files with an index: the
    embedding goes with the first shard, the final norm and head with the last.
    `dtype` "bfloat16" rounds the float32 draws, so it is the float32 model rounded.
    The directory appears atomically; an existing non-empty one is replaced only with
    `overwrite`. `tools` gives it a tool-calling chat template and two tool-call tokens
    (testmodels/tools.py), the vocabulary keeping its size.
    """
    intermediate = 2 * hidden if intermediate is None else intermediate
    target = mx_dtype(dtype)
    if min(layers, hidden, heads, kv_heads, intermediate) < 1:
        raise ValueError("layers, hidden, heads, kv_heads and intermediate must be positive")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    head_dim = hidden // heads
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    if head_dim % 2:
        raise ValueError(f"head dimension hidden/heads = {head_dim} must be even for RoPE")
    if not 1 <= shards <= layers:
        raise ValueError(f"shards must be between 1 and the number of layers ({layers})")
    tokenizer = add_tool_tokens(train_tokenizer(vocab - len(TOOL_CALL_TOKENS))) if tools else train_tokenizer(vocab)

    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> mx.array:
        # Drawn in a fixed order (the order of the calls below), so bytes depend on the
        # options only.
        w = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(scale / np.sqrt(cols))
        return mx.array(w).astype(target)

    def ones(n: int) -> mx.array:
        return mx.ones((n,), dtype=target)

    embed = mx.array(rng.standard_normal((vocab, hidden), dtype=np.float32)).astype(target)
    layer_tensors: list[dict[str, mx.array]] = []
    for i in range(layers):
        p = f"model.layers.{i}."
        layer_tensors.append(
            {
                p + "self_attn.q_proj.weight": matrix(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": matrix(kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": matrix(kv_heads * head_dim, hidden),
                p + "self_attn.o_proj.weight": matrix(hidden, heads * head_dim),
                p + "mlp.gate_proj.weight": matrix(intermediate, hidden),
                p + "mlp.up_proj.weight": matrix(intermediate, hidden),
                p + "mlp.down_proj.weight": matrix(hidden, intermediate),
                p + "input_layernorm.weight": ones(hidden),
                p + "post_attention_layernorm.weight": ones(hidden),
            }
        )
    head = {"model.norm.weight": ones(hidden)}
    if not tied:
        head["lm_head.weight"] = matrix(vocab, hidden)

    shard_tensors: list[dict[str, mx.array]] = []
    for k, layer_range in enumerate(_layer_split(layers, shards)):
        tensors: dict[str, mx.array] = {}
        if k == 0:
            tensors["model.embed_tokens.weight"] = embed
        for i in layer_range:
            tensors.update(layer_tensors[i])
        if k == shards - 1:
            tensors.update(head)
        shard_tensors.append(tensors)
    mx.eval([t for shard in shard_tensors for t in shard.values()])

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_traditional": False,
        "max_position_embeddings": 2048,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": SPECIAL_TOKENS.index("<|im_start|>"),
        "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"),
        "pad_token_id": SPECIAL_TOKENS.index("<|endoftext|>"),
        "torch_dtype": dtype,
        "pipeserve": {"kind": "test-model", "seed": seed, "scale": scale},
    }
    with staged_directory(Path(out_dir), overwrite=overwrite) as tmp:
        save_weights(tmp, shard_tensors)
        write_json(tmp / "config.json", config)
        write_tokenizer(tmp, tokenizer, model_max_length=config["max_position_embeddings"],
                        chat_template=TOOL_TEMPLATE if tools else CHATML_TEMPLATE)
    return Path(out_dir)


def write_tokenizer(out_dir: Path, tokenizer: Tokenizer, *, model_max_length: int,
                    chat_template: str = CHATML_TEMPLATE) -> None:
    """Write `tokenizer` (from `train_tokenizer`) as tokenizer.json plus a ChatML
    tokenizer_config.json into `out_dir`; shared with the model-family builder."""
    tokenizer.save(str(out_dir / "tokenizer.json"))
    write_tokenizer_config(
        out_dir,
        chat_template=chat_template,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=model_max_length,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `pipeserve make-test-model`."""
    parser.add_argument("out_dir", metavar="DIR", type=Path, help="directory to create")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2)")
    parser.add_argument("--intermediate", type=int, default=None, help="MLP size (default 2 x hidden)")
    parser.add_argument("--vocab", type=int, default=512, help=f"vocabulary size, at least {MIN_VOCAB} (default 512)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    tying = parser.add_mutually_exclusive_group()
    tying.add_argument("--tied", dest="tied", action="store_true", default=True,
                       help="share the embedding with the output head (default)")
    tying.add_argument("--untied", dest="tied", action="store_false", help="write a separate lm_head")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--shards", type=int, default=1, help="number of safetensors files (default 1)")
    parser.add_argument("--scale", type=float, default=4.0, help="weight scale (default 4.0)")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")
    parser.add_argument("--tools", action="store_true",
                        help="a tool-calling chat template and two tool-call tokens (mlx-lm's json_tools format)")


def run(args: argparse.Namespace) -> int:
    """Make the model; print its path. Returns the exit status."""
    try:
        path = make_test_model(
            args.out_dir,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            intermediate=args.intermediate,
            vocab=args.vocab,
            dtype=args.dtype,
            tied=args.tied,
            seed=args.seed,
            shards=args.shards,
            scale=args.scale,
            overwrite=args.force,
            tools=args.tools,
        )
    except (ValueError, FileExistsError) as e:
        print(f"make-test-model: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0
