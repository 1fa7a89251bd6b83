"""The environment is read in one place (collectives/core/config.py).

Invariants: no other module of the library reads os.environ (the launcher only writes its
children's environment); every variable config.py reads is in its VARIABLES table, and that
table is the README's; a bad value raises ValueError naming the variable.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from collectives.core import config

pytestmark = pytest.mark.fast   # in-process: part of `make test-fast`

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "collectives"


def test_only_config_reads_the_environment():
    readers = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                     if re.search(r"os\.environ|getenv\(", p.read_text()))
    assert readers == ["collectives/core/config.py", "collectives/launch/__main__.py"], readers
    launcher = (PACKAGE / "launch" / "__main__.py").read_text()
    # the launcher copies the environment for its workers, and reads nothing from it
    assert re.findall(r"os\.environ[^\n]*", launcher) == ["os.environ)"], launcher


def test_every_variable_read_is_in_the_table_and_in_the_readme():
    names = {v.name for v in config.VARIABLES}
    source = (PACKAGE / "core" / "config.py").read_text()
    read = set(re.findall(r'(?:_get|_seconds)\("(\w+)"', source))
    for p in PACKAGE.rglob("*.py"):    # RANK, WORLD_SIZE, MASTER_PORT: read through config
        read |= set(re.findall(r'required_int\("(\w+)"', p.read_text()))
    assert read == names, (read ^ names)
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, re.M))
    assert set(table) == names, set(table) ^ names
    for v in config.VARIABLES:
        assert table[v.name].strip() == v.default, (v.name, table[v.name], v.default)


@pytest.mark.parametrize("name,value,reader", [
    ("COLLECTIVES_TRANSPORT", "udp", lambda: config.transport()),
    ("COLLECTIVES_HEARTBEAT_INTERVAL", "often", lambda: config.heartbeat_interval()),
    ("COLLECTIVES_HEARTBEAT_TIMEOUT", "-1", lambda: config.heartbeat_timeout()),
    ("COLLECTIVES_SHM_BYTES", "lots", lambda: config.shm_bytes()),
    ("RANK", "first", lambda: config.required_int("RANK")),
    ("COLLECTIVES_COORDINATOR", "nocolon", lambda: config.coordinator_address()),
    ("COLLECTIVES_COORDINATOR", "host:http", lambda: config.coordinator_address()),
])
def test_a_bad_value_names_its_variable(monkeypatch, name, value, reader):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        reader()


def test_defaults_and_explicit_arguments(monkeypatch):
    for v in config.VARIABLES:
        monkeypatch.delenv(v.name, raising=False)
    assert config.transport() == "auto"
    assert config.heartbeat_interval() == config.DEFAULT_HEARTBEAT_INTERVAL
    assert config.shm_bytes() == config.DEFAULT_SHM_BYTES
    assert not config.join_requested()
    with pytest.raises(ValueError, match=r"\$MASTER_PORT is not set"):
        config.coordinator_address()
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert config.coordinator_address() == ("127.0.0.1", 29500)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")        # torchrun: its store holds the port
    assert config.coordinator_address() == ("127.0.0.1", 29501)
    assert config.coordinator_address("h", 7) == ("h", 7)  # an argument wins
    monkeypatch.setenv("COLLECTIVES_COORDINATOR", "c:5")
    assert config.coordinator_address() == ("c", 5)
    monkeypatch.setenv("COLLECTIVES_JOIN", "1")
    assert config.join_requested() and not config.join_requested(rank=0)
    with pytest.raises(ValueError, match="transport='udp'"):
        config.transport("udp")
    with pytest.raises(ValueError, match="heartbeat_interval must be > 0"):
        config.heartbeat_interval(0)
