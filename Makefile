# Everything a fresh clone needs: `make test`, `make demo`, `make bench`.
# The first run creates .venv and installs the package (editable) with its extras; later runs
# reinstall only when pyproject.toml changes (the stamp file below is older than it).
# torch is pinned in pyproject.toml (torch==2.13.0, the CPU wheel on this machine's disk):
# an unpinned torch could pull a multi-GB CUDA build.

SHELL   := /bin/bash
PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
EXTRAS  := test,torch,bench,examples
PYTEST_ARGS ?=

.PHONY: all install test test-fast test-soak test-long test-sweep test-stall test-failslow test-browser test-torch-suite \
        test-torch-recovery test-integrations test-extras \
        lint lint-imports typecheck demo demo-stall tour bench clean distclean

all: test

install: $(STAMP)

# --no-cache-dir: a CI machine's disk can be nearly full, and pip's cache would hold a second
# copy of every wheel (torch's among them) beside the venv.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q --no-cache-dir -e '.[$(EXTRAS)]'
	@touch $@

# pyproject.toml sets a per-test timeout (pytest-timeout, 120 s); the suite runs in minutes.
# The lint (ruff, the import contracts: `make lint`) runs first, then the types.
# PyTorch's own suite (a minute or two more) is its own target, test-torch-suite, which .ci/run
# runs after this one: `make test` stays within 10 minutes on 2 cores.
# Three pytest workers (pytest-xdist): most tests wait on processes, sockets and deadlines rather
# than compute, so three share two cores (about 7 minutes, against 8 with two; the tests' bounds
# follow the machine's load, support/timing.py). The soak and chaos runs are test-soak's,
# the longer runs of what a shorter test here checks test-long's.
test: lint typecheck
	$(PY) -m pytest -q -n 3 --dist worksteal \
	    -m "not soak and not long and not stall_matrix and not stall_bench and not failslow_matrix and not browser and not torch_recovery and not install" \
	    --ignore=tests/system/test_torch_suite.py --ignore=tests/integrations \
	    $(PYTEST_ARGS)

# The soak and chaos runs in miniature (marker `soak`, tests/system/test_soak_chaos.py): about
# 3 minutes, each loading both cores itself, so they run alone, with no other test's deadlines
# beside them. .ci/run runs it after `make test`.
test-soak: $(STAMP)
	$(PY) -m pytest -q -m soak $(PYTEST_ARGS)

# Longer runs of what a shorter test in `make test` already checks (marker `long`: 20 random
# faults in a row where `make test` runs 7, ...); each test's docstring says what `make test`
# keeps. Two workers (`make test` runs three).
# .ci/run runs it after test-soak.
test-long: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal -m long tests $(PYTEST_ARGS)

# The simulator's long sweep (collectives/simulation/): SWEEP_SEEDS seeds of the whole failure
# side on a virtual clock, one process per core, every run's properties checked; it prints each
# failing seed (replay one: python -m collectives.simulation run --seed S --trace). `make test`
# runs 1,000 seeds (tests/unit/simulation/test_simulation.py). .ci/run runs it after test-long.
SWEEP_SEEDS ?= 0:100000
SWEEP_JOBS ?= $(shell nproc)
test-sweep: $(STAMP)
	$(PY) -m collectives.simulation sweep --seeds $(SWEEP_SEEDS) --jobs $(SWEEP_JOBS)

# explain's pages in headless Chromium (marker `browser`, tests/system/test_explain_browser.py):
# each Chromium start costs a few seconds, so they are not in `make test`; .ci/run installs
# Debian's chromium where it is missing and runs this. Without chromium the tests skip, saying so.
test-browser: $(STAMP)
	$(PY) -m pytest -q -m browser $(PYTEST_ARGS)

# The unit tests only (tests/unit/<layer>/: in-process, no worker processes): under a minute.
# Two workers: many of them wait on deadlines (a rank that never joins, a stalled peer).
test-fast: lint-imports
	$(PY) -m pytest -q -n 2 --dist worksteal tests/unit $(PYTEST_ARGS)

# ruff's rules and its formatting ([tool.ruff] in pyproject.toml), then the import contracts
# ([tool.importlinter]). .pre-commit-config.yaml runs the same checks before each commit.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

lint-imports: $(STAMP)
	$(VENV)/bin/lint-imports

