"""`collectives.launch --elastic --max-restarts K`: a worker that dies does not end the job;
the others reconstruct without it and the launcher starts a replacement that joins, so the
world size returns to N and the job exits 0."""

import json
import os
import sys

import pytest

from support.procs import clean_env
from support.timing import heartbeats

WORKER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "fault_worker.py"
)


@pytest.mark.timeout(90)
def test_elastic_launch_replaces_a_killed_worker(procs):
    env = clean_env(
        COLLECTIVES_FAULTS="kill:1@op=20",
        **heartbeats(0.2, 1.0),
    )
    procs.spawn(
        "launch",
        [
            sys.executable,
            "-m",
            "collectives.launch",
            "--nproc",
            "3",
            "--elastic",
            "--max-restarts",
            "1",
            "--timeout",
            "80",
            WORKER,
            "--seconds",
            "12",
        ],
        env,
    )
    (p,) = procs.wait("launch", timeout=85)
    out = p.output
    assert p.code == 0, out[-3000:]
    assert (
        "rank 1 failed (signal SIGKILL); the others go on without it; starting a replacement" in out
    ), out[-3000:]
    events = [
        (line.split("] ", 1)[0] + "]", json.loads(line.split("] ", 1)[1]))
        for line in p.out.splitlines()
        if line.startswith("[") and '{"event"' in line
    ]
    # after rank 1's death the replacement joined, and the group was back to 3 ranks
    joined = [e for who, e in events if who == "[join 1]" and e["event"] == "joined"]
    assert joined and joined[0]["ws"] == 3 and joined[0]["joiner"], out[-3000:]
    full = [e for who, e in events if who == "[join 1]" and e["event"] == "step" and e["ws"] == 3]
    assert full and all(e["ok"] for e in full), out[-3000:]
    # every worker that stayed to the end summed right at every step it reported
    steps = [e for _, e in events if e["event"] == "step"]
    assert steps and all(e["ok"] for e in steps), [e for e in steps if not e["ok"]][:3]


@pytest.mark.timeout(60)
def test_non_elastic_launch_ends_the_job_when_a_worker_dies(procs):
    env = clean_env(COLLECTIVES_FAULTS="kill:1@op=5")
    procs.spawn(
        "launch",
        [
            sys.executable,
            "-m",
            "collectives.launch",
            "--nproc",
            "2",
            "--grace",
            "2",
            "--timeout",
            "50",
            WORKER,
            "--seconds",
            "30",
        ],
        env,
    )
    (p,) = procs.wait("launch", timeout=55)
    assert p.code == 128 + 9, p.err[-2000:]
    assert "rank 1 failed (signal SIGKILL); ending the other workers" in p.err
