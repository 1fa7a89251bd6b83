"""The stall matrix's instrument (bench/studies/stallmatrix.py, `python -m bench stallmatrix`)
in miniature, so that it keeps working between the lead's full runs.

Invariants:
- one run of one case beside 2 CPU burners reaches a verdict and records it: who was evicted,
  the coordinator's judgement with its stalled links and what decided, the seconds from the
  slowdown to the first rank's error, the run's wall time; the table names the case; the
  burners burned (CPU seconds each) and are gone afterwards, and so is every namespace the
  harness made;
- a harness stopped by SIGTERM in the middle of a run leaves no burner and no namespace, and
  says in its record that it was interrupted.

Whether the verdict was right is the matrix's figure, not this test's: the judgement is
tested in test_stall_culprit.py. Marker `stall_bench`: `make test-stall` runs it alone, after
the matrix (its burners would starve a neighbour's deadlines); `make test` does not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

import pytest

from support.netns import ip, remove
from support.timing import scaled

pytestmark = [pytest.mark.ci_must_run, pytest.mark.stall_bench]

NET, TAG = 91, "sm"  # bench/studies/stallmatrix.py's
CASE = "c1-whole_host-small"
# a burner's own deadline (s), in its command line: this test's burners alone have it, so that
# the teardown finds those a broken harness left behind
BURN_S = f"{600 + (os.getpid() % 1000) / 1000:.3f}"


@pytest.fixture
def leftovers():
    """After the test, whatever a broken harness left: the burners it started (by their
    command line) and the namespaces of the harness's pids."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        for ns in namespaces_of(pid):
            remove(ns)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and burning(int(entry)):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass  # gone meanwhile


@pytest.fixture
def netns_tools():
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "nsenter")):
        pytest.skip("needs root, iproute2 (ip, tc) and nsenter for network namespaces")


def harness(procs, tmp_path, *args: str):
    """`python -m bench stallmatrix` as process "bench", its results under tmp_path; the
    job's deadlines grown with the machine's load as every test's are."""
    return procs.spawn(
        "bench",
        [
            sys.executable,
            "-m",
            "bench",
            "stallmatrix",
            "--cases",
            CASE,
            "--burners",
            "2",
            "--out",
            tmp_path,
            "--name",
            "mini",
            "--op-timeout",
            f"{scaled(3.0):g}",
            "--heartbeat-timeout",
            f"{scaled(2.0):g}",
            "--burner-seconds",
            BURN_S,
            *args,
        ],
        None,
        merge_stderr=True,
    )


def namespaces_of(pid: int) -> list[str]:
    """Those of the namespaces a harness of this pid names its hosts by (tests/support/netns.py:
    4 hosts and a switch) that exist."""
    pid %= 100000
    planned = {f"{TAG}h{i}_{NET}_{pid}" for i in range(4)} | {f"{TAG}sw{NET}_{pid}"}
    listed = ip("netns", "list", check=False).stdout.splitlines()
    return sorted({line.split()[0] for line in listed if line.strip()} & planned)


def burning(pid: int) -> bool:
    """Process `pid` is one of this test's burners (not gone, nor a new process by that pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f"time.monotonic() + {BURN_S}\n".encode() in f.read()
    except OSError:
        return False


@pytest.mark.timeout(300)
def test_one_run_beside_two_burners_is_recorded_and_cleaned_up(
    netns_tools, procs, tmp_path, leftovers
):
    p = harness(procs, tmp_path, "--runs", "1")
    leftovers.append(p.pid)
    res = procs.wait("bench", timeout=240)[0]
    assert res.code == 0, res.output[-3000:]
    record = json.loads((tmp_path / "mini.json").read_text())
    assert [r["case"] for r in record["runs"]] == [CASE], res.output[-3000:]
    run = record["runs"][0]
    assert run["outcome"] in ("right", "wrong"), run  # a verdict, not a broken run
    assert run["evicted"], run
    judged = run["judged"][0]
    # the links held bad are the verdict's evidence either way; "stalled" (proven by the op's
    # own pictures) is empty where probes decided on links the pictures left unproven
    assert judged["decided_by"] and judged["bad"] and judged["culprits"], judged
    assert judged["stalled"] or judged["decided_by"] == "probes", judged
    assert 0 < run["verdict_s"] < run["wall_s"], run
    assert sorted(run["entered_s"]) == ["0", "1", "2"], run  # each rank's stalled op, timed
    assert len(record["burner_pids"]) == 2
    assert all(s is not None and s > 1.0 for s in record["burner_cpu_s"]), record
    assert not any(burning(pid) for pid in record["burner_pids"])
    assert namespaces_of(p.pid) == []
    table = (tmp_path / "mini.txt").read_text()
    assert any(line.startswith(CASE) and " 1/1 " in f" {line} " for line in table.splitlines())


@pytest.mark.timeout(300)
def test_sigterm_mid_run_leaves_no_burner_and_no_namespace(netns_tools, procs, tmp_path, leftovers):
    p = harness(procs, tmp_path, "--runs", "5")
    leftovers.append(p.pid)
    # mid-run: the coordinator or a worker runs inside one of the harness's namespaces
    deadline = time.monotonic() + scaled(60)
    inside: list[str] = []
    while not inside:
        assert time.monotonic() < deadline, "the harness made no namespace with a process in it"
        assert p.poll() is None, procs.text("bench")
        inside = [
            ns for ns in namespaces_of(p.pid) if ip("netns", "pids", ns, check=False).stdout.strip()
        ]
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    res = procs.wait("bench", timeout=60)[0]
    assert res.code == 130, res.output[-3000:]
    record = json.loads((tmp_path / "mini.json").read_text())
    assert record["interrupted"] is True
    assert len(record["burner_pids"]) == 2
    assert not any(burning(pid) for pid in record["burner_pids"])
    assert namespaces_of(p.pid) == []