# mypy over the whole package ([tool.mypy] in pyproject.toml): the public modules strict (every
# def typed), the internals relaxed module by module. About 20 s cold on 2 cores, a few seconds
# with its cache (.mypy_cache).
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The whole stall-culprit matrix (tests marked stall_matrix: the culprit at every rank of 3, 4
# and 5 workers, each slow-link pattern and gradient size, injected faults and tc in network
# namespaces; `make test` runs its stall_core cases): about 4 minutes on 2 cores. Then, alone
# (it starts 2 CPU burners, which would starve a neighbour's deadlines), the stall matrix's bench
# harness in miniature (marker stall_bench, tests/scenarios/test_stallmatrix_bench.py): under
# a minute. .ci/run runs it.
test-stall: $(STAMP)
	$(PY) -m pytest -q -n 2 -m stall_matrix tests $(PYTEST_ARGS)
	$(PY) -m pytest -q -m stall_bench tests $(PYTEST_ARGS)

# The fail-slow scenarios: links slowed by tc in network namespaces, found, routed around
# (tests/scenarios/test_failslow.py). One at a time: each times the job's step rate.
test-failslow: $(STAMP)
	$(PY) -m pytest -q -m "failslow_matrix or failslow_core" tests/scenarios/test_failslow.py tests/scenarios/test_failslow_nic.py tests/scenarios/test_chaos_slowlinks.py $(PYTEST_ARGS)

# PyTorch's own distributed test suite through the "collectives" backend: the tests Gloo
# passes here (tests/support/torch_suite/gloo_passes.txt, written by tests/support/torch_suite/
# list_gloo_passes.py), each on 3 forked ranks; a minute or two. .ci/run runs it after `make test`.
test-torch-suite: $(STAMP)
	$(PY) -m pytest -q tests/system/test_torch_suite.py $(PYTEST_ARGS)

# examples/torch_ft_ddp.py to the end of the job with a worker SIGKILLed or SIGSTOPped in the
# middle of a backward, at 3 and 4 workers, and with a warm spare (tests/system/
# test_torch_ft_ddp.py), and the rest of dist.shrink_group's cases (SIGSTOP, 4 ranks,
# disagreeing lists, SHRINK_ABORT, a joiner: tests/system/test_torch_shrink.py); marker
# `torch_recovery`, about 4 minutes. `make test` runs the example's short case and shrink_group
# after a SIGKILL at 3 ranks, with a live rank excluded, and on a group that cannot shrink.
test-torch-recovery: $(STAMP)
	$(PY) -m pytest -q -m torch_recovery tests/system/test_torch_ft_ddp.py \
	    tests/system/test_torch_shrink.py $(PYTEST_ARGS)

# The frameworks people train with (Lightning under three launchers, Accelerate, Ray Train,
# DCP, the DDP tutorial), each over Gloo and over this backend: tests/integrations/. Their
# packages are the `integrations` extra, installed on first use (its own stamp; torch stays
# the pinned CPU build). TEST_INTEGRATIONS=1: a framework that does not import fails its
# test, never skips it. A few minutes on 2 cores; .ci/run runs it after test-torch-suite.
INTEGRATIONS_STAMP := $(VENV)/.installed-integrations

$(INTEGRATIONS_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -q --no-cache-dir -e '.[$(EXTRAS),integrations]' 'torch==2.13.0'
	@touch $@

test-integrations: $(INTEGRATIONS_STAMP)
	TEST_INTEGRATIONS=1 $(PY) -m pytest -q tests/integrations $(PYTEST_ARGS)

# The extras as a user installs them: pip resolves `.[bench]` and `.[test]` as for a fresh
# environment (--dry-run --report, tests/system/test_extras.py, marker `install`): mpich comes
# wherever mpi4py does. Asks the package index; a minute or two. .ci/run runs it.
test-extras: $(STAMP)
	$(PY) -m pytest -q -m install tests/system/test_extras.py $(PYTEST_ARGS)

# The main job: 4 workers train an MLP on scikit-learn's digits, with a warm spare waiting
# outside the group (--spares 1: started with the job, everything imported). Rank 2 is
# SIGKILLed at step 60; the coordinator learns it from the kernel within milliseconds, the
# other three reconstruct at once and admit the spare, which receives the model and trains
# from there (its steps count: the job ends at world size 4); the launcher starts a new spare,
# ended when the job is. Every rank ends with the same parameters (checked, with test
# accuracy >= 0.95).
demo: $(STAMP)
	set -o pipefail; $(PY) -m collectives.launch --nproc 4 --spares 1 --max-restarts 1 \
	    --timeout 300 examples/train_digits.py --kill-rank 2 --kill-at-step 60 \
	    2>&1 | tee .demo.log
	$(PY) examples/check_final.py .demo.log --world-size 4 --min-acc 0.95

# The stalled-allreduce scenario: 3 workers train the digits MLP; at step 40 the links into and
# out of rank CULPRIT (default 1; 0, 1 or 2) start holding every message for 60 s, in this and
# every later generation (an unstable network that stays bad). The all_reduce stalls, the
# coordinator finds the culprit from the evidence (the stalled op's links, and where they tie,
# timed probes of every link) and evicts it; the two survivors drop the stalled step, form
# generation 1 and finish with identical parameters (checked, test accuracy >= 0.95). One line
# per event: each link slowed, the culprit and the evidence, the dropped step, the generation.
CULPRIT ?= 1
demo-stall: $(STAMP)
	set -o pipefail; $(PY) -m collectives.launch --nproc 3 --timeout 300 examples/train_digits.py \
	    --slow-links-around $(CULPRIT) --slow-at-step 40 --timeout 3 --leave-when-evicted \
	    --no-progress 2>&1 | tee .demo-stall.log
	$(PY) examples/check_final.py .demo-stall.log --world-size 2 --min-acc 0.95

# Every collective with every algorithm on 4 workers: what each rank sent and got, and how fast.
# On a host with fewer cores than ranks the 4 MiB all_reduce need not follow the textbook (ring
# fastest): the tour says why, from the ranks and CPUs it finds (and warms up first, so that
# the first algorithm timed does not pay for everyone's page faults).
tour: $(STAMP)
	$(PY) -m collectives.launch --nproc 4 --timeout 300 examples/collectives_tour.py

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .benchmarks .demo.log .demo-stall.log
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
