"""Under CI=true a skip of a test marked ci_must_run is a failure (tests/conftest.py): a CI that
lost root, network namespaces, tc, nsenter or a framework does not stay green; elsewhere it
stays a skip, and the summary names every skip and its reason (-ra).

Invariant: a small suite -- a ci_must_run test that skips in its body, one that skips by
skipif, and an unmarked one that skips -- run with the suite's conftest: under CI=true the two
marked ones fail, each saying it skipped and why, and the run fails; without CI all three skip,
each named with its reason.
"""

import os
import subprocess
import sys

import pytest

from support.procs import ROOT, clean_env
from support.timing import scaled

SUITE = """
import pytest

@pytest.mark.ci_must_run
def test_needs_namespaces():
    pytest.skip("needs root and iproute2")

@pytest.mark.ci_must_run
@pytest.mark.skipif(True, reason="needs nsenter")
def test_needs_nsenter():
    pass

def test_needs_chromium():
    pytest.skip("no chromium")
"""


def run(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_small.py").write_text(SUITE)
    env = clean_env(PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-p", "conftest"]
        + ["-p", "no:xdist", "test_small.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )


@pytest.mark.timeout(120)
def test_under_ci_a_skip_of_a_must_run_test_fails(tmp_path):
    r = run(tmp_path, "true")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    why = "skipped under CI=true, which must run it (marker ci_must_run): "
    assert f"test_needs_namespaces - {why}needs root and iproute2" in out, out
    assert f"test_needs_nsenter - {why}needs nsenter" in out, out
    assert "SKIPPED [1] test_small.py:14: no chromium" in out, out  # unmarked: still a skip


@pytest.mark.timeout(120)
def test_elsewhere_it_skips_and_the_summary_says_why(tmp_path):
    r = run(tmp_path, None)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for reason in ("needs root and iproute2", "needs nsenter", "no chromium"):
        assert reason in out, out
    assert "3 skipped" in out, out
