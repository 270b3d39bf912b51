# Two commands for a newcomer: `make demo` and `make test`. Both set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_DIR ?= .demo

.PHONY: test demo setup system clean bench

setup: $(STAMP) system

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[fast,test]"
	touch $@

# System packages: Chromium for the browser tests, libgfortran5 for the optional OpenBLAS.
# Installed only when running as root and missing; otherwise say what is needed.
system:
	@if [ -x /usr/bin/chromium ] && ldconfig -p | grep -q 'libgfortran.so.5 '; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian packages: chromium libgfortran5"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium libgfortran5 >/dev/null; \
	else echo "note: install Debian's chromium and libgfortran5 for the browser tests and fast BLAS"; fi

test: setup
	$(BIN)/python -m pytest -q

demo: setup
	$(BIN)/python -m orchestrator.demo_stack --dir $(DEMO_DIR)

bench: setup
	$(BIN)/python e2e/bench_pipeline.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
