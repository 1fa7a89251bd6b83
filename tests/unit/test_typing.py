"""The typed public API.

Checked here, in-process and cheaply: the package ships py.typed; every public function and
method has its parameters and return annotated; the docstrings (what help() shows) and the
README's API section name the same ops and algorithms as the code accepts. mypy itself runs in
`make typecheck` (part of `make test`, before pytest): a cold run takes ~20-40 s here, too long
to repeat as a test.
"""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
import typing
from pathlib import Path

import pytest

import collectives as cl
from collectives.group import exchanges, group
from collectives.group.group import ProcessGroup

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
COLLECTIVES = [
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "send",
    "recv",
]
REDUCING = ["all_reduce", "reduce", "reduce_scatter"]
# the algorithms each collective accepts besides "auto", from the tables the code picks from
ALGORITHMS = {
    "all_reduce": list(group.ALL_REDUCE),
    "reduce": list(group.ROOTED),
    "broadcast": list(group.ROOTED),
    "all_gather": list(group.SCATTER_GATHER),
    "reduce_scatter": list(group.SCATTER_GATHER),
    "all_to_all": list(exchanges.ALL_TO_ALL),
    "gather": list(exchanges.ROOTED_COPY),
    "scatter": list(exchanges.ROOTED_COPY),
}


def test_py_typed_ships_with_the_package():
    """The marker lies next to the imported package, and pyproject.toml puts it in the wheel."""
    pkg = Path(cl.__file__).parent
    assert (pkg / "py.typed").is_file()
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in conf["tool"]["setuptools"]["package-data"]["collectives"]
    assert conf["tool"]["mypy"]["files"], "make typecheck needs the public modules listed"


def _public_callables():
    """(qualified name, function) for the public surface: collectives.__all__, the classes'
    public methods (and __init__), the training classes, the teaching entry points and the
    torch backend -- only what the package itself defines."""
    torch_backend = importlib.import_module("collectives.torch.backend")
    torch_registration = importlib.import_module("collectives.torch.registration")
    step = importlib.import_module("collectives.teaching.step")
    explain = importlib.import_module("collectives.teaching.explain")
    classes = [getattr(cl, n) for n in cl.__all__ if inspect.isclass(getattr(cl, n))]
    classes += [
        cl.DataParallel,
        cl.ElasticTrainer,
        step.Stepper,
        torch_backend.CollectivesProcessGroup,
    ]
    funcs = [getattr(cl, n) for n in cl.__all__ if inspect.isfunction(getattr(cl, n))]
    funcs += [getattr(explain, n) for n in explain.__all__] + [torch_registration.register]
    for f in funcs:
        yield f.__qualname__, f
    for c in classes:
        for klass in c.__mro__:
            if not klass.__module__.startswith("collectives"):
                continue
            for name, f in vars(klass).items():
                if isinstance(f, property):
                    f = f.fget
                if not inspect.isfunction(f):
                    continue
                if name.startswith("_") and name not in ("__init__", "__enter__", "__exit__"):
                    continue
                yield f"{c.__name__}.{name}", f


def test_every_public_function_is_annotated():
    """... and the annotations resolve (typing.get_type_hints, as documentation tools and
    runtime checkers evaluate them)."""
    missing = []
    for qualname, f in _public_callables():
        typing.get_type_hints(f)
        sig = inspect.signature(f)
        for p in list(sig.parameters.values()):
            if p.name in ("self", "cls"):
                continue
            if p.annotation is inspect.Parameter.empty:
                missing.append(f"{qualname}({p.name})")
        if sig.return_annotation is inspect.Signature.empty and f.__name__ != "__init__":
            missing.append(f"{qualname} -> ?")
    assert not missing, f"unannotated: {', '.join(sorted(set(missing)))}"


def test_module_twins_have_the_methods_signature_and_docstring():
    for name in COLLECTIVES:
        method, twin = getattr(ProcessGroup, name), getattr(cl, name)
        params = list(inspect.signature(method).parameters.values())[1:]  # without self
        assert list(inspect.signature(twin).parameters.values()) == params, name
        assert inspect.getdoc(method) in inspect.getdoc(twin), name


def _readme_api() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## API") : text.index("\n## ", text.index("## API") + 1)]


@pytest.mark.parametrize("name", COLLECTIVES)
def test_docstring_says_what_the_readme_says(name):
    """help(cl.NAME) and help(pg.NAME): async_op and timeout, the errors, and (where they
    apply) every ReduceOp and every algorithm the code accepts; the README's API section
    names the same."""
    api = _readme_api()
    doc = inspect.getdoc(getattr(cl, name))
    assert name in api
    for fact in (
        "async_op",
        "timeout",
        "Work",
        "ValueError",
        "TypeError",
        "CollectiveMismatch",
        "CollectiveTimeout",
        "PeerFailure",
        "Evicted",
    ):
        assert fact in doc, f"help(cl.{name}) does not mention {fact}"
        assert fact in api, f"README's API section does not mention {fact}"
    if name in REDUCING:
        for op in cl.ReduceOp.__members__:
            assert re.search(rf"\b{op}\b", doc), f"help(cl.{name}) does not name ReduceOp.{op}"
            assert re.search(rf"\b{op}\b", api), f"README's API section lacks ReduceOp.{op}"
    for alg in ["auto", *ALGORITHMS[name]] if name in ALGORITHMS else []:
        assert f'"{alg}"' in doc, f"help(cl.{name}) does not name algorithm {alg!r}"
        assert f'"{alg}"' in api, f"README's API section does not name algorithm {alg!r}"
