# remat-dsl: set up, test, demo, bench.
# `make venv` builds .venv from nothing, from the versions pinned in requirements.lock;
# torch is installed first, otherwise pip picks a multi-GB CUDA build.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
LOCK   := requirements.lock
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: venv test test-slow demo bench gpu-check measurements tables lock clean

venv: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml $(LOCK) | $(PY)
	$(PIP) install -c $(LOCK) '$(TORCH)'
	$(PIP) install -c $(LOCK) setuptools
	$(PIP) install -c $(LOCK) --no-build-isolation -e '.[test,examples,trainers]'
	touch $(STAMP)

# two workers, one test file each at a time (module fixtures are built once per file), in
# the order tests/conftest.py gives (the longest files first); one torch (OpenMP) thread
# per process, so that two workers and the commands they run do not fight over the two
# cores (docs/measurements.md, "The test suite")
test: venv
	$(VENV)/bin/ruff check remat_dsl tests bench examples
	$(VENV)/bin/mypy
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# the long sweeps (3000 fuzzed plans, ...): not part of `make test`
test-slow: venv
	$(PY) -m pytest -q -m slow

demo: venv
	$(PY) -m remat_dsl.cli.demo

bench: venv
	$(PY) bench/overhead.py

# the GPU acceptance run (bench/gpu_check.py, docs/devices.md): plans, their modules and two
# baselines measured on one CUDA GPU in at most 8 minutes; it writes its own section of
# docs/measurements.md.  Without a GPU it says so and exits 0: not part of `make measurements`.
gpu-check: venv
	$(PY) bench/gpu_check.py

# docs/measurements.md again: each bench script in turn writes its own section (bench/_common.py;
# `--no-write` prints only).  Hours on 2 cores; timings need an idle machine.
measurements: venv
	$(PY) bench/bounds.py
	$(PY) bench/predicted.py examples/gpt2.py --device cpu
	$(PY) bench/polish.py
	$(PY) bench/overhead.py
	$(PY) bench/plan_cache.py
	$(PY) bench/planning_time.py tests/models/hf_t5.py
	$(PY) bench/twremat_scale.py
	$(PY) bench/decoder.py bench/models/llama_d512_bytes.py:build_8_layers --budgets 40,50
	$(PY) bench/cost_model.py --fit --leave-one-out
	$(PY) bench/optimality.py examples/gpt2.py --fractions 0.5,0.3 --solvers auto --no-smallest
	$(PY) bench/frontier.py
	$(PY) bench/stock_sweep.py
	$(PY) bench/load_independence.py
	$(PY) bench/llama2_7b.py
	$(PY) bench/whole_step.py
	$(PY) bench/test_suite.py

# write grammar/*.tables.json again after a grammar edit (NOTE: [Parser tables] in remat_dsl/plan/parser.py)
tables: venv
	$(PY) -m remat_dsl.plan.tables

# rewrite the lock from what .venv has now (after an upgrade on purpose)
lock: venv
	(sed -n '/^#/p' $(LOCK); $(PIP) freeze --exclude-editable --all | grep -v '^pip==' | sed 's/+cpu$$//' | sort -f) > $(LOCK).new
	mv $(LOCK).new $(LOCK)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
