"""`collectives.launch --elastic --max-restarts K`: a worker that dies does not end the job;
the others reconstruct without it and the launcher starts a replacement that joins, so the
world size returns to N and the job exits 0."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)


@pytest.mark.timeout(90)
def test_elastic_launch_replaces_a_killed_worker():
    env = dict(os.environ, COLLECTIVES_FAULTS="kill:1@op=20", COLLECTIVES_HEARTBEAT_TIMEOUT="1",
               COLLECTIVES_HEARTBEAT_INTERVAL="0.2", PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "collectives.launch", "--nproc", "3", "--elastic",
                        "--max-restarts", "1", "--timeout", "80",
                        os.path.join(HERE, "fault_worker.py"), "--seconds", "12"],
                       capture_output=True, text=True, timeout=85, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "rank 1 failed (signal SIGKILL); the others go on without it; starting a " \
           "replacement" in out, out[-3000:]
    events = [(line.split("] ", 1)[0] + "]", json.loads(line.split("] ", 1)[1]))
              for line in p.stdout.splitlines() if line.startswith("[") and '{"event"' in line]
    # after rank 1's death the replacement joined, and the group was back to 3 ranks
    joined = [e for who, e in events if who == "[join 1]" and e["event"] == "joined"]
    assert joined and joined[0]["ws"] == 3 and joined[0]["joiner"], out[-3000:]
    full = [e for who, e in events if who == "[join 1]" and e["event"] == "step" and e["ws"] == 3]
    assert full and all(e["ok"] for e in full), out[-3000:]

@pytest.mark.timeout(60)
def test_non_elastic_launch_ends_the_job_when_a_worker_dies():
    env = dict(os.environ, COLLECTIVES_FAULTS="kill:1@op=5", PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "collectives.launch", "--nproc", "2", "--grace",
                        "2", "--timeout", "50", os.path.join(HERE, "fault_worker.py"),
                        "--seconds", "30"], capture_output=True, text=True, timeout=55, env=env)
    assert p.returncode == 128 + 9, p.stderr[-2000:]
    assert "rank 1 failed (signal SIGKILL); ending the other workers" in p.stderr
