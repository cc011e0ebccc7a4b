# octodsl — `make demo` and `make test` set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is pinned to the CPU build that this machine serves from local disk; an unpinned
# torch would pull a multi-GB CUDA build. setup.cfg declares the range users may bring.
TORCH ?= torch==2.13.0

.PHONY: venv demo test clean

$(STAMP): setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	PATH=$(abspath $(VENV))/bin:$$PATH bash examples/demo.sh

test: venv
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info out
