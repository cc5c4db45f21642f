# remat-dsl: set up, test, demo, bench.
# `make venv` builds .venv from nothing; torch is installed first with its version pinned,
# otherwise pip picks a multi-GB CUDA build.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: venv test demo bench clean

venv: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install '$(TORCH)'
	$(PIP) install -e '.[test]'
	touch $(STAMP)

test: venv
	$(PY) -m pytest -q

demo: venv
	$(PY) -m remat_dsl.demo

bench: venv
	$(PY) bench/overhead.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
