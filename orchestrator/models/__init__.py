"""What a model directory is, read without loading it: config, bytes, KV per token; and the demo and GGUF imports."""
