"""The extras install what they need, as a user installs them (pyproject.toml's
[project.optional-dependencies]).

Invariants:
  * every extra that brings mpi4py brings an MPI library with it (the `mpich` wheel): mpi4py
    without one fails at `from mpi4py import MPI` ("cannot load MPI library"), and anything
    that probes for MPI fails with it -- PyTorch Lightning's environment detection, for one,
    crashes a job before training, over Gloo too;
  * in this environment (make's extras) mpi4py loads its MPI library;
  * (marker `install`, `make test-extras`: it asks the package index, a minute or more) for
    each extra that names mpi4py (`bench`), pip's resolution, as `pip install` would do it in a
    fresh environment (--dry-run --ignore-installed --report), holds mpich beside mpi4py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import pytest

from support.procs import ROOT
from support.timing import scaled


def extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def names(requirements) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements}


EXTRAS_WITH_MPI4PY = sorted(name for name, reqs in extras().items() if "mpi4py" in names(reqs))


def test_every_extra_with_mpi4py_brings_an_mpi_library():
    found = extras()
    assert "bench" in found and "test" in found, found
    missing = [name for name, reqs in found.items() if "mpi4py" in names(reqs)]
    missing = [name for name in missing if "mpich" not in names(found[name])]
    assert not missing, f"extras with mpi4py and no MPI library (mpich): {missing}"


def test_mpi4py_loads_its_library_here():
    pytest.importorskip("mpi4py")  # make's extras (bench) bring it; a bare install may not
    r = subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert r.returncode == 0 and "MPI" in r.stdout, r.stderr[-2000:]


@pytest.mark.install
@pytest.mark.timeout(600)
@pytest.mark.parametrize("extra", EXTRAS_WITH_MPI4PY)
def test_a_fresh_install_of_the_extra_resolves_mpich_beside_mpi4py(tmp_path, extra):
    report = tmp_path / "report.json"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        + ["--report", str(report), f".[{extra}]"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(500),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    resolved = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    assert "mpi4py" in resolved, sorted(resolved)  # the extra names it: pip must resolve it
    assert "mpich" in resolved, f"pip would install mpi4py without mpich: {sorted(resolved)}"
