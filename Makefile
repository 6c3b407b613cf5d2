# Two entry points for a fresh machine (README.md):
#   make demo   - set up a virtualenv and run the main job
#   make test   - set up every test tool and run the whole suite (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/.tools/bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test setup tools lint typecheck dashboards dashboards-check unit gpu-test clean

demo: setup
	$(PY) -m oomsight demo

test: setup tools lint typecheck dashboards-check unit

setup: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml scripts/setup-venv.sh
	bash scripts/setup-venv.sh $(VENV)
	touch $@

tools:
	bash scripts/install-tools.sh

lint:
	$(VENV)/bin/ruff check $(wildcard exporter sidecar webhook tests benchmarks dashboards)
	$(VENV)/bin/lint-imports .importlinter

typecheck:
	$(VENV)/bin/mypy

# Grafana dashboards and Prometheus rules of the chart, generated from dashboards/ (docs/dashboards.md)
dashboards: setup
	$(PY) -m dashboards

dashboards-check:
	$(PY) -m dashboards --check

unit:
	$(PY) -m pytest -q

# On the GPU machine (no network; run from the tree):
#   PYTHONPATH=exporter:sidecar:webhook python3 -m pytest -m gpu -p no:cacheprovider tests
gpu-test:
	PYTHONPATH=exporter:sidecar:webhook $(PYTHON) -m pytest -m "gpu or gpu_image" tests

clean:
	rm -rf $(VENV) .tools
