"""Shared fixtures of the test suite; the numpy reference is tests/support/reference.py, the
process harness tests/support/procs.py.

Layout: tests/unit/<layer>/ in-process (`make test-fast`, under a minute), tests/system/ real
processes, tests/scenarios/ faults, stalls, partitions, several hosts and attacks; workers and
helpers in tests/support/. Markers: `fast` marks the unit and in-process tests; `slow` a test
that takes seconds (large buffers); `soak` the soak and chaos runs in miniature. `make test`
runs everything.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

import collectives as cl
from support import timing
from support.procs import ProcessSet


# The fuzz tests (tests/scenarios/test_security.py) take their example count from a hypothesis profile:
# "suite" (the default, what `make test` runs, a few seconds each) or, for a long hunt,
# `pytest tests/scenarios/test_security.py -k fuzz --hypothesis-profile deep` (20,000 examples each).
settings.register_profile("suite", max_examples=500)
settings.register_profile("deep", max_examples=20_000)
settings.load_profile("suite")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test that takes seconds (large buffers)")
    config.addinivalue_line("markers", "fast: a unit or in-process test (make test-fast)")
    config.addinivalue_line("markers", "failslow_core: the fail-slow case `make test` runs")
    config.addinivalue_line(
        "markers", "failslow_matrix: the fail-slow scenarios (make test-failslow, run by .ci/run)"
    )
    config.addinivalue_line("markers", "stall_core: the stall-culprit cases `make test` runs")
    config.addinivalue_line(
        "markers", "stall_matrix: the whole stall-culprit matrix (make test-stall, run by .ci/run)"
    )
    config.addinivalue_line(
        "markers",
        "stall_bench: `python -m bench stallmatrix` in miniature beside CPU burners "
        "(make test-stall runs it alone, after the matrix)",
    )
    config.addinivalue_line(
        "markers",
        "torch_recovery: the fault-tolerant DDP example's whole matrix and the longer "
        "dist.shrink_group cases (tests/system/test_torch_ft_ddp.py, test_torch_shrink.py; "
        "make test-torch-recovery, run by .ci/run)",
    )
    config.addinivalue_line(
        "markers",
        "long: a longer run of what a shorter test in `make test` already checks "
        "(`make test-long`, run by .ci/run)",
    )
    config.addinivalue_line(
        "markers",
        "soak: bench.stress.soak and bench.stress.chaos in "
        "miniature (tests/system/test_soak_chaos.py; `pytest -m soak`)",
    )
    config.addinivalue_line(
        "markers",
        "browser: explain's pages in headless Chromium "
        "(`make test-browser`; skipped without chromium)",
    )
    config.addinivalue_line(
        "markers",
        "install: resolves the extras against the package index as `pip install` would "
        "(`make test-extras`, run by .ci/run; a minute or more)",
    )
    config.addinivalue_line(
        "markers",
        "ci_must_run: a test that skips where the machine lacks something (root, network "
        "namespaces, tc, nsenter, a framework); under CI=true its skip is a failure",
    )


@pytest.fixture
def procs(tmp_path):
    """A ProcessSet: every process a test starts is killed and reaped at teardown."""
    ps = ProcessSet(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


@pytest.fixture
def inproc_world():
    """A factory of half-built in-process worlds: (world, [ProcessGroup per requested rank]).
    Lets a test drive only some ranks by hand. Every group is destroyed afterwards."""
    from collectives.membership.diagnose import blame
    from collectives.transport.inproc import InprocWorld

    made = []

    def build(size, ranks=None, timeout=2.0):
        world = InprocWorld(size, blame=blame)
        pgs = [
            cl.ProcessGroup(world.transport(r), timeout=timeout, judge=world)
            for r in (range(size) if ranks is None else ranks)
        ]
        made.extend(pgs)
        return world, pgs

    yield build
    for pg in made:
        pg.destroy()


def pytest_report_header(config):
    return (
        f"time scale {timing.SCALE:g} at the start, measured again before each test "
        f"(tests/support/timing.py; {timing.ENV} fixes it)"
    )


_BASE_TIMEOUT = pytest.StashKey[float]()


def pytest_collection_modifyitems(config, items):
    """Each test's own deadline (pytest-timeout) before scaling, kept for when it runs."""
    default = float(config.getoption("timeout", None) or config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = (
            (marker.args[0] if marker.args else marker.kwargs.get("timeout", default))
            if marker is not None
            else default
        )
        item.stash[_BASE_TIMEOUT] = float(seconds or 0)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Before each test: the time scale measured again (load that began during the run counts,
    support/timing.py), and the test's own deadline grown with it, as the deadlines inside it
    are: a test that would pass on an idle machine is not cut short on a busy one. Runs
    before pytest-timeout reads the deadline (tryfirst; this wrapper is the outer one)."""
    scale = timing.refresh()
    seconds = item.stash.get(_BASE_TIMEOUT, 0.0)
    if seconds and scale != 1.0:
        item.add_marker(pytest.mark.timeout(timing.scaled(seconds)), append=False)
    yield


def in_ci() -> bool:
    """Whether this run is CI's (.ci/run sets CI=true, as CI services do)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_reason(report) -> str:
    """The reason a skipped report gives (its longrepr is (path, line, reason))."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test says the time scale it ran under: was the machine busy? And under CI=true
    a test marked ci_must_run that skips -- a namespace, tc or framework test on a machine
    that lost what it needs -- fails, saying why it skipped: CI that cannot run them must not
    stay green. (-ra, in pyproject.toml, names every skip and its reason in the summary.)"""
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and not hasattr(report, "wasxfail")
        and in_ci()
        and item.get_closest_marker("ci_must_run") is not None
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true, which must run it (marker ci_must_run): {skip_reason(report)}"
        )
    if report.failed:
        report.sections.append(
            ("time scale", f"{timing.SCALE:g} (tests/support/timing.py; load per CPU)")
        )
