"""The documentation cites only what the repository holds.

Invariants: every relative link in the README, docs/*.md, tests/README.md, CONTRIBUTING.md,
CHANGELOG.md and the READMEs of bench/results resolves to a file or folder in the repository,
and a link's #anchor to a heading of its target; every path into the repository those pages
name exists (as written, or with an extension for a command's output prefix); every `make`
target and `python -m` module they name exists. Links inside
fenced code blocks are code, not links, and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.procs import ROOT  # the repository

pytestmark = pytest.mark.fast  # in-process, reads files only: part of `make test-fast`


PAGES = sorted(
    {
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "CHANGELOG.md",
        ROOT / "tests" / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("bench/results/**/README.md"),
    }
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:collectives|bench|tests|examples|tools|docs)/[\w./{},<>-]*[\w}/])"
)


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {
        _slug(h) for h in re.findall(r"^#+\s+(.*)$", _prose(page.read_text(encoding="utf-8")), re.M)
    }


def _expand(path: str) -> list[str]:
    """a/{b,c}.d -> [a/b.d, a/c.d]"""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [
        x
        for alt in m.group(1).split(",")
        for x in _expand(path[: m.start()] + alt + path[m.end() :])
    ]


def test_there_are_pages_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/README.md", "tests/README.md"} <= names, names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_repository_path_named_exists(page):
    """A path into the package, bench, tests, examples, tools or docs names a file or folder
    that exists (or, for a command's output prefix, one with an extension); placeholders
    (`tests/unit/<layer>/`, `tests/PATH`) are not paths."""
    missing = []
    for cited in REPO_PATH.findall(page.read_text(encoding="utf-8")):
        for path in _expand(cited):
            if "<" in path or any(part.isupper() for part in path.split("/")):
                continue
            p = ROOT / path.rstrip("/")
            if not (p.exists() or list(p.parent.glob(p.name + ".*"))):
                missing.append(path)
    assert not missing, f"{page.relative_to(ROOT)} names missing paths: {sorted(set(missing))}"


MAKE = re.compile(r"(?:`|^)make ([a-z][\w-]*)", re.M)
BENCH_STUDY = re.compile(r"python -m bench ([a-z]\w*)")
PYTHON_M = re.compile(r"python -m ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {t for line in re.findall(r"^([\w .-]+):(?!=)", text, re.M) for t in line.split()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_named_exists(page):
    """`make T` names a Makefile target; `python -m M` a module this checkout can import
    (found, not imported: nothing runs); `python -m bench STUDY` a study of bench's registry."""
    import importlib.util
    import sys

    text = page.read_text(encoding="utf-8")
    missing = sorted(
        {f"make {t}" for t in MAKE.findall(text)} - {f"make {t}" for t in _make_targets()}
    )
    sys.path.insert(0, str(ROOT))  # bench/ is a package of the checkout, not installed
    try:
        for module in sorted(set(PYTHON_M.findall(text))):
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                missing.append(f"python -m {module}")
    finally:
        sys.path.remove(str(ROOT))
    registry = ROOT / "bench" / "__main__.py"  # `python -m bench STUDY`: a registered study
    studies = registry.read_text(encoding="utf-8") if registry.is_file() else ""
    if "STUDIES" in studies:
        for study in sorted(set(BENCH_STUDY.findall(text))):
            if f'"{study}"' not in studies:
                missing.append(f"python -m bench {study}")
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"
