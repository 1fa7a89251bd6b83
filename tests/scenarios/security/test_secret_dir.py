"""Another user cannot stop this user's jobs by taking the name of its private directory.

Invariant: with no job secret set, rank 0 publishes a generated one for the other ranks of its
host in this user's private directory (core/secret.py). When <temp dir>/collectives-<uid>
already exists and belongs to another user (anyone may create it in a shared temp dir), every
process passes it over -- nothing is written there or read from it -- and meets the others in
the next private directory (under this user's home), so the job runs, keyed, and every sum is
exact.
"""

from __future__ import annotations

import os

import pytest

from support.security_world import Procs, base_env, finish, start_world

# root (to own a directory as another user): under CI=true a skip is a failure (conftest.py)
pytestmark = pytest.mark.ci_must_run

NOBODY = 65534


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


@pytest.mark.timeout(90)
@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user takes root")
def test_a_squatted_secret_directory_is_passed_over(procs, tmp_path):
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    home.mkdir(mode=0o700)
    taken = tmp / f"collectives-{os.geteuid()}"
    taken.mkdir()
    os.chown(taken, NOBODY, NOBODY)
    taken.chmod(0o777)
    env = base_env(TMPDIR=tmp, HOME=home, XDG_RUNTIME_DIR="", TEST_ROUNDS=3)
    port = start_world(procs, tmp_path, 2, "sum", env)
    (tmp_path / "go").touch()
    published = list(home.glob(f".cache/collectives-run/*/coordinator-{port}.secret"))
    finish(procs, tmp_path, 2)
    assert len(published) == 1, list(home.rglob("*"))
    assert os.listdir(taken) == []
    assert f"not sharing the job secret through {taken}" in procs.err("rank0")
