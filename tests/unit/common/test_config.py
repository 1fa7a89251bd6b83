"""The environment is read in one place (collectives/common/config.py).

Invariants: no other module of the library reads os.environ (the launcher only writes its
children's environment); every variable config.py reads is in its VARIABLES table, and that
table is docs/configuration.md's; a bad value raises ValueError naming the variable.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collectives.common import config

pytestmark = pytest.mark.fast  # in-process: part of `make test-fast`

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "collectives"


def test_only_config_reads_the_environment():
    readers = sorted(
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if re.search(r"os\.environ|getenv\(", p.read_text())
    )
    assert readers == ["collectives/common/config.py", "collectives/launch/environment.py"], readers
    launcher = (PACKAGE / "launch" / "environment.py").read_text()
    # the launcher copies the environment for its workers, and reads nothing from it
    assert re.findall(r"os\.environ[^\n]*", launcher) == ["os.environ)"], launcher


def test_every_variable_read_is_in_the_table_and_in_the_docs():
    names = {v.name for v in config.VARIABLES}
    source = (PACKAGE / "common" / "config.py").read_text()
    read = set(re.findall(r'(?:_get|_seconds|_microseconds)\(\s*"(\w+)"', source))
    for p in PACKAGE.rglob("*.py"):  # RANK, WORLD_SIZE, MASTER_PORT: read through config
        read |= set(re.findall(r'required_int\(\s*"(\w+)"', p.read_text()))
    read |= {n for names in config.LAUNCHER_NAMES.values() for n in names}  # launchers
    assert read == names, read ^ names
    doc = (ROOT / "docs" / "configuration.md").read_text()
    section = doc.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, re.M))
    assert set(table) == names, set(table) ^ names
    for v in config.VARIABLES:
        assert table[v.name].strip() == v.default, (v.name, table[v.name], v.default)


def test_the_small_spin_is_read_in_microseconds(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_SMALL_SPIN", raising=False)
    assert config.small_spin() == pytest.approx(40e-6)  # the default
    monkeypatch.setenv("COLLECTIVES_SMALL_SPIN", "0")
    assert config.small_spin() == 0.0
    monkeypatch.setenv("COLLECTIVES_SMALL_SPIN", "12.5")
    assert config.small_spin() == pytest.approx(12.5e-6)


def test_the_small_yield_is_read_in_microseconds(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_SMALL_YIELD", raising=False)
    assert config.small_yield() == pytest.approx(config.DEFAULT_SMALL_YIELD_US * 1e-6)
    monkeypatch.setenv("COLLECTIVES_SMALL_YIELD", "0")
    assert config.small_yield() == 0.0
    monkeypatch.setenv("COLLECTIVES_SMALL_YIELD", "2500")
    assert config.small_yield() == pytest.approx(2.5e-3)


@pytest.mark.parametrize(
    "name,value,reader",
    [
        ("COLLECTIVES_TRANSPORT", "udp", lambda: config.transport()),
        ("COLLECTIVES_HEARTBEAT_INTERVAL", "often", lambda: config.heartbeat_interval()),
        ("COLLECTIVES_HEARTBEAT_TIMEOUT", "-1", lambda: config.heartbeat_timeout()),
        ("COLLECTIVES_SHM_BYTES", "lots", lambda: config.shm_bytes()),
        ("COLLECTIVES_CROWDED", "yes", lambda: config.crowded_schedules()),
        ("COLLECTIVES_SMALL_SPIN", "long", lambda: config.small_spin()),
        ("COLLECTIVES_SMALL_SPIN", "-5", lambda: config.small_spin()),
        ("COLLECTIVES_SMALL_SPIN", "5000", lambda: config.small_spin()),
        ("COLLECTIVES_SMALL_YIELD", "soon", lambda: config.small_yield()),
        ("COLLECTIVES_SMALL_YIELD", "-1", lambda: config.small_yield()),
        ("COLLECTIVES_SMALL_YIELD", "20000", lambda: config.small_yield()),
        ("COLLECTIVES_FAILURE_DETECTION", "pidfd,psychic", lambda: config.failure_detection()),
        ("COLLECTIVES_FAILSLOW_POLICY", "ignore", lambda: config.failslow_policy()),
        ("RANK", "first", lambda: config.required_int("RANK")),
        ("COLLECTIVES_COORDINATOR", "nocolon", lambda: config.coordinator_address()),
        ("COLLECTIVES_COORDINATOR", "host:http", lambda: config.coordinator_address()),
    ],
)
def test_a_bad_value_names_its_variable(monkeypatch, name, value, reader):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        reader()


@pytest.mark.parametrize(
    "env,message",
    [
        ({"COLLECTIVES_FAILSLOW_MIN_WORLD": "three"}, "MIN_WORLD='three' is not an integer"),
        ({"COLLECTIVES_FAILSLOW_MIN_WORLD": "0"}, "MIN_WORLD=0 is not between 1 and the job's 4"),
        ({"COLLECTIVES_FAILSLOW_MIN_WORLD": "5"}, "MIN_WORLD=5 is not between 1 and the job's 4"),
        ({"COLLECTIVES_FAILSLOW_MIN_WORLD": "3"}, "POLICY=reroute never shrinks the job"),
        (
            {"COLLECTIVES_FAILSLOW_POLICY": "replace", "COLLECTIVES_FAILSLOW_MIN_WORLD": "3"},
            "POLICY=replace never shrinks the job",
        ),
        (
            {"COLLECTIVES_FAILSLOW_POLICY": "shrink", "COLLECTIVES_FAILSLOW_SPARE_WAIT": "10"},
            "only policy replace waits for a spare",
        ),
        (
            {"COLLECTIVES_FAILSLOW_POLICY": "replace", "COLLECTIVES_FAILSLOW_SPARE_WAIT": "-1"},
            "SPARE_WAIT must be > 0 seconds",
        ),
    ],
)
def test_a_bad_shrink_setting_is_refused_before_the_job_starts(monkeypatch, env, message):
    """The fail-slow settings are read where the coordinator starts (membership/server.py):
    a bad one raises there, naming the variable, before any rank joins."""
    from collectives.membership.server import Coordinator

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=message):
        Coordinator("127.0.0.1", 0, 4, keys=None)


def test_the_shrink_settings_read_back(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_FAILSLOW_POLICY", "shrink")
    assert config.failslow_min_world(4) == 1  # unset: as far as the slow NICs take it
    monkeypatch.setenv("COLLECTIVES_FAILSLOW_MIN_WORLD", "3")
    assert config.failslow_min_world(4) == 3 and config.failslow_spare_wait() is None
    monkeypatch.setenv("COLLECTIVES_FAILSLOW_POLICY", "replace")
    monkeypatch.setenv("COLLECTIVES_FAILSLOW_SPARE_WAIT", "7.5")
    assert config.failslow_min_world(4) == 3 and config.failslow_spare_wait() == 7.5


def test_the_torch_default_group_is_elastic_where_the_job_names_a_coordinator(monkeypatch):
    """Unset: elastic under env:// and torchrun (MASTER_PORT) or a launcher's coordinator,
    not under file:// or tcp:// (neither named); set, it decides."""
    for name in ("COLLECTIVES_TORCH_ELASTIC", "MASTER_PORT", "COLLECTIVES_COORDINATOR"):
        monkeypatch.delenv(name, raising=False)
    assert config.torch_elastic() is False
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert config.torch_elastic() is True
    monkeypatch.setenv("COLLECTIVES_TORCH_ELASTIC", "0")
    assert config.torch_elastic() is False
    monkeypatch.delenv("MASTER_PORT")
    monkeypatch.setenv("COLLECTIVES_TORCH_ELASTIC", "")
    monkeypatch.setenv("COLLECTIVES_COORDINATOR", "h:5")
    assert config.torch_elastic() is True


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
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # torchrun: its store holds the port
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


