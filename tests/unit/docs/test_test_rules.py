"""The timing rules of tests/README.md ("Rules every test follows"), checked by reading the tests.

Invariants, over every Python file under tests/ (support/timing.py, which defines the scale,
and this file aside):
- no fixed sleep stands in for an event: a `time.sleep(...)` outside a `while` loop (a poll
  until a condition or a deadline is fine) carries a comment `not a wait: <why>` on its line
  -- a fault's length, a process's pace, a window in which something must NOT happen;
- no wall-clock upper bound is unscaled: a comparison that bounds a duration (`took`,
  `elapsed`, `time.monotonic() - t0`, an event's ["t"], a report's "..._s") from above by a
  plain number, or by something plus a plain number, goes through timing.scaled() or
  timing.bound() instead (a lower bound may stay plain: load only makes a wait longer). A
  name that holds only plain numbers where it is read (`within = 10.0`) counts as one; the
  difference of two moments named `..._at`, and a span named `first_step`, are durations.
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
# names of the seconds from one moment to another (failslow_runs.Replaced.first_step: from the
# slowdown to the spare's first step)
FROM_A_MOMENT = ("first_step",)


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


SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own_nodes(scope: ast.AST):
    """The nodes of `scope`, not those of the functions defined in it (their own scopes)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, SCOPES):
            todo += ast.iter_child_nodes(node)


def _bindings(scope: ast.AST) -> dict[str, bool]:
    """The names `scope` binds, each True where every binding is a plain number (`within =
    10.0`, `grace, n = 1.5, 2`): a bound held in such a name is as unscaled as the number."""
    out: dict[str, bool] = {}
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = scope.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is not None:
                out[arg.arg] = False  # a parameter: whatever the caller passes
    for node in _own_nodes(scope):
        pairs: list[tuple[ast.AST, ast.AST | None]] = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += zip(target.elts, node.value.elts)
                else:
                    pairs.append((target, node.value))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            pairs.append((node.target, node.value if isinstance(node, ast.AnnAssign) else None))
        elif isinstance(node, (ast.For, ast.comprehension, ast.NamedExpr, ast.withitem)):
            pairs.append(
                (node.optional_vars if isinstance(node, ast.withitem) else node.target, None)
            )
        for target, value in pairs:
            if target is None:
                continue
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    plain = value is not None and name is target and _plain_number(value)
                    out[name.id] = out.get(name.id, True) and plain
    return out


def _holds_plain_number(name: ast.Name, parents) -> bool:
    """Whether `name`, where it is read, holds a plain number: the innermost scope that binds
    it binds it to plain numbers only."""
    node: ast.AST = name
    while node in parents:
        node = parents[node]
        if isinstance(node, SCOPES):
            bound = _bindings(node)
            if name.id in bound:
                return bound[name.id]
    return False


def _unscaled(node: ast.AST, parents=None) -> bool:
    """A plain number (or a name holding only one), or something plus or minus a plain
    number (a slack that load would outgrow)."""
    if _plain_number(node):
        return True
    if isinstance(node, ast.Name) and parents is not None and _holds_plain_number(node, parents):
        return True
    return isinstance(node, ast.BinOp) and (
        isinstance(node.op, (ast.Add, ast.Sub))
        and (_plain_number(node.left) or _plain_number(node.right))
    )


def _timestamp(node: ast.AST) -> bool:
    """A moment by its name: `slowed_at`, `r.seen_at`."""
    if isinstance(node, ast.Name):
        return node.id.endswith("_at")
    return isinstance(node, ast.Attribute) and node.attr.endswith("_at")


def _duration(node: ast.AST) -> bool:
    """The text of a duration: a word of DURATION_WORDS or FROM_A_MOMENT, or the difference of
    two moments, one of them named `..._at` (`r.seen_at - r.slowed_at`)."""
    if _plain_number(node):
        return False
    text = ast.unparse(node)
    if any(w in text for w in DURATION_WORDS + FROM_A_MOMENT):
        return True
    return any(
        isinstance(sub, ast.BinOp)
        and isinstance(sub.op, ast.Sub)
        and (_timestamp(sub.left) or _timestamp(sub.right))
        for sub in ast.walk(node)
    )


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
    tree = ast.parse(src)
    parents = _parents(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for left, op, right in zip(sides, node.ops, sides[1:]):
            below = (
                isinstance(op, (ast.Lt, ast.LtE)) and _duration(left) and _unscaled(right, parents)
            )
            above = (
                isinstance(op, (ast.Gt, ast.GtE)) and _unscaled(left, parents) and _duration(right)
            )
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


def test_moments_and_bounds_held_in_names_are_found(tmp_path):
    """Two bounds that went unseen: the difference of two moments named `..._at`, and a
    duration named `first_step` bounded by a name that holds a plain number -- and their
    scaled forms, and a bound handed in as a parameter, pass."""
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        "def test_nic(r):\n"
        "    assert r.seen_at - r.slowed_at <= 10.0, (r.seen_at - r.slowed_at, r.log)\n"
        "def test_spare(rep, s):\n"
        "    within = 15.0\n"
        "    assert rep.first_step <= within, rep\n"
        "    grace, n = 1.5, 2\n"
        "    assert killed_at - started_at < grace\n"
    )
    good = tmp_path / "test_good.py"
    good.write_text(
        "def test_nic(r):\n"
        "    assert r.seen_at - r.slowed_at <= scaled(10.0), (r.seen_at - r.slowed_at, r.log)\n"
        "def test_spare(rep):\n"
        "    within = 15.0\n"
        "    assert rep.first_step <= scaled(within), rep\n"
        "    assert rep.first_step >= within\n"
        "def check(rep, within, e, killed_at, grace=1.5):\n"
        "    assert rep.first_step <= within\n"
        "    assert grace <= e['t'] - killed_at < grace + scaled(5)\n"
        "    assert rep.changed_at > 2\n"
    )
    found = [h.split(": ")[0] for h in unscaled_bounds(bad, tmp_path)]
    assert found == ["test_bad.py:2", "test_bad.py:5", "test_bad.py:7"], found
    assert unscaled_bounds(good, tmp_path) == [], unscaled_bounds(good, tmp_path)
