"""A job half secure, half insecure fails at once, saying which.

Invariant: a rank that runs with COLLECTIVES_INSECURE=1 against a coordinator that demands the
job's keys -- or a keyed rank against an insecure coordinator -- stops within seconds with a
CollectiveError that names the mismatch (and how to mend it), not with "got no answer ... is
MASTER_ADDR/MASTER_PORT right?" at its timeout.
"""

from __future__ import annotations

import time

import pytest

from support.security_world import PY, SECRET, WORKER, Procs, base_env, wait_json
from support.timing import scaled


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "coordinator,rank,says",
    [
        ("secure", "insecure", "requires authentication"),
        ("insecure", "secure", "runs without authentication"),
    ],
)
def test_a_rank_that_runs_the_other_way_gets_a_clear_error(
    procs, tmp_path, coordinator, rank, says
):
    ways = {"secure": {"COLLECTIVES_JOB_SECRET": SECRET}, "insecure": {"COLLECTIVES_INSECURE": "1"}}
    world = dict(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", TEST_TIMEOUT=f"{scaled(30):g}")
    procs.start(
        "rank0",
        [PY, WORKER, "sum", str(tmp_path)],
        base_env(**ways[coordinator], **world, RANK="0", MASTER_PORT="0"),
    )
    port = int(procs.wait_line("rank0", r"hosts the coordinator at [\d.]+:(\d+)", 60)[1])
    t0 = time.monotonic()
    procs.start(
        "rank1",
        [PY, WORKER, "sum", str(tmp_path)],
        base_env(**ways[rank], **world, RANK="1", MASTER_PORT=str(port)),
    )
    procs.wait("rank1", 60)
    took = time.monotonic() - t0
    error = wait_json(tmp_path / "rank1.json", 5)["error"]
    assert error.startswith("CollectiveError") and says in error, error
    assert "COLLECTIVES_INSECURE=1 on every process" in error, error
    assert took < scaled(20), f"{took:.1f} s to say so (the join's timeout is {scaled(30):g} s)"