def test_rank_size_and_local_rank_come_from_whichever_launcher_started_us(monkeypatch):
    for names in config.LAUNCHER_NAMES.values():
        for n in names:
            monkeypatch.delenv(n, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert (
        config.launcher_int("RANK"),
        config.launcher_int("WORLD_SIZE"),
        config.launcher_int("LOCAL_RANK"),
    ) == (5, 8, 1)
    monkeypatch.setenv("PMI_RANK", "3")  # mpiexec inside an allocation wins
    monkeypatch.setenv("PMI_SIZE", "4")
    assert (config.launcher_int("RANK"), config.launcher_int("WORLD_SIZE")) == (3, 4)
    monkeypatch.setenv("RANK", "0")  # and torchrun's / ours over everything
    assert config.launcher_int("RANK") == 0
    assert config.launcher_int("RANK", 7) == 7  # an argument over any variable
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "many")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_SIZE"):
        config.launcher_int("WORLD_SIZE")


def test_no_rank_anywhere_names_every_place_looked(monkeypatch):
    for n in config.LAUNCHER_NAMES["RANK"]:
        monkeypatch.delenv(n, raising=False)
    with pytest.raises(
        ValueError,
        match=r"\$RANK, \$OMPI_COMM_WORLD_RANK, \$PMI_RANK, "
        r"\$SLURM_PROCID",
    ):
        config.required_launcher_int("RANK")


