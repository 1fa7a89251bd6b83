"""Messages are typed records to the end: outside the codecs, membership/ and transport/ read no
field by string key and build no message as a dict literal. Counted on the syntax tree, so a
read spelled across lines, through .get or with a default is counted as well as `x["k"]`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]

PACKAGE = Path(__file__).resolve().parents[3] / "collectives"
LAYERS = ("membership", "transport")
# The codecs: where bytes become records and back, the only places a string key may be read.
# (common/monitor.py, outside these layers, reads pyzmq's monitor-event dict: pyzmq's API.)
CODECS = {"transport/wire.py"}
# String keys that name no message field: zmq.Frame.get reads a frame's metadata property.
NOT_MESSAGES = {("transport/zmq/frames.py", 'read .get("Peer-Address")')}


def string_keyed(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each x["key"], x.get("key", ...) and dict literal with a string key."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            found.append((node.lineno, f'read ["{node.slice.value}"]'))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, f'read .{node.func.attr}("{node.args[0].value}")'))
        elif isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys
        ):
            found.append((node.lineno, "dict literal with string keys"))
    return found


def findings() -> list[str]:
    out = []
    for layer in LAYERS:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            name = path.relative_to(PACKAGE).as_posix()
            if name in CODECS:
                continue
            for line, what in string_keyed(ast.parse(path.read_text())):
                if (name, what) not in NOT_MESSAGES:
                    out.append(f"{name}:{line}: {what}")
    return out


def test_the_counter_sees_every_spelling():
    src = 'a = m["k"]\nb = m.get(\n  "k", 0)\nc = {"k": 1}\nd = m[k]\ne = {k: 1}\nf = m.get(k)\n'
    assert [line for line, _ in string_keyed(ast.parse(src))] == [1, 2, 4]


def test_membership_and_transport_read_no_message_by_string_key():
    found = findings()
    assert found == [], "typed records, not dicts read by key:\n" + "\n".join(found)


def test_no_dict_message_alias():
    """A message is a Struct: no alias names dict[str, Any] as one (Message = dict[str, Any])."""
    aliases = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(node, getattr(ast, "TypeAlias", ())):  # `type X = ...` (3.12)
                value = node.value
            if value is not None and ast.unparse(value).replace(" ", "") == "dict[str,Any]":
                aliases.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert aliases == []
