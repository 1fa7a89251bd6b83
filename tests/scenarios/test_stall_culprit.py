"""The right worker is abandoned, every time: stalls whose slow links persist, with the culprit
at every rank (rank 0 included), run to the end of the job (tests/support/stall_runs.py says
how each run is started and what `check` asserts: exactly the culprit evicted, every survivor
dropped exactly one step, identical models, the final barrier passed).

The slow links persist into every generation (injected faults that follow the processes, or
tc in network namespaces), so an eviction of a healthy rank would leave a slow link inside
the new group: a second stall, and a failed check. Where the stalled op shows only one slow
link (a tree's reduce waits on one, its broadcast's never gets going), the ends tie and the
coordinator has the ranks probe their links (membership/probing.py) before it decides.

`make test` runs the cases marked `stall_core`; the whole matrix (`-m stall_matrix`) is
`make test-stall`, run by .ci/run.
"""

from __future__ import annotations

import os
import shutil

import pytest

from support.netns import Hosts, Refused
from support.stall_runs import PATTERNS, RUNS, SIZES, check, delays, run_netns

# root, network namespaces, tc, nsenter: under CI=true a skip is a failure (conftest.py)
pytestmark = pytest.mark.ci_must_run

CORE = pytest.mark.stall_core
MATRIX = pytest.mark.stall_matrix
NET = 79


def case(n, culprit, pattern, size, how, *marks):
    return pytest.param(
        n,
        culprit,
        pattern,
        size,
        how,
        marks=list(marks) or [MATRIX],
        id=f"n{n}-culprit{culprit}-{pattern}-{size}-{how}",
    )


# Three workers: every culprit, both patterns, both ways of hosting the coordinator, each
# gradient size at least once per pattern.
CASES = [
    case(3, 0, "two_links", "tree", "hosted", CORE),  # the seed's failing run
    case(3, 0, "two_links", "direct", "standalone"),
    case(3, 1, "two_links", "ring", "hosted"),
    case(3, 1, "two_links", "tree", "standalone", CORE),
    case(3, 2, "two_links", "direct", "hosted"),
    case(3, 2, "two_links", "tree", "standalone"),
    case(3, 0, "whole_host", "ring", "standalone"),
    case(3, 0, "whole_host", "direct", "hosted"),
    case(3, 1, "whole_host", "tree", "hosted"),
    case(3, 2, "whole_host", "direct", "standalone", CORE),
    # four and five workers: the culprit at every rank
    *[
        case(
            4,
            c,
            "two_links",
            ("tree", "direct", "ring", "tree")[c],
            ("hosted", "standalone")[c % 2],
        )
        for c in range(4)
    ],
    *[
        case(
            5,
            c,
            "two_links",
            ("direct", "tree", "direct", "ring", "tree")[c],
            ("standalone", "hosted")[c % 2],
        )
        for c in range(5)
    ],
    case(5, 0, "whole_host", "tree", "launcher"),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,culprit,pattern,size,how", CASES)
def test_persistent_slow_links_evict_exactly_the_culprit(n, culprit, pattern, size, how, procs):
    faults = delays(PATTERNS[pattern](culprit, n))
    results = RUNS[how](procs, n, faults, SIZES[size])
    check(results, n, culprit, SIZES[size])


# --- real slow links: tc (htb + u32) in network namespaces ----------------------------------------
@pytest.fixture
def hosts4():
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "nsenter")):
        pytest.skip("needs root, iproute2 (ip, tc) and nsenter for network namespaces")
    try:
        with Hosts(4, NET) as h:
            yield h
    except Refused as exc:
        pytest.skip(str(exc))


NETNS = [
    pytest.param(0, "two_links", "tree", False, marks=CORE, id="culprit0-two_links-tree"),
    pytest.param(
        0, "two_links", "direct", True, marks=MATRIX, id="culprit0-two_links-direct-hosted"
    ),
    pytest.param(1, "two_links", "tree", False, marks=MATRIX, id="culprit1-two_links-tree"),
    pytest.param(2, "two_links", "direct", False, marks=MATRIX, id="culprit2-two_links-direct"),
    pytest.param(1, "whole_host", "tree", False, marks=MATRIX, id="culprit1-whole_host-tree"),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("culprit,pattern,size,hosted", NETNS)
def test_tc_slowed_links_evict_exactly_the_culprit(culprit, pattern, size, hosted, hosts4, procs):
    """Three workers on three namespace hosts, the coordinator on a fourth (or hosted by
    rank 0, its port spared); mid-run, tc slows the culprit's links to 8 kbit/s for good."""
    links = PATTERNS[pattern](culprit, 3)
    results = run_netns(procs, hosts4, 3, culprit, links, SIZES[size], hosted)
    check(results, 3, culprit, SIZES[size])
