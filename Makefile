# Two entry points for a fresh machine (README.md):
#   make demo   - set up a small virtualenv (.venv-demo: the package, torch and numpy) and run the main job
#   make test   - set up every test tool and run the whole suite (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
DEMO_VENV := .venv-demo
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/.tools/bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test setup tools lint typecheck dashboards dashboards-check unit gpu-test clean

# The demo needs only the base package, torch and numpy (without numpy every torch import warns):
# torch the CPU build 2.13.0 unless the system Python has one (scripts/setup-venv.sh decides);
# its own venv, so `make test` keeps the whole set in .venv.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu takes torch's CPU wheel (PyPI's Linux torch is the CUDA build).
TORCH_INDEX ?=
demo: $(DEMO_VENV)/.ready
	$(DEMO_VENV)/bin/python -m oomsight demo

$(DEMO_VENV)/.ready: pyproject.toml
	if $(PYTHON) -c 'import torch' 2>/dev/null; then $(PYTHON) -m venv --system-site-packages $(DEMO_VENV); \
	else $(PYTHON) -m venv $(DEMO_VENV) && \
	  $(DEMO_VENV)/bin/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) 'torch==2.13.0'; fi
	$(DEMO_VENV)/bin/python -m pip install -q --disable-pip-version-check -e . numpy
	touch $@

test: setup tools lint typecheck dashboards-check unit

setup: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml scripts/setup-venv.sh
	bash scripts/setup-venv.sh $(VENV)
	touch $@

tools:
	bash scripts/install-tools.sh

lint:
	$(VENV)/bin/ruff check $(wildcard exporter server sidecar webhook tests benchmarks dashboards)
	$(VENV)/bin/lint-imports .importlinter

typecheck:
	$(VENV)/bin/mypy

# Grafana dashboards and Prometheus rules of the chart, generated from dashboards/ (docs/dashboards.md)
dashboards: setup
	$(PY) -m dashboards

dashboards-check:
	$(PY) -m dashboards --check

unit:
	$(PY) -m pytest -q --durations=20  # the 20 slowest tests, at the end of every run

# On the GPU machine (no network; run from the tree):
#   PYTHONPATH=exporter:server:sidecar:webhook python3 -m pytest -m gpu -p no:cacheprovider tests
gpu-test:
	PYTHONPATH=exporter:server:sidecar:webhook $(PYTHON) -m pytest -m "gpu or gpu_image" tests

clean:
	rm -rf $(VENV) $(DEMO_VENV) .tools
