"""membership/ reads one clock (membership/clock.py): its shells take a Clock, its machines
take time from their events. Found on the syntax tree: a call of time.monotonic, time.time or
time.perf_counter (or of one imported by name from time) anywhere else is a second clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

MEMBERSHIP = Path(__file__).resolve().parents[3] / "collectives" / "membership"
READS = {"monotonic", "time", "perf_counter", "monotonic_ns", "time_ns", "perf_counter_ns"}
THE_CLOCK = "clock.py"


def clock_reads(tree: ast.AST) -> list[int]:
    """Lines that read the system's clock: time.X(), or X() after `from time import X`."""
    named = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "time"
        for alias in node.names
        if alias.name in READS
    }
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr in READS
            and isinstance(f.value, ast.Name)
            and f.value.id == "time"
        ) or (isinstance(f, ast.Name) and f.id in named):
            lines.append(node.lineno)
    return lines


def test_the_finder_sees_both_spellings():
    src = (
        "import time\nfrom time import monotonic as m\na = time.time()\nb = m()\nc = clock.time()\n"
    )
    assert clock_reads(ast.parse(src)) == [3, 4]


def test_membership_reads_the_clock_only_through_clock_py():
    found = [
        f"membership/{path.name}:{line}"
        for path in sorted(MEMBERSHIP.rglob("*.py"))
        if path.name != THE_CLOCK
        for line in clock_reads(ast.parse(path.read_text()))
    ]
    assert found == [], "read the injected clock (membership/clock.py):\n" + "\n".join(found)
