"""Several hosts: the multi-node launcher (--elastic too), torchrun and mpiexec across hosts,
every collective across hosts, a whole host killed, and a host cut off with `ip link set DEV
down`.

Hosts are network namespaces that this test makes: three "hosts" (h0, h1, h2), each with a
veth into a fourth namespace holding a bridge (the switch), on link-local addresses
169.254.78.1-3 that exist only inside them. Every namespace and every process in them is
removed at teardown, whatever happened. Skipped, with the reason, only where the kernel
refuses namespaces (not root, no iproute2 or nsenter).

Also, on one host, two launchers as two nodes (`--nnodes 2 --node-rank 0|1`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time

import pytest

from support.cluster import Cluster
from support.netns import Hosts, Refused, ip
from support.ports import coordinator_process
from support.procs import clean_env
from support.timing import heartbeats, scaled

# root, network namespaces, tc, nsenter: under CI=true a skip is a failure (conftest.py)
pytestmark = pytest.mark.ci_must_run

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
COLLECTIVES_WORKER = os.path.join(HERE, "support", "collectives_worker.py")
NET = 78  # hosts at 169.254.78.1-3: link-local, our namespaces only
IPS = [f"169.254.{NET}.{i}" for i in (1, 2, 3)]


@pytest.fixture(autouse=True)
def job_secret(monkeypatch):
    """Several hosts (or several launchers) share the job's secret, as every node must."""
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET", "multihost-test-secret-0123456789")


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nsenter") is None:
        pytest.skip("needs root, iproute2 and nsenter (util-linux) for network namespaces")
    try:
        with Hosts(3, NET) as h:
            yield {"ns": h.names, "dev": h.devs, "prefix": [h.prefix(i) for i in range(3)]}
    except Refused as exc:
        pytest.skip(str(exc))


