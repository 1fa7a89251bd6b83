"""The table of every environment variable the library reads: its name, its default and what it
does -- the table docs/configuration.md shows (tests/unit/common/test_config.py keeps the two
equal). The values themselves are read in config.py, and only there.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_HEARTBEAT_INTERVAL = 0.5  # 10 beats per timeout: one lost beat is never a death
DEFAULT_HEARTBEAT_TIMEOUT = 5.0  # torchft's default; a GC pause or a busy host is not a death
# A member waits this many heartbeat timeouts for a coordinator that went away (restarted,
# say) before it gives up: long enough for a supervisor to start it again.
GRACE_TIMEOUTS = 3
# Shared memory each rank offers for its outgoing payloads (0 turns it off); it is cut into
# slots of one segment each, and only the pages a payload has touched take memory.
DEFAULT_SHM_BYTES = 64 << 20
TRANSPORTS = ("auto", "tcp", "ipc", "shm")
# Microseconds a small receive reads its peer's fast link before it sleeps in a poll, where
# every rank of its host has a CPU of its own (transport/zmq/receiving.py, wait_peer).
# 40: on an idle machine a 2-rank 4 B all_reduce takes about half the time with it; beside
# CPU burners it is no slower (bench/results/smallop/README.md)
DEFAULT_SMALL_SPIN_US = 40
# Microseconds a small receive reads its peer's fast link, giving its CPU away between reads
# (os.sched_yield), before it sleeps in a poll, where its host runs more ranks than it has CPUs.
# There a rank that sleeps must be woken, and a wake-up across CPUs costs the waker and the
# woken tens of microseconds; a rank that yields stays runnable, and its peer, given the CPU,
# sends into a link that is read at once (bench/results/smallop/README.md).
DEFAULT_SMALL_YIELD_US = 500


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    meaning: str


VARIABLES = (
    Variable(
        "RANK",
        "required",
        "this process's rank (set by the launcher, torchrun); a "
        "replacement worker leaves it unset and sets COLLECTIVES_JOIN=1",
    ),
    Variable("WORLD_SIZE", "required", "the number of ranks"),
    Variable("LOCAL_RANK", "unset", "this process's rank among those on its host"),
    Variable(
        "OMPI_COMM_WORLD_RANK",
        "unset",
        "Open MPI's mpirun: the rank, where RANK is unset "
        "(likewise OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_LOCAL_RANK)",
    ),
    Variable("OMPI_COMM_WORLD_SIZE", "unset", "Open MPI's mpirun: the world size"),
    Variable("OMPI_COMM_WORLD_LOCAL_RANK", "unset", "Open MPI's mpirun: the local rank"),
    Variable(
        "PMI_RANK",
        "unset",
        "MPICH's mpiexec (Hydra): the rank, where RANK and OMPI_COMM_WORLD_RANK are unset",
    ),
    Variable("PMI_SIZE", "unset", "MPICH's mpiexec: the world size"),
    Variable("MPI_LOCALRANKID", "unset", "MPICH's mpiexec: the local rank"),
    Variable("SLURM_PROCID", "unset", "Slurm's srun: the rank, where no launcher above set one"),
    Variable("SLURM_NTASKS", "unset", "Slurm's srun: the world size"),
    Variable("SLURM_LOCALID", "unset", "Slurm's srun: the local rank"),
    Variable(
        "SLURM_JOB_NODELIST",
        "unset",
        "Slurm: the job's hosts, e.g. node[01-03,07]; "
        "MASTER_ADDR defaults to the first (SLURM_NODELIST is read too)",
    ),
    Variable("SLURM_NODELIST", "unset", "Slurm's older name for SLURM_JOB_NODELIST"),
    Variable(
        "MASTER_ADDR", "127.0.0.1", "host of the coordinator (under Slurm: the job's first host)"
    ),
    Variable(
        "MASTER_PORT",
        "required",
        "port of the coordinator (MASTER_PORT + 1 under "
        "torchrun, whose store holds MASTER_PORT); 0 on rank 0: host the coordinator on "
        "any free port and print it",
    ),
    Variable(
        "TORCHELASTIC_RUN_ID",
        "unset",
        "set by torchrun: the coordinator is then at MASTER_PORT + 1",
    ),
    Variable(
        "TORCHELASTIC_RESTART_COUNT",
        "0",
        "set by torchrun: how often it restarted the workers (the torch backend's rank 0 "
        "writes its coordinator's port into torch's store under a key per restart)",
    ),
    Variable(
        "COLLECTIVES_COORDINATOR",
        "unset",
        "host:port of the coordinator; wins over "
        "MASTER_ADDR and MASTER_PORT (the launcher sets it)",
    ),
    Variable(
        "COLLECTIVES_JOIN",
        "0",
        "1 (with RANK unset): wait to be admitted into a running job at its next reconstruct()",
    ),
    Variable(
        "COLLECTIVES_SPARE",
        "0",
        "1 (with COLLECTIVES_JOIN=1): a warm spare, admitted "
        "only into the place of a rank that failed, never growing the group (the "
        "launcher's --spares sets it)",
    ),
    Variable(
        "COLLECTIVES_TRANSPORT",
        "auto",
        "auto, tcp, ipc or shm (ipc plus shared memory for large payloads)",
    ),
    Variable(
        "COLLECTIVES_SHM_BYTES",
        str(DEFAULT_SHM_BYTES),
        "bytes of shared memory each rank offers for its outgoing payloads; 0 turns it off",
    ),
    Variable(
        "COLLECTIVES_FAST_LINKS",
        "1",
        "0 sends small messages to ranks on this host over "
        "ZeroMQ too, instead of the fast links (transport/zmq/fastlink.py)",
    ),
    Variable(
        "COLLECTIVES_SMALL_SPIN",
        str(DEFAULT_SMALL_SPIN_US),
        "microseconds a small receive reads its peer's fast link before it sleeps, where "
        "every rank on its host has a CPU of its own (group/tuning.py, spins); 0: never",
    ),
    Variable(
        "COLLECTIVES_SMALL_YIELD",
        str(DEFAULT_SMALL_YIELD_US),
        "microseconds a small receive reads its peer's fast link, yielding its CPU between "
        "reads, before it sleeps, where its host runs more ranks than it has CPUs "
        "(group/tuning.py, yields); 0: never",
    ),
    Variable(
        "COLLECTIVES_CROWDED",
        "auto",
        "0: never the schedules for a host with 2+ ranks "
        "per CPU (small all_reduces through rank 0, the star commit round: "
        "group/tuning.py); one rank saying 0 turns them off for its whole group",
    ),
    Variable(
        "COLLECTIVES_HEARTBEAT_INTERVAL",
        f"{DEFAULT_HEARTBEAT_INTERVAL:g}",
        "seconds between a worker's heartbeats",
    ),
    Variable(
        "COLLECTIVES_HEARTBEAT_TIMEOUT",
        f"{DEFAULT_HEARTBEAT_TIMEOUT:g}",
        "seconds "
        "without a heartbeat before the coordinator declares a rank dead (read where "
        "the coordinator runs)",
    ),
    Variable(
        "COLLECTIVES_FAILURE_DETECTION",
        "exit,connection,pidfd",
        "how the "
        "coordinator learns of a crash besides heartbeats (read where it runs): exit (its "
        "launcher reports it), connection (its connection closed), pidfd (a process of "
        "this host ended); a comma list, or none (membership/liveness.py)",
    ),
    Variable(
        "COLLECTIVES_COORDINATOR_GRACE",
        f"{GRACE_TIMEOUTS} heartbeat timeouts",
        "seconds a member goes on without its coordinator (killed, restarting) before "
        "every operation raises CoordinatorLost; collectives do not need it meanwhile",
    ),
    Variable(
        "COLLECTIVES_FAILSLOW_POLICY",
        "reroute",
        "what the coordinator does with a link that runs far behind its peers (read where "
        "it runs): report (log it), reroute (also hand every rank a ring order or tree root "
        "that keeps off it), replace (also swap a rank whose every link is slow for a "
        "waiting spare), shrink (also remove such a rank: the others go on without it); "
        "docs/faults.md",
    ),
    Variable(
        "COLLECTIVES_FAILSLOW_MIN_WORLD",
        "1",
        "the fewest ranks a job goes on with when it removes a slow NIC's rank without a "
        "spare (policy shrink, or replace with COLLECTIVES_FAILSLOW_SPARE_WAIT); read where "
        "the coordinator runs",
    ),
    Variable(
        "COLLECTIVES_FAILSLOW_SPARE_WAIT",
        "unset",
        "policy replace: seconds a slow NIC's rank waits for a spare before it is removed "
        "without one (the job shrinks, as under shrink); unset: it waits for good",
    ),
    Variable(
        "COLLECTIVES_FAULTS",
        "unset",
        "fault injection rules for generation 0, e.g. kill:2@op=7 (docs/faults.md)",
    ),
    Variable(
        "COLLECTIVES_LINK_PROBES",
        "1",
        "0: this rank takes no part in the timed link "
        "probes a stall diagnosis asks for where the stalled op's picture ties "
        "(docs/faults.md); the coordinator then decides on what it has",
    ),
    Variable(
        "COLLECTIVES_FAULTS_SCOPE",
        "generation0",
        "process: the rules of "
        "COLLECTIVES_FAULTS name launch ranks and follow those processes into every "
        "generation (a slow link stays slow after a reconstruct)",
    ),
    Variable(
        "COLLECTIVES_PROGRESS",
        "bar on a terminal, else lines",
        "how training shows "
        "progress: bar (a live tqdm bar), lines (a plain line every few seconds, for logs "
        "and CI) or off; the launcher sets it for its workers from its own output",
    ),
    Variable(
        "COLLECTIVES_GLOO_ORDER",
        "0",
        "1: torch backend: floating all_reduce sums in "
        "Gloo's order (the ring), so that results equal Gloo's bit for bit "
        "(docs/torch_backend.md); 0: the fastest schedule, equal to Gloo's within rounding",
    ),
    Variable(
        "COLLECTIVES_TORCH_ELASTIC",
        "1 where MASTER_PORT or COLLECTIVES_COORDINATOR is set",
        "1: torch backend: the default group joins the job's "
        "coordinator (COLLECTIVES_COORDINATOR, else one rank 0 hosts at MASTER_PORT + 1, "
        "or on a free port it writes into torch's store where that one is taken), so "
        "that dist.shrink_group, collectives.torch.reconfigure and joiners work "
        "(docs/torch_backend.md); 0: rendezvous through torch's store alone (no port but "
        "torch's; such a group cannot shrink)",
    ),
    Variable(
        "COLLECTIVES_DEBUG",
        "unset (quiet)",
        "WARN, INFO or TRACE: the library's log "
        "lines on stderr, like NCCL_DEBUG (common/logs.py says what each level adds)",
    ),
    Variable(
        "COLLECTIVES_SOCKET_IFNAME",
        "unset",
        "the network interface (e.g. eth1) every "
        "socket binds and advertises, like GLOO_SOCKET_IFNAME; default: the one that "
        "routes to the coordinator",
    ),
    Variable(
        "COLLECTIVES_BIND_HOST",
        "unset",
        "torch backend: the address its sockets bind "
        "(default: the interface that routes to MASTER_ADDR)",
    ),
    Variable(
        "COLLECTIVES_JOB_SECRET",
        "unset",
        "the job's secret (16 to 4096 characters): "
        "every socket is authenticated (CURVE) with keys derived from it; the launcher "
        "makes one per job when unset; ranks across hosts need it (docs/security.md)",
    ),
    Variable(
        "COLLECTIVES_JOB_SECRET_FILE",
        "unset",
        "a file holding the job's secret instead "
        "(owned by this user, not readable by group or others)",
    ),
    Variable(
        "COLLECTIVES_INSECURE",
        "0",
        "1: no authentication on any socket (one warning "
        "line): whoever reaches a port can join the job, read and forge its data",
    ),
    Variable(
        "XDG_RUNTIME_DIR",
        "unset",
        "where ranks of one user on one host share a "
        "generated secret when none is set (else the temp dir)",
    ),
)
