"""The stalled-allreduce scenario (`make demo-stall`), run to the end of the job.

n workers run tests/support/stall_worker.py: a plain all_reduce(AVG) loop that reconstructs and
drops the step on a CollectiveError. Two links around one worker (the culprit) are slowed for
good with the library's own fault injection, following the processes into every generation
(tests/support/stall_runs.py), so the first all_reduce stalls; the culprit must be evicted and
the survivors must form a new generation and train to the last step without another stall.

Invariants checked on every run (stall_runs.check):
  * the culprit, and only it, is evicted; every survivor exits 0 after the final barrier;
  * every survivor dropped exactly one step, the same one, and counted exactly one error,
    a PeerTimeout on every survivor (the same event raises the same type everywhere);
  * every survivor ends with the same model (sha256), and that model is the one the steps
    imply: sum over kept steps s of -0.01 * mean over that step's members of gradient(s, r).
The culprit at every rank, other patterns and sizes, and real slow links (tc) are in
tests/scenarios/test_stall_culprit.py.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from support.procs import ROOT, clean_env
from support.stall_runs import check, delays, run_hosted, run_launcher, two_links, via_rank0
from support.timing import scaled


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "n,culprit,how",
    [
        (3, 1, "bare"),  # the seed's own run
        (4, 2, "bare"),  # the culprit in the middle of the ring
        (5, 4, "bare"),  # the culprit at the end
        (4, 0, "launcher"),  # rank 0 itself, the coordinator hosted by the launcher
        (5, 2, "launcher"),
    ],
)
def test_survivors_stay_in_step_to_the_last_op(n, culprit, how, procs):
    run = run_hosted if how == "bare" else run_launcher
    check(run(procs, n, delays(two_links(culprit, n))), n, culprit)


@pytest.mark.timeout(120)
def test_survivors_stay_in_step_on_a_crowded_host(procs):
    """The crowded schedules (every rank pinned to one CPU): all_reduce through rank 0 and the
    star commit. The culprit's links to and from rank 0 are slowed: rank 0 waits on it, the
    others wait on rank 0, and the culprit -- not rank 0 -- is evicted; the survivors go on
    in step to the last op. (A slow link into rank 0 may be the one stalled link there is to
    see; its two ends tie, and the probes of every link find the culprit.)"""
    results = run_hosted(
        procs, 4, delays(via_rank0(2, 4)), COLLECTIVES_CROWDED="auto", TEST_ONE_CPU="1"
    )
    check(results, 4, 2, crowded=True)


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "culprit",
    [
        pytest.param(0, marks=pytest.mark.stall_core),  # rank 0: its ends tie in the op
        pytest.param(1, marks=pytest.mark.stall_matrix),  # the default
        pytest.param(2, marks=pytest.mark.stall_matrix),
    ],
)
def test_demo_stall_trains_to_the_end_with_two_identical_survivors(culprit, procs):
    """`make demo-stall CULPRIT=c`'s command: the digits example, the links around launch
    rank c slowed at step 40 for good; exactly c is evicted, and the evidence is printed."""
    left, right = (culprit - 1) % 3, (culprit + 1) % 3
    procs.spawn(
        "demo",
        [
            sys.executable,
            "-m",
            "collectives.launch",
            "--nproc",
            3,
            "--timeout",
            int(scaled(120)),
            os.path.join(ROOT, "examples", "train_digits.py"),
            "--slow-links-around",
            culprit,
            "--slow-at-step",
            40,
            "--timeout",
            f"{scaled(3):g}",
            "--leave-when-evicted",
            "--no-progress",
        ],
        clean_env(),
    )
    res = procs.wait("demo", timeout=140)[0]
    log = res.output
    assert res.code == 0, log[-3000:]
    # one line per event
    assert f"[rank {culprit}] [train_digits] step 40: link {left}->{culprit} slowed" in log, log[
        -3000:
    ]
    assert f"[rank {right}] [train_digits] step 40: link {culprit}->{right} slowed" in log, log[
        -3000:
    ]
    evicted = re.search(
        rf"\[rank {culprit}\] \[train_digits\] launch rank {culprit} evicted, "
        rf"leaving the job: .*rank {culprit} is on the (stalled|slow) link\(s\) "
        rf"(.*?); this rank was evicted",
        log,
    )
    assert evicted, log[-3000:]
    # the evidence: both slowed links, found in the op or by the probes
    assert f"{left}->{culprit}" in evicted.group(2) and f"{culprit}->{right}" in evicted.group(2), (
        evicted.group(0)
    )
    survivors = sorted({str(r) for r in range(3)} - {str(culprit)})
    dropped = re.findall(
        r"\[rank (\d)\] \[collectives\] rank \d of generation 0: iteration "
        r"(\d+) dropped",
        log,
    )
    assert sorted(r for r, _ in dropped) == survivors and len({i for _, i in dropped}) == 1, log
    assert re.search(rf"group change gen 0 -> \d+: left \(old ranks\) \[{culprit}\]", log), log[
        -3000:
    ]
    finals = re.findall(
        r"final rank=(\d) world_size=(\d) generation=\d+ step=(\d+) "
        r"test_acc=([\d.]+) params_sha256=(\w+)",
        log,
    )
    assert len(finals) == 2, log[-3000:]
    assert {f[1] for f in finals} == {"2"} and len({f[4] for f in finals}) == 1, finals
    assert all(float(f[3]) >= 0.95 for f in finals), finals
