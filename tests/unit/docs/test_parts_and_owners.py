"""Parts and their owners (CONTRIBUTING.md, "A part never holds its owner"), checked like the
import contracts: by reading every module of the package, without running it.

Invariants:
- the modules of collectives/ import each other without a cycle, counting every import --
  at the top, under TYPE_CHECKING, inside a function. A part that imports the class that
  holds it (to type it, or to call it) closes a cycle: the owner imports the part to build it.
  A part names the narrow interface it uses instead (a typing.Protocol, or the callables and
  records it is handed). Package __init__ modules are left out: they import their own
  modules to say what the package holds;
- no module reads another object's private members: `x._name` only where x is self or cls
  (or super()). What a part needs of another object is a public name, declared there.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support.procs import ROOT  # the repository

pytestmark = pytest.mark.fast  # in-process, reads files only: part of `make test-fast`

PACKAGE = ROOT / "collectives"

# The public names that namedtuple and the standard library spell with an underscore.
PUBLIC_UNDERSCORED = {"_fields", "_make", "_replace", "_asdict", "_field_defaults", "_exit"}

KNOWN_MEMBERSHIP: set[str] = set()

# The one module allowed to read torch's private c10d members, and only those: the module
# object `c10d` (torch.distributed.distributed_c10d) and the private setters of torch's
# ProcessGroup. A backend that replaces torch's default group has to, as torch's own
# shrink_group does: torch 2.13 exposes no public API to install a shrunk (or grown) group
# made by a Python backend as the default group, nor to read the default group's store.
# Every other module asks collectives/torch/world.py through its public functions.
TORCH_C10D_MODULE = "collectives/torch/world.py"
TORCH_C10D_OWNER = "c10d"
TORCH_PROCESS_GROUP_PRIVATE = {"_set_group_name", "_set_group_desc"}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        init = parts[-1] == "__init__"
        out[".".join(parts[:-1] if init else parts)] = (path, init)
    return out


def _imports(name: str, path: Path, init: bool, modules: dict) -> set[str]:
    """Every module of the package that `name` imports, wherever the import stands."""
    found = set()
    here = name.split(".") if init else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            src = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{src}.{a.name}"
                found.add(sub if sub in modules else src)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _file(name: str, modules: dict) -> str:
    return modules[name][0].relative_to(ROOT).as_posix()


def _torch_c10d_read(node: ast.Attribute) -> bool:
    """A read of torch's c10d internals of the kind TORCH_C10D_MODULE may make."""
    owner = node.value
    if isinstance(owner, ast.Name) and owner.id == TORCH_C10D_OWNER:
        return True
    return node.attr in TORCH_PROCESS_GROUP_PRIVATE


def _private_reads(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    torch_world = path.relative_to(root).as_posix() == TORCH_C10D_MODULE
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in PUBLIC_UNDERSCORED:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if (
            isinstance(owner, ast.Call)
            and isinstance(owner.func, ast.Name)
            and owner.func.id == "super"
        ):
            continue
        if torch_world and _torch_c10d_read(node):
            continue
        found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_part_imports_its_owner():
    modules = _modules()
    assert len(modules) > 50, "the package was not found"
    graph = {
        name: {m for m in _imports(name, path, init, modules) if not modules[m][1]}
        for name, (path, init) in modules.items()
        if not init
    }
    cycles = [
        c for c in _cycles(graph) if not all(_file(m, modules) in KNOWN_MEMBERSHIP for m in c)
    ]
    assert not cycles, (
        "modules that import each other (a part importing what holds it?); give the part a "
        "Protocol or the callables it needs:\n" + "\n".join(" <-> ".join(c) for c in cycles)
    )


def test_no_module_reads_private_members_of_another_object():
    found = []
    for path, _ in _modules().values():
        if path.relative_to(ROOT).as_posix() not in KNOWN_MEMBERSHIP:
            found += _private_reads(path)
    assert not found, "private members read from outside their object:\n" + "\n".join(found)


def test_the_known_exceptions_still_are_exceptions():
    """An entry of KNOWN_MEMBERSHIP that breaks neither rule any more is stale: drop it."""
    modules = _modules()
    graph = {
        name: {m for m in _imports(name, path, init, modules) if not modules[m][1]}
        for name, (path, init) in modules.items()
        if not init
    }
    in_cycles = {_file(m, modules) for c in _cycles(graph) for m in c}
    stale = sorted(
        f
        for f in KNOWN_MEMBERSHIP
        if (ROOT / f).exists() and f not in in_cycles and not _private_reads(ROOT / f)
    )
    assert not stale, f"no longer exceptions, drop them from KNOWN_MEMBERSHIP: {stale}"


def test_the_torch_c10d_exception_is_used_and_confined():
    """The c10d exception still covers reads its module makes (else drop it), and the same
    reads anywhere else are found."""
    world = ROOT / TORCH_C10D_MODULE
    tree = ast.parse(world.read_text(encoding="utf-8"))
    assert any(isinstance(n, ast.Attribute) and _torch_c10d_read(n) for n in ast.walk(tree)), (
        f"{TORCH_C10D_MODULE} reads no c10d internals any more: drop the exception"
    )


def test_the_torch_c10d_exception_holds_only_in_its_module(tmp_path):
    src = tmp_path / "collectives" / "torch" / "other.py"
    src.parent.mkdir(parents=True)
    src.write_text("def f(c10d, g):\n    return c10d._world, g._set_group_name, g._other\n")
    found = {f.split(": ", 1)[1] for f in _private_reads(src, tmp_path)}
    assert found == {"c10d._world", "g._set_group_name", "g._other"}
    world = tmp_path / TORCH_C10D_MODULE
    world.write_text(src.read_text())
    found = {f.split(": ", 1)[1] for f in _private_reads(world, tmp_path)}
    assert found == {"g._other"}


@pytest.mark.parametrize(
    "source, cyclic",
    [
        ({"a": {"b"}, "b": {"a"}}, True),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
    ],
)
def test_the_cycle_finder_finds_cycles(source, cyclic):
    """The checker itself: a test that cannot fail is a defect."""
    assert bool(_cycles(source)) is cyclic


def test_the_private_reader_finds_private_reads(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "class A:\n"
        "    def f(self, other):\n"
        "        self._mine, cls_ok = other._theirs, super()._base\n"
        "        return self.owner._secret, other._fields, other.__len__\n"
    )
    found = {f.split(": ", 1)[1] for f in _private_reads(src, tmp_path)}
    assert found == {"other._theirs", "self.owner._secret"}
