"""Two test hosts in network namespaces (tests/support/netns.py), cut apart mid-all_reduce with
`ip link set DEV down`. Host A runs the coordinator and ranks 0 and 1, host B runs rank 2.
After the cut, ranks 0 and 1 declare rank 2 dead (no heartbeats), reconstruct and go on with
correct sums; rank 2, cut off from everyone, gets errors (never a hang) and ends by itself.
Every namespace and process the test made is removed, whatever happens.
"""

import os
import shutil
import time

import pytest

from support.cluster import Cluster
from support.netns import Hosts, Refused, ip
from support.timing import scaled

# root, network namespaces, tc, nsenter: under CI=true a skip is a failure (conftest.py)
pytestmark = pytest.mark.ci_must_run

NET = 77
A_IP, B_IP = f"169.254.{NET}.1", f"169.254.{NET}.2"  # link-local, our own namespaces only


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make network namespaces")
    try:
        with Hosts(2, NET) as h:
            yield {"a": h.names[0], "b": h.names[1], "dev_b": h.devs[1]}
    except Refused as exc:
        pytest.skip(str(exc))


@pytest.mark.timeout(90)
def test_partition_mid_all_reduce(two_hosts, tmp_path, monkeypatch):
    # two network namespaces are two hosts: the job needs its secret (docs/security.md)
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET", "partition-test-secret-0123456789")
    in_a = ["ip", "netns", "exec", two_hosts["a"]]
    in_b = ["ip", "netns", "exec", two_hosts["b"]]
    c = Cluster(
        3,
        tmp_path,
        host=A_IP,
        heartbeat_timeout=scaled(1.0),
        coordinator_prefix=in_a,
        worker_args=[
            *("--seconds", f"{scaled(25):g}", "--count", "65536"),
            *("--timeout", f"{scaled(3):g}"),
        ],
    )
    try:
        c.spawn("w0", 0, prefix=in_a)
        c.spawn("w1", 1, prefix=in_a)
        # The cut-off rank ends once its coordinator has been away longer than its grace
        # (COLLECTIVES_COORDINATOR_GRACE, 3 heartbeat timeouts by default: a minute under
        # load); a grace of a few seconds ends it by the same path, sooner. Its --seconds
        # outlast that: it must end by the grace, not by running out of time.
        c.spawn(
            "w2",
            2,
            prefix=in_b,
            env={"COLLECTIVES_COORDINATOR_GRACE": f"{scaled(3):g}"},
            args=["--seconds", f"{scaled(60):g}"],
        )
        c.wait_steps(["w0", "w1", "w2"], ws=3, timeout=30)
        cut = time.time()
        ip("-n", two_hosts["b"], "link", "set", two_hosts["dev_b"], "down")
        for name in ("w0", "w1"):
            c.wait_for(
                lambda e, n=name: (
                    e["proc"] == n
                    and e["t"] > cut
                    and (
                        (e["event"] == "failure" and e["failed"] == [2])
                        or (e["event"] == "step" and e["ws"] == 2)
                    )
                ),
                10,
                f"{name} noticing the cut",
            )
        steps = c.wait_steps(["w0", "w1"], ws=2, timeout=15, after=cut)
        assert all(s["ok"] for s in steps)
        # The cut-off rank fails loudly and in bounded time, naming what it waited on.
        err = c.wait_for(
            lambda e: (
                e["proc"] == "w2" and e["t"] > cut and e["event"] in ("error", "failure", "evicted")
            ),
            20,
            "an error on the cut-off rank",
        )
        assert any(w in err["error"] for w in ("timed out", "no answer", "removed")), err
        # ... and ends by itself: its coordinator away past the grace, every op would raise
        lost = c.wait_for(
            lambda e: (
                e["proc"] == "w2" and e["event"] == "error" and e["kind"] == "CoordinatorLost"
            ),
            40,
            "CoordinatorLost on the cut-off rank",
            ends=lambda e: e["proc"] == "w2" and e["event"] == "exit",
        )
        assert "COLLECTIVES_COORDINATOR_GRACE" in lost["error"], lost
        assert c.wait_for(lambda e: e["proc"] == "w2" and e["event"] == "exit", 10)["code"] == 5
    finally:
        c.close()
