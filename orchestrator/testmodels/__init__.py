"""Test-model builders: tiny deterministic random models of mlx-lm's families (`pipeserve make-test-model`)."""
