"""COLLECTIVES_DEBUG, like NCCL_DEBUG.

Invariants: unset, the library prints nothing; INFO names the transport chosen per peer, the
algorithm chosen per op kind and size once each (two identical all_reduces: one line), and
the group's formation with its timing; TRACE adds one line per message sent and taken; any
other value is refused with an error naming the variable."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support.procs import clean_env

JOB = r"""
import numpy as np, collectives as cl
pg = cl.init_process_group()
x = np.ones(4, np.float32)
pg.all_reduce(x); pg.all_reduce(x); pg.barrier(); pg.destroy()
print("ok", flush=True)
"""


def run(procs, tmp_path, level):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = clean_env()
    env.pop("COLLECTIVES_DEBUG", None)
    if level is not None:
        env["COLLECTIVES_DEBUG"] = level
    procs.spawn(
        "launch",
        [sys.executable, "-m", "collectives.launch", "--nproc", 2, "--timeout", 50, script],
        env,
    )
    res = procs.wait("launch", timeout=60)[0]
    assert res.code == 0, res.err[-2000:]
    return res.err


@pytest.mark.timeout(70)
def test_quiet_by_default(procs, tmp_path):
    assert "collectives[" not in run(procs, tmp_path, None)


@pytest.mark.timeout(70)
def test_info_names_transport_algorithm_and_formation_once_each(procs, tmp_path):
    err = run(procs, tmp_path, "info")
    mine = [line for line in err.splitlines() if line.startswith("[rank 0]")]
    assert any(
        re.search(r"INFO rank 0 of generation 0 -> rank 1: (shm|ipc|tcp) \(", line) for line in mine
    ), err[-2000:]
    picked = [line for line in mine if "all_reduce of 4 x <f4 -> direct" in line]
    assert len(picked) == 1, mine  # two all_reduces of one kind and size: one line
    assert any(re.search(r"generation 0 formed in [\d.]+ s", line) for line in mine)
    assert "TRACE" not in err


@pytest.mark.timeout(70)
def test_trace_adds_every_message(procs, tmp_path):
    err = run(procs, tmp_path, "TRACE")
    sent = re.findall(r"\[rank 0\] .* TRACE rank 0 -> rank 1: all_reduce op #(\d)", err)
    taken = re.findall(r"\[rank 0\] .* TRACE rank 0 <- rank 1: all_reduce op #(\d)", err)
    assert sorted(set(sent)) == ["0", "1"] and sorted(set(taken)) == ["0", "1"], err[-2000:]


@pytest.mark.timeout(30)
def test_a_bad_level_is_refused_naming_the_variable():
    p = subprocess.run(
        [sys.executable, "-c", "import collectives"],
        capture_output=True,
        text=True,
        timeout=25,
        env=dict(os.environ, COLLECTIVES_DEBUG="LOUD"),
    )
    assert (
        p.returncode != 0 and "COLLECTIVES_DEBUG='LOUD' is not one of WARN, INFO, TRACE" in p.stderr
    )
