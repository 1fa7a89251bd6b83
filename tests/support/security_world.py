"""Real-process helpers of the security tests (tests/test_security.py, tests/scenarios/security/):
a 2..n rank world of tests/security_worker.py whose rank 0 hosts the coordinator on a port it
binds itself (MASTER_PORT=0) and prints; every process is killed and reaped at close().
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from .timing import scaled

TESTS = Path(__file__).resolve().parent.parent
# the worker, wherever the test layout keeps it
WORKER = str(
    next(
        (
            p
            for p in (TESTS / "support" / "security_worker.py", TESTS / "security_worker.py")
            if p.exists()
        ),
        TESTS / "security_worker.py",
    )
)
PY = sys.executable
SECRET = "security-test-secret-0123456789abcdef"
OTHER_SECRET = "another-jobs-secret-0123456789abcdef"


# --- processes ----------------------------------------------------------------------------------
def base_env(**extra) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("COLLECTIVES_")
        and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(TESTS.parent) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Procs:
    """Processes of one test: stdout and stderr to files; close() kills and reaps them all."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name, argv, env) -> subprocess.Popen:
        with open(self.tmp / f"{name}.out", "w") as out, open(self.tmp / f"{name}.err", "w") as err:
            p = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = p
        return p

    def err(self, name) -> str:
        return (self.tmp / f"{name}.err").read_text(errors="replace")

    def wait_line(self, name, pattern, timeout) -> re.Match:
        """The first match of `pattern` in `name`'s stderr within `timeout` s (scaled:
        timing.py)."""
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.err(name))
            if m:
                return m
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{name} did not print {pattern!r} in {timeout} s; its stderr:\n"
            f"{self.err(name)[-3000:]}"
        )

    def wait(self, name, timeout) -> int:
        """`name`'s exit status, once it ended within `timeout` s (scaled: timing.py)."""
        timeout = scaled(timeout)
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{name} still runs after {timeout} s; its stderr:\n{self.err(name)[-3000:]}"
            ) from None

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass


def wait_json(path: Path, timeout=60, procs=None, name=None) -> dict:
    """The JSON object in `path`, once it appeared within `timeout` s (scaled: timing.py)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if procs is not None and procs.procs[name].poll() is not None and not path.exists():
            break
        time.sleep(0.05)
    detail = procs.err(name)[-3000:] if procs is not None else ""
    raise AssertionError(f"{path} did not appear in {timeout} s\n{detail}")


def start_world(procs, tmp, n, scenario, env, timeout=60) -> int:
    """n ranks of `scenario`; rank 0 hosts the coordinator on a port it binds itself
    (MASTER_PORT=0) and prints; the others are started with that port. Returns it."""
    procs.start(
        "rank0",
        [PY, WORKER, scenario, str(tmp)],
        dict(env, RANK="0", WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT="0"),
    )
    port = int(procs.wait_line("rank0", r"hosts the coordinator at [\d.]+:(\d+)", timeout)[1])
    for r in range(1, n):
        procs.start(
            f"rank{r}",
            [PY, WORKER, scenario, str(tmp)],
            dict(
                env, RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
            ),
        )
    return port


def finish(procs, tmp, n, timeout=90) -> list[dict]:
    """Every rank's report, after it exited 0 with every result exact."""
    reports = []
    for r in range(n):
        rc = procs.wait(f"rank{r}", timeout)
        rep = wait_json(tmp / f"rank{r}.json", 5, procs, f"rank{r}")
        assert rc == 0 and rep["ok"], (r, rc, rep, procs.err(f"rank{r}")[-3000:])
        want = n * (n + 1) // 2
        assert all(v == want for v in rep["results"]), (r, rep["results"])
        reports.append(rep)
    return reports


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")