def _master_port(procs, name, timeout=30.0) -> str:
    """The MASTER_PORT node 0's launcher chose and printed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"MASTER_PORT=(\d+)", procs.stderr(name))
        if m:
            return m.group(1)
        assert procs.procs[name].poll() is None, procs.stderr(name)
        time.sleep(0.05)
    procs.fail(f"{name} printed no MASTER_PORT")


def _launch_nodes(procs, nnodes, nproc, addr, prefixes, envs=None):
    """One launcher per node, node 0 first (it picks the port and hosts the coordinator)."""
    base = [
        sys.executable,
        "-m",
        "collectives.launch",
        "--nnodes",
        nnodes,
        "--nproc",
        nproc,
        "--master-addr",
        addr,
        "--timeout",
        100,
    ]
    envs = envs or [{}] * nnodes
    procs.spawn(
        "node0", [*prefixes[0], *base, "--node-rank", 0, COLLECTIVES_WORKER], clean_env(**envs[0])
    )
    port = _master_port(procs, "node0")
    for i in range(1, nnodes):
        procs.spawn(
            f"node{i}",
            [*prefixes[i], *base, "--node-rank", i, "--master-port", port, COLLECTIVES_WORKER],
            clean_env(**envs[i]),
        )
    results = procs.wait([f"node{i}" for i in range(nnodes)], timeout=110)
    events = {}
    for i, res in enumerate(results):
        assert res.code == 0, f"node {i}: {res.output[-3000:]}"
        for line in res.out.splitlines():
            m = re.match(r"\[rank (\d+)\] (\{.*\})$", line)
            if m:
                events.setdefault(int(m.group(1)), []).append(json.loads(m.group(2)))
    return events


def _check_all_ops(events, world_size, node_of):
    assert sorted(events) == list(range(world_size)), sorted(events)
    nodes = [node_of(r) for r in range(world_size)]
    for rank, evs in events.items():
        ops = [e for e in evs if "op" in e]
        assert ops and all(e["ok"] for e in ops), (rank, [e for e in ops if not e["ok"]])
        assert ops[-1]["op"] == "done", (rank, ops[-1])
        assert {
            "all_reduce hierarchical 5",
            "all_reduce hierarchical 300000",
            "all_reduce hierarchical 5000000",
        } <= {e["op"] for e in ops}
        # the host map every rank sees: one host per node, numbered in rank order
        hosts = next(e for e in evs if "kinds" in e)["hosts"]
        assert hosts == [sorted(set(nodes)).index(v) for v in nodes], (rank, hosts)
        # auto: one round for 20 bytes (through rank 0 on a host with 2+ ranks per CPU: this
        # machine's two launchers of 2 on 2 cores); for 1.2 MB hierarchical across hosts,
        # never on one
        said = next(e for e in evs if "auto" in e)
        auto = said["auto"]
        assert auto["5"] == ("naive" if said["crowded"] else "direct"), (rank, said)
        cpus = len(os.sched_getaffinity(0))  # the ranks inherit this process's
        assert said["crowded"] == any(nodes.count(v) >= 2 * cpus for v in nodes), said
        assert (auto["300000"] == "hierarchical") == (len(set(nodes)) > 1), (rank, auto)
        kinds = {int(p): k for p, k in next(e for e in evs if "kinds" in e)["kinds"].items()}
        for peer, kind in kinds.items():
            # same host: ipc or shared memory; another host: tcp -- chosen per pair
            want = ("ipc", "shm") if node_of(peer) == node_of(rank) else ("tcp",)
            assert kind in want, (rank, peer, kind)


@pytest.mark.timeout(150)
def test_two_launchers_as_two_nodes_on_one_host(procs):
    events = _launch_nodes(procs, 2, 2, "127.0.0.1", [[], []])
    # one host: every pair is local, so nothing may use tcp
    _check_all_ops(events, 4, node_of=lambda r: 0)


@pytest.mark.timeout(150)
def test_every_collective_across_three_hosts_with_the_multinode_launcher(hosts, procs):
    # each host names its interface, as GLOO_SOCKET_IFNAME would
    envs = [{"COLLECTIVES_SOCKET_IFNAME": dev} for dev in hosts["dev"]]
    events = _launch_nodes(procs, 3, 2, IPS[0], hosts["prefix"], envs)
    _check_all_ops(events, 6, node_of=lambda r: r // 2)
    for rank, evs in events.items():  # every rank bound and advertised its host's interface
        endpoint = next(e for e in evs if "endpoint" in e)["endpoint"]
        assert endpoint.startswith(f"tcp://{IPS[rank // 2]}:"), (rank, endpoint)


@pytest.mark.timeout(150)
def test_a_whole_host_killed_then_a_host_cut_off(hosts, tmp_path):
    """6 ranks on 3 hosts. Host 1 dies (both its ranks SIGKILLed at once): the 4 survivors
    reconstruct and go on with exact sums. Then host 2's link goes down mid-all_reduce: the
    2 ranks of host 0 go on alone, exact; the cut-off ranks fail loudly, never hang. Every
    all_reduce is hierarchical: 3 leaders, then 2, then one host alone."""
    c = Cluster(
        6,
        tmp_path,
        host=IPS[0],
        heartbeat_timeout=scaled(1.0),
        coordinator_prefix=hosts["prefix"][0],
        worker_args=[
            "--seconds",
            f"{scaled(60):g}",
            "--count",
            "65536",
            "--timeout",
            f"{scaled(3):g}",
            "--algorithm",
            "hierarchical",
        ],
    )
    try:
        for r in range(6):
            c.spawn(f"w{r}", r, prefix=hosts["prefix"][r // 2])
        c.wait_steps([f"w{r}" for r in range(6)], ws=6, timeout=40)
        killed = time.time()
        for name in ("w2", "w3"):
            os.kill(c.procs[name].pid, signal.SIGKILL)
        steps = c.wait_steps(["w0", "w1", "w4", "w5"], ws=4, timeout=20, after=killed)
        assert all(s["ok"] for s in steps)
        cut = time.time()
        ip("-n", hosts["ns"][2], "link", "set", hosts["dev"][2], "down")
        steps = c.wait_steps(["w0", "w1"], ws=2, timeout=25, after=cut)
        assert all(s["ok"] for s in steps)
        for name in ("w4", "w5"):
            err = c.wait_for(
                lambda e, n=name: (
                    e["proc"] == n
                    and e["t"] > cut
                    and e["event"] in ("error", "failure", "evicted")
                ),
                25,
                f"an error on {name}",
            )
            assert any(w in err["error"] for w in ("timed out", "no answer", "removed")), err
    finally:
        c.close()


WORKER = os.path.join(HERE, "support", "launcher_worker.py")
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable))


def _one_json_per_rank(outputs: list[str], n: int) -> dict[int, dict]:
    found, decode = {}, json.JSONDecoder().raw_decode
    for out in outputs:  # a launcher may forward output in chunks: take each object
        for m in re.finditer(r'\{"rank"', out):
            said = decode(out, m.start())[0]
            assert said["rank"] not in found, (said, found)
            found[said["rank"]] = said
    assert sorted(found) == list(range(n)), outputs
    return found


def _check_two_hosts(found: dict[int, dict], nproc: int = 2):
    n = len(found)
    for rank, said in found.items():
        assert said["ws"] == n and said["sum"] == n * (n + 1) / 2, said
        assert said["endpoint"].startswith(f"tcp://{IPS[rank // nproc]}:"), said  # its host
        assert said["local_rank"] == rank % nproc, said
        for peer, kind in said["kinds"].items():  # shm on one host, tcp across
            want = ("ipc", "shm") if int(peer) // nproc == rank // nproc else ("tcp",)
            assert kind in want, (rank, peer, kind)


@pytest.mark.timeout(150)
def test_torchrun_across_two_hosts(hosts, procs):
    """`torchrun --nnodes 2 --node-rank i --nproc-per-node 2 --master-addr A --master-port P`
    on two hosts runs the launcher-agnostic worker unchanged: cl.init_process_group() reads
    torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and, seeing TORCHELASTIC_RUN_ID,
    puts the coordinator on MASTER_PORT + 1 (rank 0 hosts it), while MASTER_PORT is the
    static rendezvous store torchrun's agent on node 0 binds; then the same ranks join
    torch.distributed.init_process_group("collectives") through that store. P is fixed, as
    torchrun needs it on both nodes before anything binds, but it is a port of host 0's own
    fresh namespace, where nothing else can take it (no race with the machine's ports)."""
    if TORCHRUN is None:
        pytest.skip("torch (torchrun) is not installed")
    for i in range(2):
        procs.spawn(
            f"node{i}",
            [
                *hosts["prefix"][i],
                TORCHRUN,
                "--nnodes",
                2,
                "--node-rank",
                i,
                "--nproc-per-node",
                2,
                "--master-addr",
                IPS[0],
                "--master-port",
                29500,
                WORKER,
                "--torch",
            ],
            clean_env(OMP_NUM_THREADS=1),
        )
    # six processes import torch (2 agents, 4 workers): ~15 CPU-s, slow on a busy machine
    results = procs.wait(["node0", "node1"], timeout=140)
    for i, res in enumerate(results):
        assert res.code == 0, f"node {i}: {res.output[-3000:]}"
    found = _one_json_per_rank([res.out for res in results], 4)
    _check_two_hosts(found)
    for rank, said in found.items():  # torch's ranks are ours, and its sum too
        assert said["torch_rank"] == rank and said["torch_sum"] == 10.0, said


MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
NETNS_SSH = os.path.join(HERE, "support", "netns_ssh")


@pytest.mark.timeout(60)
def test_mpiexec_across_two_hosts(hosts, procs):
    """MPICH's mpiexec (Hydra), run on host 0, starts its proxy on host 1 the way it would
    with ssh -- through tests/support/netns_ssh, which runs ssh's command line in the
    namespace of the host named -- and the launcher-agnostic worker runs unchanged as ranks
    0, 1 on host 0 and 2, 3 on host 1 (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID). The hosts are
    given by address (no name to resolve); -iface makes Hydra's proxies call back to host
    0's address on the test network. The coordinator is standalone on host 0, on a port it
    bound itself (port 0)."""
    assert MPIEXEC, "the test extra installs MPICH's mpiexec (pip package mpich)"
    address = coordinator_process(procs, "coordinator", 4, prefix=hosts["prefix"][0], host=IPS[0])
    env = clean_env(
        COLLECTIVES_COORDINATOR=address,
        NETNS_HOSTS=" ".join(f"{a}={ns}" for a, ns in zip(IPS, hosts["ns"])),
    )
    procs.spawn(
        "mpiexec",
        [
            *hosts["prefix"][0],
            MPIEXEC,
            "-launcher",
            "ssh",
            "-launcher-exec",
            NETNS_SSH,
            "-iface",
            hosts["dev"][0],
            "-hosts",
            f"{IPS[0]},{IPS[1]}",
            "-n",
            4,
            "-ppn",
            2,
            sys.executable,
            WORKER,
        ],
        env,
    )
    res = procs.wait("mpiexec", timeout=50)[0]
    assert res.code == 0, res.output[-3000:]
    _check_two_hosts(_one_json_per_rank([res.out], 4))


FAULT_WORKER = os.path.join(HERE, "support", "fault_worker.py")


def _events_of(text: str, who: str) -> list[dict]:
    """The JSON events a launcher forwarded with the prefix `who` ("[rank 3]", "[join 1]"; a
    regular expression)."""
    return [
        json.loads(line.split("] ", 1)[1])
        for line in text.splitlines()
        if re.match(who + r" \{", line)
    ]


@pytest.mark.timeout(90)
def test_elastic_across_two_hosts_replaces_on_the_node_that_lost_it(hosts, procs, tmp_path):
    """Two launchers with --elastic on two hosts, 2 workers each. Rank 3 (host 1) is
    SIGKILLed mid-job: the other 3 reconstruct without it, host 1's launcher -- not host 0's
    -- starts the replacement, which joins (world size 4 again); then all stop after the same
    step and finish with a barrier and an all_reduce whose result is identical and exact on
    all 4 ranks, and both launchers exit 0."""
    stop = tmp_path / "stop"
    env = clean_env(**heartbeats(0.2, 1.0), STOP_FILE=stop)
    base = [
        sys.executable,
        "-m",
        "collectives.launch",
        "--nnodes",
        2,
        "--nproc",
        2,
        "--master-addr",
        IPS[0],
        "--elastic",
        "--max-restarts",
        1,
        "--timeout",
        80,
    ]
    work = [
        FAULT_WORKER,
        "--seconds",
        70,
        "--agree-stop",
        "--pause",
        0.01,
        "--init-timeout",
        30,
    ]  # the rendezvous waits for the other host's launcher
    procs.spawn("node0", [*hosts["prefix"][0], *base, "--node-rank", 0, *work], env)
    port = _master_port(procs, "node0")
    procs.spawn(
        "node1", [*hosts["prefix"][1], *base, "--node-rank", 1, "--master-port", port, *work], env
    )
    _, m = procs.wait_for_line("node1", r'^\[rank 3\] \{"event": "step", .*"step": 5,', 40)
    victim = _events_of(procs.text("node1"), r"\[rank 3\]")[0]
    assert victim["event"] == "joined" and victim["rank"] == 3, victim
    os.kill(victim["pid"], signal.SIGKILL)
    # the replacement, started on host 1, joins and steps with the whole group again
    procs.wait_for_line("node1", r'^\[join 1\] \{"event": "step", .*"ws": 4, .*"step": 5,', 40)
    stop.touch()
    results = procs.wait(["node0", "node1"], timeout=40)
    for i, res in enumerate(results):
        assert res.code == 0, f"node {i}: {res.output[-3000:]}"
    assert (
        "rank 3 failed (signal SIGKILL); the others go on without it; starting a "
        "replacement" in results[1].err
    ), results[1].err[-2000:]
    said0 = [line for line in results[0].err.splitlines() if line.startswith("[launch] ")]
    assert not [line for line in said0 if "failed" in line], said0  # node 0 lost nobody
    finals = [
        e
        for res, who in [
            (results[0], "[rank 0]"),
            (results[0], "[rank 1]"),
            (results[1], "[rank 2]"),
            (results[1], "[join 1]"),
        ]
        for e in _events_of(res.out, re.escape(who))
        if e["event"] == "final"
    ]
    assert sorted(e["rank"] for e in finals) == [0, 1, 2, 3], finals
    assert all(e["ws"] == 4 and e["exact"] for e in finals), finals
    assert len({e["digest"] for e in finals}) == 1 and len({e["gen"] for e in finals}) == 1, finals
    steps = [
        e
        for res in results
        for e in _events_of(res.out, r"\[(rank|join) \d+\]")
        if e["event"] == "step"
    ]
    assert all(e["ok"] for e in steps), [e for e in steps if not e["ok"]][:3]
    # Rank 3's death made a new generation: at world size 3 and then 4 again when the
    # replacement joined later, or straight at 4 when the replacement was already waiting to be
    # admitted by the reconstruction that dropped rank 3 (both are right; the launcher races).
    assert max(e["gen"] for e in steps) >= 1 and {e["ws"] for e in steps} <= {3, 4}, steps[-5:]
