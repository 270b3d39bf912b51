"""The coordinator: the pipeline's HTTP API (OpenAI, Anthropic, Responses), its scheduler, its links to stages."""
