"""python -m collectives.info: the report a user pastes into a bug report.

Invariants: it names the versions actually imported; each capability line is the result of
trying it here (this machine has CURVE, ipc and memfd shared memory, so each says yes); the
variables show the value in effect next to the default; a secret is never printed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import zmq

from collectives.info import shown_value


@pytest.mark.timeout(60)
def test_info_reports_versions_capabilities_and_settings():
    env = dict(os.environ, COLLECTIVES_TRANSPORT="ipc", COLLECTIVES_HEARTBEAT_TIMEOUT="7")
    p = subprocess.run(
        [sys.executable, "-m", "collectives.info"],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"numpy        {np.__version__}" in out and f"libzmq       {zmq.zmq_version()}" in out
    assert "CURVE          yes" in out
    assert "ipc sockets    yes" in out
    assert "shared memory  yes" in out
    assert "lo           127.0.0.1" in out and "would bind:  127.0.0.1" in out
    assert "COLLECTIVES_TRANSPORT            ipc | auto" in out
    assert "COLLECTIVES_HEARTBEAT_TIMEOUT    7 | 5" in out
    assert "direct up to 1048576 B per rank at 2 ranks" in out


@pytest.mark.timeout(10)
def test_a_secret_is_never_shown():
    assert shown_value("COLLECTIVES_JOB_SECRET", "hunter2") == "(set, not shown)"
    assert shown_value("COLLECTIVES_TRANSPORT", "ipc") == "ipc"
    assert shown_value("COLLECTIVES_TRANSPORT", None) == "(unset)"
