"""PyTorch's own distributed test suite through the "collectives" backend.

The tests of torch.testing._internal.distributed.distributed_test (DistributedTest.
_DistTestBase) that Gloo passes on this machine -- listed, by a script, in
tests/support/torch_suite/gloo_passes.txt -- run again with every process group made a "collectives"
group (tests/support/torch_suite/suite.py says how and why BACKEND stays "gloo"). Invariant: every
one of them passes here too, except EXCLUDED, each with its reason. Those in SHIMMED reach
this library only because suite.py lifts torch's Gloo-only gate in dist.monitored_barrier;
they pass on this library's monitored_barrier, and are counted apart in docs/torch_backend.md.

Marked slow: 90 tests x 3 forked ranks, about a minute or two on 2 cores
(`make test-torch-suite` runs this file alone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing's own dependency (the `test` extra)

HERE = Path(__file__).resolve().parents[1]  # tests/
SUITE = HERE / "support" / "torch_suite" / "suite.py"
LIST = HERE / "support" / "torch_suite" / "gloo_passes.txt"

EXCLUDED = {
    "test_get_backend": "asserts dist.get_backend() == BACKEND, i.e. 'gloo'; a collectives "
    "group says 'collectives', as it must (the suite keeps BACKEND=gloo "
    "so as to run Gloo's selection and branches)",
}
SHIMMED = {"test_monitored_barrier_gloo", "test_monitored_barrier_gloo_subgroup"}


def gloo_passes() -> tuple[list[str], str]:
    lines = LIST.read_text().splitlines()
    header = " ".join(line[2:] for line in lines if line.startswith("#"))
    return [line for line in lines if line and not line.startswith("#")], header


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_test_gloo_passes_passes_through_collectives(tmp_path):
    names, header = gloo_passes()
    assert f"torch {torch.__version__}" in header, (
        f"{LIST.name} was made with another torch ({header}); run "
        "tests/support/torch_suite/list_gloo_passes.py"
    )
    assert len(names) >= 80 and set(EXCLUDED) | SHIMMED <= set(names)
    out = tmp_path / "collectives.json"
    env = dict(
        os.environ,
        COLLECTIVES_SUITE="collectives",
        BACKEND="gloo",
        WORLD_SIZE="3",
        TEMP_DIR=str(tmp_path),
        PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, str(SUITE), "--json", str(out), *names],
        env=env,
        cwd=HERE.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0 and out.exists(), proc.stdout[-4000:]
    outcomes = json.loads(out.read_text())
    missing = [n for n in names if n not in outcomes]
    not_passed = {n: v for n, v in outcomes.items() if v[0] != "passed" and n not in EXCLUDED}
    assert not missing, f"no outcome for {missing}"
    assert not not_passed, "Gloo passes these, collectives does not:\n" + "\n".join(
        f"--- {n}: {v[0]}\n{v[1][-1500:]}" for n, v in not_passed.items()
    )
    passed = [n for n in names if outcomes[n][0] == "passed"]
    print(
        f"{len(passed)} of the {len(names)} tests Gloo passes pass through collectives "
        f"({len(SHIMMED)} of them through the monitored_barrier shim); excluded: "
        f"{', '.join(EXCLUDED)}"
    )
