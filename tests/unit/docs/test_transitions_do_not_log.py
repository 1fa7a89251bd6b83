"""The coordinator's transitions say what happened as Note effects, never through a logger:
a machine without I/O writes no log line, so a simulator or a test sees every note as data
and the shell (membership/server.py) alone decides what reaches the log and `events`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

MEMBERSHIP = Path(__file__).resolve().parents[3] / "collectives" / "membership"
# the modules of the coordinator's machine (machine.py names them): its transitions and the
# pure judgements they call
MACHINE = (
    "machine.py changes.py formation.py regroup.py verdicts.py probing.py recovery.py "
    "tables.py diagnose.py evidence.py failslow.py reroute.py state.py"
).split()


def logging_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "logging" for a in node.names):
            found.append(f"{path.name}:{node.lineno}: import logging")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("log", "logging", "logger")
        ):
            found.append(f"{path.name}:{node.lineno}: {node.func.value.id}.{node.func.attr}")
    return found


def test_the_coordinators_transitions_never_log():
    found = [line for name in MACHINE for line in logging_calls(MEMBERSHIP / name)]
    assert found == [], "a transition logs instead of returning a Note: " + "; ".join(found)


def test_the_check_finds_a_logging_call(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import logging\nlog = logging.getLogger('x')\ndef f():\n    log.info('x')\n")
    assert logging_calls(bad) == [
        "bad.py:1: import logging",
        "bad.py:2: logging.getLogger",
        "bad.py:4: log.info",
    ]
