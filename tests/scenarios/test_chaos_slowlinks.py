"""`bench chaos --hosts` in miniature: 4 workers on network-namespace hosts, one pair of them
held slow by tc for good (the slowlink fault), a short run. The job must route around the pair
(steps reported on a rerouted schedule) and end with every survivor's parameters identical.
The 10-minute runs with every fault kind are in bench/results/chaos/. `make test-failslow` runs
it; a machine without namespaces skips (and under CI=true that skip fails: ci_must_run).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bench.stress import chaos
from support.netns import Hosts, Refused

pytestmark = [pytest.mark.ci_must_run, pytest.mark.failslow_matrix]


def _namespaces_or_skip():
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "nsenter")):
        pytest.skip("needs root, iproute2 (ip, tc) and nsenter for network namespaces")
    try:
        with Hosts(1, chaos.NET, tag="cp"):
            pass
    except Refused as exc:  # pragma: no cover - a kernel without namespaces
        pytest.skip(str(exc))


@pytest.mark.timeout(240)
def test_a_pair_held_slow_is_routed_around_and_the_survivors_agree(tmp_path):
    _namespaces_or_skip()
    out = tmp_path / "chaos"
    argv = ["--hosts", "--nproc", "4", "--minutes", "0.4", "--every", "3"]
    argv += ["--kinds", "slowlink", "--slow-pairs", "1", "--count", "262144"]
    code = chaos.main([*argv, "--seed", "3", "--out", str(out)])
    record = json.loads(out.with_suffix(".json").read_text())
    assert code == 0, out.with_suffix(".txt").read_text()
    assert record["faults"]["slowlink"]["count"] == 1
    assert len(record["slow_pairs"]) == 1
    assert record["identical_params"] and record["finals"] == 4
    # the coordinator flagged the pair and every rank ran the schedule around it
    assert record["rerouted_reports"] > 0, out.with_suffix(".txt").read_text()
    assert record["schedules"], record
