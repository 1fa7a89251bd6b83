"""The house rules of CONTRIBUTING.md that a reader can check by looking at the files.

Invariants:
- no file of the repository's text (code, tests, benches and their results, docs) carries a
  lab note: a calendar date, an issue number, a load-average figure or "the mission". A comment
  gives a reason; a measurement names its command and its conditions in words ("quiet machine",
  "beside two CPU burners"), which stay true, where a date or a load figure only dates it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.procs import ROOT  # the repository

pytestmark = pytest.mark.fast  # in-process, reads files only: part of `make test-fast`


TEXT_SUFFIXES = {".py", ".md", ".txt", ".json", ".toml", ".cfg", ".yaml", ".yml", ".ipynb", ""}
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
HERE = Path(__file__).resolve()

LAB_NOTES = {
    "a calendar date": re.compile(r"\b20\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])\b"),
    "an issue number": re.compile(r"\bissues? #?\d+\b", re.I),
    "a load-average figure": re.compile(
        r"\bload averages?\b[^.\n]{0,20}?\d|\bload (?:at (?:start|end):? )?~?\d+\.\d+", re.I
    ),
    "the mission": re.compile(r"\bmission\b", re.I),
}


def _files() -> list[Path]:
    out = []
    for top in ("collectives", "tests", "bench", "docs", "examples", "tools", ".ci"):
        for path in sorted((ROOT / top).rglob("*")):
            if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in path.parts):
                continue
            if path.is_file() and path.suffix in TEXT_SUFFIXES and path.resolve() != HERE:
                out.append(path)
    out += [p for p in sorted(ROOT.iterdir()) if p.is_file() and p.suffix in TEXT_SUFFIXES]
    return out


def test_no_lab_notes():
    files = _files()
    assert len(files) > 200, "the repository's files were not found"
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in LAB_NOTES.items():
                m = pattern.search(line)
                if m:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {m.group(0)!r}")
    assert not found, "lab notes (say the reason or the condition instead):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line, what",
    [
        ("# measured 2026-12-01 on the VM", "a calendar date"),
        ("# see issue 16", "an issue number"),
        ("(issue #3)", "an issue number"),
        ("# load average 8-28", "a load-average figure"),
        ("=== rep 1 new load 4.54", "a load-average figure"),
        ("# load average at start: 0.44", "a load-average figure"),
        ("for the mission", "the mission"),
    ],
)
def test_the_patterns_catch_what_they_name(line, what):
    assert LAB_NOTES[what].search(line)


@pytest.mark.parametrize(
    "line",
    [
        "load = os.getloadavg()[0]",
        "the load average lags a load that starts with the run",
        "issues list",
        "size 2026 bytes",
        "commission",
        "Coordinator load: 1,000 members",
    ],
)
def test_the_patterns_spare_ordinary_text(line):
    assert not any(p.search(line) for p in LAB_NOTES.values())
