# Everything a fresh clone needs: `make test`, `make demo`, `make bench`.
# The first run creates .venv and installs the package (editable) with its extras; later runs
# reinstall only when pyproject.toml changes (the stamp file below is older than it).
# torch is pinned in pyproject.toml (torch==2.13.0, the CPU wheel on this machine's disk):
# an unpinned torch could pull a multi-GB CUDA build.

PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
EXTRAS  := test,torch,bench,examples
PYTEST_ARGS ?=

.PHONY: all install test demo bench clean distclean

all: test

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@touch $@

# pyproject.toml sets a per-test timeout (pytest-timeout, 120 s); the suite runs in minutes.
test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

# 4 local workers run every collective with every algorithm and print what moved, and how fast.
demo: $(STAMP)
	$(PY) -m collectives.launch --nproc 4 --timeout 300 examples/collectives_tour.py

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf build dist *.egg-info .pytest_cache .benchmarks
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
