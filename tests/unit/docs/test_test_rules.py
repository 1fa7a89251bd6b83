"""The timing rules of tests/README.md ("Rules every test follows"), checked by reading the tests.

Invariants, over every Python file under tests/ (support/timing.py, which defines the scale,
and this file aside):
- no fixed sleep stands in for an event: a `time.sleep(...)` outside a `while` loop (a poll
  until a condition or a deadline is fine) carries a comment `not a wait: <why>` on its line
  -- a fault's length, a process's pace, a window in which something must NOT happen;
- no wall-clock upper bound is unscaled: a comparison that bounds a duration (`took`,
  `elapsed`, `time.monotonic() - t0`, an event's ["t"], a report's "..._s") from above by a
  plain number, or by something plus a plain number, goes through timing.scaled() or
  timing.bound() instead (a lower bound may stay plain: load only makes a wait longer).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support.procs import ROOT

pytestmark = pytest.mark.fast  # in-process, reads files only: part of `make test-fast`

TESTS = ROOT / "tests"
EXEMPT = {TESTS / "support" / "timing.py", Path(__file__).resolve()}
NOT_A_WAIT = "not a wait:"
# what the text of a duration looks like in these tests
DURATION_WORDS = (
    "took",
    "elapsed",
    "monotonic()",
    "time.time()",
    "perf_counter()",
    "waited",
    "duration",
    "latency",
    "['t']",
    "['s']",
    "_s']",
)


def _files() -> list[Path]:
    files = [p for p in sorted(TESTS.rglob("*.py")) if p.resolve() not in EXEMPT]
    assert len(files) > 50, "the tests were not found"
    return files


def _plain_number(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _plain_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _plain_number(node.left) and _plain_number(node.right)
    return False


def _unscaled(node: ast.AST) -> bool:
    """A plain number, or something plus or minus one (a slack that load would outgrow)."""
    if _plain_number(node):
        return True
    return isinstance(node, ast.BinOp) and (
        isinstance(node.op, (ast.Add, ast.Sub))
        and (_plain_number(node.left) or _plain_number(node.right))
    )


def _duration(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return not _plain_number(node) and any(w in text for w in DURATION_WORDS)


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _in_poll_loop(node: ast.AST, parents) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.While):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
    return False


def fixed_sleeps(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line: text` of each sleep outside a poll loop without its `not a wait:` note."""
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines()
    tree = ast.parse(src)
    parents = _parents(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) in ("time.sleep", "sleep")):
            continue
        if _in_poll_loop(node, parents):
            continue
        around = " ".join(lines[node.lineno - 2 : node.end_lineno])  # the line above too
        if NOT_A_WAIT not in around:
            found.append(
                f"{path.relative_to(root)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
            )
    return found


def unscaled_bounds(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line: text` of each duration bounded from above by a plain number."""
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines()
    found = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for left, op, right in zip(sides, node.ops, sides[1:]):
            below = isinstance(op, (ast.Lt, ast.LtE)) and _duration(left) and _unscaled(right)
            above = isinstance(op, (ast.Gt, ast.GtE)) and _unscaled(left) and _duration(right)
            if below or above:
                where = f"{path.relative_to(root)}:{node.lineno}"
                found.append(f"{where}: {lines[node.lineno - 1].strip()}")
    return found


def test_no_fixed_sleep_stands_in_for_an_event():
    found = [hit for p in _files() for hit in fixed_sleeps(p)]
    assert not found, (
        "sleeps outside a poll loop, with no `# not a wait: <why>` note (wait for the event "
        "instead: a line, a file, a process's exit):\n" + "\n".join(found)
    )


def test_no_wall_clock_bound_is_unscaled():
    found = [hit for p in _files() for hit in unscaled_bounds(p)]
    assert not found, (
        "durations bounded by a plain number (use support.timing's scaled() or bound()):\n"
        + "\n".join(found)
    )


def test_the_checks_find_what_they_look_for(tmp_path):
    """Each check finds the defect it names, and passes what the rules allow."""
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        "import time\n"
        "def test_x(ev, t0):\n"
        "    time.sleep(0.5)\n"
        "    took = time.monotonic() - t0\n"
        "    assert took < 3.0\n"
        "    assert ev['t'] - t0 <= timeout + 1.5\n"
        "    assert 2 > time.monotonic() - t0\n"
    )
    good = tmp_path / "test_good.py"
    good.write_text(
        "import time\n"
        "def test_x(ev, t0, done):\n"
        "    time.sleep(0.5)  # not a wait: the fault lasts this long\n"
        "    while not done():\n"
        "        time.sleep(0.02)\n"
        "    took = time.monotonic() - t0\n"
        "    assert took < scaled(3.0) and took >= 0.25 and took < timeout / 2\n"
        "    assert len(ev) < 3\n"
    )
    assert [h.split(": ")[0] for h in fixed_sleeps(bad, tmp_path)] == ["test_bad.py:3"]
    assert len(unscaled_bounds(bad, tmp_path)) == 3, unscaled_bounds(bad, tmp_path)
    assert fixed_sleeps(good, tmp_path) == [] and unscaled_bounds(good, tmp_path) == []
