# octodsl — `make demo` and `make test` set everything up on a fresh machine; `make check` lints.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is pinned to the CPU build that this machine serves from local disk; an unpinned
# torch would pull a multi-GB CUDA build. setup.cfg declares the range users may bring.
TORCH ?= torch==2.13.0

.PHONY: venv demo test check clean

# octodsl/__init__.py holds the version the install's metadata records (setup.cfg reads it)
$(STAMP): setup.cfg pyproject.toml octodsl/__init__.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	# every extra at once, so that `make demo`, `make test` and `make check` share one install
	$(PY) -m pip install -q -e '.[all,test,check]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	PATH=$(abspath $(VENV))/bin:$$PATH bash examples/demo.sh

# pytest-xdist: a worker per core; tests/conftest.py puts a module's tests that share a
# module-scoped fixture (a DeepSpeed launch, a tuner run) in one group, which loadgroup keeps
# on one worker. Each DeepSpeed launch takes a free master port of its own.
test: venv
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q -n auto --dist loadgroup

# ruff (pyflakes, bugbear, complexity; `ruff format --check`: the code is as `ruff format` writes
# it) and mypy, configured in pyproject.toml. mypy runs through .ci/typecheck.py, which checks
# deepspeed_ext/ and grammar/ as octodsl.deepspeed_ext and octodsl.grammar, the names setup.cfg's
# package_dir installs them under.
PYTHON_FILES = octodsl deepspeed_ext grammar tests benchmarks .ci

check: venv
	$(VENV)/bin/ruff check $(PYTHON_FILES)
	$(VENV)/bin/ruff format --check $(PYTHON_FILES)
	$(PY) .ci/typecheck.py

clean:
	rm -rf $(VENV) build *.egg-info out .mypy_cache .ruff_cache