@pytest.mark.parametrize(
    "nodelist,hosts",
    [
        ("node01", ["node01"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("gpu[8-10],cpu1", ["gpu8", "gpu9", "gpu10", "cpu1"]),
        ("rack[1-2]-n[001-002]", ["rack1-n001", "rack1-n002", "rack2-n001", "rack2-n002"]),
        ("a,b[09-11],c", ["a", "b09", "b10", "b11", "c"]),
    ],
)
def test_slurm_nodelist_is_expanded(nodelist, hosts):
    assert config.expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[01-03", "node01]", "node[a-b]", "node[5-3]"])
def test_a_bad_nodelist_is_an_error_naming_the_variable(bad):
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        config.expand_nodelist(bad)


def test_master_addr_defaults_to_the_first_slurm_host(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[07-09]")
    assert config.master_addr() == "node07"
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv("COLLECTIVES_COORDINATOR", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert config.coordinator_address() == ("node07", 29500)
    monkeypatch.setenv("MASTER_ADDR", "head.example")
    assert config.master_addr() == "head.example"


def test_socket_ifname_binds_that_interface_or_names_the_ones_there():
    from collectives.transport.zmq.addresses import bind_address, interface_address

    assert interface_address("lo") == "127.0.0.1"
    assert bind_address("lo", "127.0.0.1") == "127.0.0.1"
    with pytest.raises(ValueError, match=r"COLLECTIVES_SOCKET_IFNAME='nope0'.*lo"):
        interface_address("nope0")


def test_a_wrong_interface_fails_init_before_anything_starts(monkeypatch):
    import collectives as cl

    monkeypatch.setenv("COLLECTIVES_SOCKET_IFNAME", "nope0")
    with pytest.raises(ValueError, match="no such network interface"):
        cl.init_process_group(rank=0, world_size=1, master_addr="127.0.0.1", master_port=0)


def test_rank0_that_cannot_host_where_it_announces_names_both_tries(monkeypatch):
    """With `announce` (the torch backend) rank 0 hosts the coordinator whatever the port:
    where even any free port of MASTER_ADDR cannot be bound (an address of another host),
    the error names the address and both tries, and nothing was announced."""
    from collectives.common.errors import CollectiveError
    from collectives.membership.init import init_process_group

    monkeypatch.delenv("COLLECTIVES_SOCKET_IFNAME", raising=False)
    announced = []
    with pytest.raises(CollectiveError, match=r"192\.0\.2\.1:29999 .* nor on any free port"):
        init_process_group(
            0, 2, master_addr="192.0.2.1", master_port=29999, timeout=3, announce=announced.append
        )
    assert announced == []
