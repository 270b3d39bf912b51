# Two commands for a newcomer: `make demo` and `make test`. Both set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_DIR ?= .demo

.PHONY: test test-matrix lint demo setup system clean bench bench-machine

setup: $(STAMP) system

# mlx's backend on Linux: cpu, or cuda on an NVIDIA machine (`make setup MLX_BACKEND=cuda` in a fresh
# checkout; README). Exactly one: the two wheels install the same files. macOS ignores it (Metal).
MLX_BACKEND ?= cpu

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(MLX_BACKEND),fast,test]"
	touch $@

# System packages: Chromium for the browser tests, libgfortran5 for the wheel's OpenBLAS, and
# Debian's OpenBLAS for CPUs that wheel's build cannot run on (no AVX-512; orchestrator/engine/blas.py).
# Installed only when running as root and missing; otherwise say what is needed.
SYSTEM_PACKAGES = chromium libgfortran5 libopenblas0-pthread
system:
	@if [ "$$(uname)" = Darwin ]; then \
		echo "macOS: no system packages (mlx runs on Metal; no OpenBLAS, no libgfortran); the browser tests need Playwright's Chromium: $(BIN)/playwright install chromium"; \
	elif [ -x /usr/bin/chromium ] && ldconfig -p | grep -q 'libgfortran.so.5 ' \
		&& ldconfig -p | grep -q 'libopenblas.so.0 '; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian packages: $(SYSTEM_PACKAGES)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
	else echo "note: install Debian's $(SYSTEM_PACKAGES) for the browser tests and fast BLAS"; fi

# The linter first: a style slip fails in a second, before minutes of tests.
lint: setup
	$(BIN)/ruff check .

# Two workers: most tests wait on child processes and sockets, so two share two cores well
# (27:30 -> 14:30 in CI); whole modules (and the dashboard walk) stay on one worker.
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope

# Every row of the family matrices (make test checks every family and every variant, not every pair).
test-matrix: lint
	PIPESERVE_FULL_MATRIX=1 $(BIN)/python -m pytest -q tests/engine/test_families.py \
		tests/engine/test_cached_prefix.py tests/testmodels/test_families.py

demo: setup
	$(BIN)/python -m orchestrator.demo_stack --dir $(DEMO_DIR)

# 2 emulated nodes (one core each) against one node, mlx-lm's server and pipeline in the same run
# (docs/benchmark.md); `make bench BENCH_ARGS=--quick` for smaller sizes on a shared 2-core machine.
BENCH_ARGS ?=
bench: setup
	$(BIN)/python e2e/bench_nodes.py $(BENCH_ARGS)

# The older whole-machine comparison (a 2-stage split against one process given every core).
bench-machine: setup
	$(BIN)/python e2e/bench_pipeline.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
