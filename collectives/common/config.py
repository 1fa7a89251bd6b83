"""The environment: every variable the library reads is read here, and nowhere else.

An explicit argument always wins over the environment. Each reader checks what it finds and
raises ValueError naming the variable ("COLLECTIVES_TRANSPORT='udp' is not one of auto, tcp,
ipc, shm"). VARIABLES (variables.py) is the table docs/configuration.md shows.
The launcher (collectives/launch) sets these variables for its workers; it reads none.
"""

from __future__ import annotations

import logging
import os
import sys
import stat

from .variables import (
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HEARTBEAT_TIMEOUT,  # noqa: F401
    DEFAULT_SHM_BYTES,
    DEFAULT_SMALL_SPIN_US,
    DEFAULT_SMALL_YIELD_US,
    GRACE_TIMEOUTS,
    TRANSPORTS,
    VARIABLES,
    Variable,
)

_NAMES = frozenset(v.name for v in VARIABLES)


def _get(name: str) -> str | None:
    assert name in _NAMES, name  # every variable read is in the table
    return os.environ.get(name)


def in_effect() -> list[tuple[Variable, str | None]]:
    """Every variable of the table with its value now (None: unset), for the report."""
    return [(v, os.environ.get(v.name)) for v in VARIABLES]


def is_set(name: str) -> bool:
    return _get(name) is not None


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"${name}={raw!r} is not an integer") from None


def _seconds(name: str, arg: str, value, default: float) -> float:
    """`value` (the argument `arg`) if given, else $name, else `default`: seconds > 0."""
    raw = _get(name) if value is None else value
    if raw is None or raw == "":
        return default
    where = f"${name}" if value is None else arg
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{where}={raw!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"{where} must be > 0 seconds, got {seconds:g}")
    return seconds


# Where each launcher puts a process's place in the job, in the order they are believed:
# torchrun and our launcher, then Open MPI's mpirun, MPICH's mpiexec (Hydra), Slurm's srun.
LAUNCHER_NAMES = {
    "RANK": ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"),
    "WORLD_SIZE": ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"),
    "LOCAL_RANK": ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"),
}


def launcher_int(what: str, value=None) -> int | None:
    """`value` if given, else the first of LAUNCHER_NAMES[what] that is set (an integer), else
    None: RANK, WORLD_SIZE or LOCAL_RANK from whichever launcher started this process."""
    if value is not None:
        return int(value)
    for name in LAUNCHER_NAMES[what]:
        raw = _get(name)
        if raw is not None and raw.strip() != "":
            return _int(name, raw)
    return None


def required_launcher_int(what: str, value=None) -> int:
    found = launcher_int(what, value)
    if found is None:
        raise ValueError(
            f"init_process_group: {what.lower()} not given and none of "
            f"{', '.join('$' + n for n in LAUNCHER_NAMES[what])} is set (launch "
            "with `python -m collectives.launch`, torchrun, mpiexec or srun, or "
            "pass it)"
        )
    return found


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list, expanded: "node[01-03,07],gpu1" -> node01, node02,
    node03, node07, gpu1 (ranges keep their zero padding; several bracket groups in one
    name multiply out, as Slurm's)."""
    hosts, depth, start = [], 0, 0
    for i, c in enumerate(nodelist + ","):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"SLURM_JOB_NODELIST={nodelist!r}: unbalanced ']'")
        elif c == "," and depth == 0:
            if i > start:
                hosts += _expand_name(nodelist[start:i], nodelist)
            start = i + 1
    if depth:
        raise ValueError(f"SLURM_JOB_NODELIST={nodelist!r}: unbalanced '['")
    return hosts


def _expand_name(name: str, whole: str) -> list[str]:
    open_at = name.find("[")
    if open_at < 0:
        return [name]
    close_at = name.index("]", open_at)
    head, body, tail = name[:open_at], name[open_at + 1 : close_at], name[close_at + 1 :]
    out = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"SLURM_JOB_NODELIST={whole!r}: cannot read the range {part!r}")
        values = range(int(lo), int(hi if sep else lo) + 1)
        if sep and int(hi) < int(lo):
            raise ValueError(f"SLURM_JOB_NODELIST={whole!r}: the range {part!r} runs backwards")
        out += [f"{head}{v:0{len(lo)}d}" for v in values]
    return [h + t for h in out for t in _expand_name(tail, whole)]


def required_int(name: str, value=None) -> int:
    """`value` if given, else $name (RANK, WORLD_SIZE, MASTER_PORT): an integer."""
    if value is not None:
        return int(value)
    raw = _get(name)
    if raw is None:
        raise ValueError(
            f"init_process_group: {name.lower()} not given and ${name} is not set "
            "(launch with `python -m collectives.launch` or torchrun, or pass it)"
        )
    return _int(name, raw)


def join_requested(rank=None) -> bool:
    """A replacement worker: no rank given, none from a launcher, and $COLLECTIVES_JOIN set."""
    return (
        rank is None
        and launcher_int("RANK") is None
        and (_get("COLLECTIVES_JOIN") or "") not in ("", "0")
    )


def spare_requested() -> bool:
    """$COLLECTIVES_SPARE=1: this joiner is a warm spare (membership/formation.py)."""
    raw = (_get("COLLECTIVES_SPARE") or "0").strip()
    if raw not in ("0", "1"):
        raise ValueError(f"COLLECTIVES_SPARE must be 0 or 1, got {raw!r}")
    return raw == "1"


def transport(value: str | None = None) -> str:
    name = value if value is not None else (_get("COLLECTIVES_TRANSPORT") or "auto")
    if name not in TRANSPORTS:
        where = "transport" if value is not None else "$COLLECTIVES_TRANSPORT"
        raise ValueError(f"{where}={name!r} is not one of {', '.join(TRANSPORTS)}")
    return name


def heartbeat_interval(value: float | None = None) -> float:
    return _seconds(
        "COLLECTIVES_HEARTBEAT_INTERVAL", "heartbeat_interval", value, DEFAULT_HEARTBEAT_INTERVAL
    )


def heartbeat_timeout(value: float | None = None) -> float:
    return _seconds(
        "COLLECTIVES_HEARTBEAT_TIMEOUT", "heartbeat_timeout", value, DEFAULT_HEARTBEAT_TIMEOUT
    )


def coordinator_grace(value: float | None = None, heartbeat_timeout: float | None = None) -> float:
    """Seconds without the coordinator before a member gives up (CoordinatorLost)."""
    return _seconds(
        "COLLECTIVES_COORDINATOR_GRACE",
        "coordinator_grace",
        value,
        GRACE_TIMEOUTS * (heartbeat_timeout or DEFAULT_HEARTBEAT_TIMEOUT),
    )


def shm_bytes() -> int:
    raw = _get("COLLECTIVES_SHM_BYTES") or ""
    try:
        return max(0, int(raw)) if raw else DEFAULT_SHM_BYTES
    except ValueError:
        raise ValueError(f"COLLECTIVES_SHM_BYTES must be a number of bytes, got {raw!r}") from None


def fast_links() -> bool:
    """$COLLECTIVES_FAST_LINKS: small messages to same-host ranks bypass ZeroMQ (default on)."""
    raw = (_get("COLLECTIVES_FAST_LINKS") or "1").strip()
    if raw not in ("0", "1"):
        raise ValueError(f"COLLECTIVES_FAST_LINKS must be 0 or 1, got {raw!r}")
    return raw == "1"


def small_spin() -> float:
    """$COLLECTIVES_SMALL_SPIN, in seconds: how long a small receive may read its peer's fast
    link before it sleeps in a poll, where its host has a CPU for every rank (0: never)."""
    return _microseconds("COLLECTIVES_SMALL_SPIN", DEFAULT_SMALL_SPIN_US, 1000.0)


def small_yield() -> float:
    """$COLLECTIVES_SMALL_YIELD, in seconds: how long a small receive may read its peer's fast
    link, yielding its CPU between reads, before it sleeps in a poll, where its host runs more
    ranks than it has CPUs (0: never)."""
    return _microseconds("COLLECTIVES_SMALL_YIELD", DEFAULT_SMALL_YIELD_US, 10000.0)


def _microseconds(name: str, default_us: float, most_us: float) -> float:
    """$name, a number of microseconds from 0 to most_us, in seconds; default_us if unset."""
    raw = (_get(name) or "").strip()
    if not raw:
        return default_us * 1e-6
    try:
        us = float(raw)
    except ValueError:
        us = -1.0
    if not 0.0 <= us <= most_us:
        raise ValueError(
            f"{name} must be a number of microseconds from 0 to {most_us:g}, got {raw!r}"
        )
    return us * 1e-6


def crowded_schedules() -> bool:
    """$COLLECTIVES_CROWDED: whether this rank lets its group use the crowded-host schedules
    (default auto: where its hosts are crowded)."""
    raw = (_get("COLLECTIVES_CROWDED") or "auto").strip()
    if raw not in ("auto", "0"):
        raise ValueError(f"COLLECTIVES_CROWDED must be auto or 0, got {raw!r}")
    return raw == "auto"


FAILURE_DETECTORS = ("exit", "connection", "pidfd")


def failure_detection(value=None) -> frozenset:
    """$COLLECTIVES_FAILURE_DETECTION: the crash detectors the coordinator uses besides
    heartbeats (default all of FAILURE_DETECTORS); "none" for heartbeats alone."""
    raw = value if value is not None else _get("COLLECTIVES_FAILURE_DETECTION")
    if raw is None:
        return frozenset(FAILURE_DETECTORS)
    if isinstance(raw, str):
        raw = [] if raw.strip() in ("", "none") else [w.strip() for w in raw.split(",")]
    bad = [w for w in raw if w not in FAILURE_DETECTORS]
    if bad:
        raise ValueError(
            f"COLLECTIVES_FAILURE_DETECTION must be a comma list of "
            f"{', '.join(FAILURE_DETECTORS)} or none, got {', '.join(bad)}"
        )
    return frozenset(raw)


def fault_spec() -> str:
    """$COLLECTIVES_FAULTS, or "" (its rules are checked by transport/faults.py's parse)."""
    return _get("COLLECTIVES_FAULTS") or ""


def gloo_order() -> bool:
    """$COLLECTIVES_GLOO_ORDER: the torch backend sums floats in Gloo's order (default 0)."""
    raw = (_get("COLLECTIVES_GLOO_ORDER") or "0").strip()
    if raw not in ("0", "1"):
        raise ValueError(f"COLLECTIVES_GLOO_ORDER must be 0 or 1, got {raw!r}")
    return raw == "1"


def torch_elastic() -> bool:
    """$COLLECTIVES_TORCH_ELASTIC: the torch backend's default group joins the job's
    coordinator, so that dist.shrink_group and collectives.torch.reconfigure work, as NCCL's
    shrink_group needs no setting. Unset: elastic wherever the job names where a coordinator
    is (COLLECTIVES_COORDINATOR, or MASTER_PORT: env:// and torchrun), not elsewhere (file://
    and tcp:// name neither); 0: rendezvous through torch's store alone, no port but torch's."""
    raw = (_get("COLLECTIVES_TORCH_ELASTIC") or "").strip()
    if not raw:
        return bool(_get("COLLECTIVES_COORDINATOR") or _get("MASTER_PORT"))
    if raw not in ("0", "1"):
        raise ValueError(f"COLLECTIVES_TORCH_ELASTIC must be 0 or 1, got {raw!r}")
    return raw == "1"


FAILSLOW_POLICIES = ("report", "reroute", "replace", "shrink")


def failslow_policy(value: str | None = None) -> str:
    """$COLLECTIVES_FAILSLOW_POLICY: what the coordinator does with a slow link (default
    reroute; membership/reroute.py)."""
    raw = (value if value is not None else _get("COLLECTIVES_FAILSLOW_POLICY") or "reroute").strip()
    if raw not in FAILSLOW_POLICIES:
        raise ValueError(
            f"COLLECTIVES_FAILSLOW_POLICY={raw!r} is not one of {', '.join(FAILSLOW_POLICIES)}"
        )
    return raw


def failslow_min_world(world_size: int, policy: str | None = None) -> int:
    """$COLLECTIVES_FAILSLOW_MIN_WORLD: the fewest ranks a job removing slow NICs goes on
    with (policy shrink, or replace falling back to it); default 1. Refused where it is not
    1..world_size, or where the policy never removes a rank without a spare."""
    raw = (_get("COLLECTIVES_FAILSLOW_MIN_WORLD") or "").strip()
    if not raw:
        return 1
    least = _int("COLLECTIVES_FAILSLOW_MIN_WORLD", raw)
    if not 1 <= least <= world_size:
        raise ValueError(
            f"COLLECTIVES_FAILSLOW_MIN_WORLD={least} is not between 1 and the job's "
            f"{world_size} ranks"
        )
    policy = failslow_policy(policy)
    if policy != "shrink" and failslow_spare_wait(policy) is None:
        raise ValueError(
            f"COLLECTIVES_FAILSLOW_MIN_WORLD={least} is set, but COLLECTIVES_FAILSLOW_POLICY="
            f"{policy} never shrinks the job (shrink does; replace does with "
            "COLLECTIVES_FAILSLOW_SPARE_WAIT)"
        )
    return least


def failslow_spare_wait(policy: str | None = None) -> float | None:
    """$COLLECTIVES_FAILSLOW_SPARE_WAIT: under policy replace, seconds a slow NIC waits for a
    spare before its rank is removed without one (the job shrinks); unset: it waits for good.
    Refused where not a number of seconds > 0, or under another policy."""
    raw = (_get("COLLECTIVES_FAILSLOW_SPARE_WAIT") or "").strip()
    if not raw:
        return None
    wait = _seconds("COLLECTIVES_FAILSLOW_SPARE_WAIT", "", None, 0.0)
    policy = failslow_policy(policy)
    if policy != "replace":
        raise ValueError(
            f"COLLECTIVES_FAILSLOW_SPARE_WAIT={raw} is set, but only policy replace waits for "
            f"a spare (COLLECTIVES_FAILSLOW_POLICY={policy})"
        )
    return wait


def link_probes() -> bool:
    """$COLLECTIVES_LINK_PROBES: whether this rank probes its links when a stall diagnosis
    asks (membership/probing.py); default 1."""
    raw = (_get("COLLECTIVES_LINK_PROBES") or "1").strip()
    if raw not in ("0", "1"):
        raise ValueError(f"COLLECTIVES_LINK_PROBES must be 0 or 1, got {raw!r}")
    return raw == "1"


def child_environment(drop: tuple = ()) -> dict:
    """A copy of this process's environment for a child it starts, without the variables
    whose names begin with one of `drop` (teaching/failures.py: its workers get a job of
    their own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop))}


def fault_scope() -> str:
    """$COLLECTIVES_FAULTS_SCOPE: generation0 (default) or process (transport/faults.py)."""
    raw = (_get("COLLECTIVES_FAULTS_SCOPE") or "generation0").strip()
    if raw not in ("generation0", "process"):
        raise ValueError(f"COLLECTIVES_FAULTS_SCOPE must be generation0 or process, got {raw!r}")
    return raw


DEBUG_LEVELS = ("WARN", "INFO", "TRACE")


def debug_level() -> str | None:
    """$COLLECTIVES_DEBUG (WARN, INFO or TRACE, any case), or None when unset or empty."""
    raw = (_get("COLLECTIVES_DEBUG") or "").strip().upper()
    if not raw:
        return None
    if raw not in DEBUG_LEVELS:
        raise ValueError(f"COLLECTIVES_DEBUG={raw!r} is not one of {', '.join(DEBUG_LEVELS)}")
    return raw


PROGRESS_STYLES = ("bar", "lines", "off")


def progress_style(stream=None) -> str:
    """$COLLECTIVES_PROGRESS, else "bar" where `stream` (stderr) is a terminal, else "lines":
    a bar redrawn with carriage returns is one endless line in a log file."""
    raw = _get("COLLECTIVES_PROGRESS")
    if raw:
        if raw not in PROGRESS_STYLES:
            raise ValueError(
                f"COLLECTIVES_PROGRESS={raw!r} is not one of {', '.join(PROGRESS_STYLES)}"
            )
        return raw
    stream = stream if stream is not None else sys.stderr
    try:
        return "bar" if stream.isatty() else "lines"
    except (AttributeError, ValueError):  # closed, or not a real stream
        return "lines"


def socket_ifname(value: str | None = None) -> str | None:
    """The interface every socket binds and advertises (like GLOO_SOCKET_IFNAME), or None:
    the one that routes to the coordinator."""
    return value or _get("COLLECTIVES_SOCKET_IFNAME") or None


def bind_host() -> str | None:
    return _get("COLLECTIVES_BIND_HOST") or None


def master_addr() -> str | None:
    """$MASTER_ADDR, else under Slurm the job's first host."""
    return _master_addr_from_env()


def _master_addr_from_env() -> str | None:
    explicit = _get("MASTER_ADDR")
    if explicit:
        return explicit
    nodelist = _get("SLURM_JOB_NODELIST") or _get("SLURM_NODELIST")
    if nodelist:
        hosts = expand_nodelist(nodelist)
        return hosts[0] if hosts else None
    return None


def coordinator_address(master_addr=None, master_port=None) -> tuple[str, int]:
    """(host, port) of the coordinator: $COLLECTIVES_COORDINATOR unless an address is given,
    else MASTER_ADDR:MASTER_PORT (+ 1 under torchrun). Port 0: any free port, which only
    rank 0, hosting the coordinator, can use."""
    explicit = _get("COLLECTIVES_COORDINATOR")
    if explicit and master_addr is None and master_port is None:
        host, sep, port = explicit.rpartition(":")
        if not sep or not host:
            raise ValueError(f"$COLLECTIVES_COORDINATOR={explicit!r} is not host:port")
        port = _int("COLLECTIVES_COORDINATOR", port)
    else:
        host = master_addr or _master_addr_from_env() or "127.0.0.1"
        port = required_int("MASTER_PORT", master_port)
        if master_port is None and port and _get("TORCHELASTIC_RUN_ID"):
            port += 1  # torchrun's TCPStore holds MASTER_PORT itself
    if not 0 <= port < 65536:
        raise ValueError(f"init_process_group: master_port {port} is not a TCP port")
    return host, port


def coordinator_named() -> bool:
    """Whether $COLLECTIVES_COORDINATOR names the job's coordinator (the launcher sets it)."""
    return bool(_get("COLLECTIVES_COORDINATOR"))


def torchrun_restart() -> int:
    """$TORCHELASTIC_RESTART_COUNT: how many times torchrun restarted the workers (0 outside
    torchrun)."""
    raw = (_get("TORCHELASTIC_RESTART_COUNT") or "0").strip()
    return _int("TORCHELASTIC_RESTART_COUNT", raw)


def torch_coordinator_address() -> tuple[str, int]:
    """(host, port) of the coordinator of an elastic torch job (COLLECTIVES_TORCH_ELASTIC):
    $COLLECTIVES_COORDINATOR if set (the launcher sets it), else MASTER_ADDR:MASTER_PORT + 1,
    since torch's own store holds MASTER_PORT (under env:// and torchrun alike)."""
    host, port = coordinator_address()
    if not _get("COLLECTIVES_COORDINATOR") and not _get("TORCHELASTIC_RUN_ID"):
        port += 1  # coordinator_address() added it under torchrun already
    return host, port


SECRET_MIN, SECRET_MAX = 16, 4096  # characters (bytes) of a job secret


def _check_secret(where: str, secret: bytes) -> bytes:
    if not SECRET_MIN <= len(secret) <= SECRET_MAX:
        raise ValueError(
            f"{where} must hold {SECRET_MIN} to {SECRET_MAX} characters, got "
            f"{len(secret)} (make one with: python -c 'import secrets; "
            "print(secrets.token_hex(32))')"
        )
    return secret


def job_secret() -> bytes | None:
    """The job's secret from $COLLECTIVES_JOB_SECRET or the file $COLLECTIVES_JOB_SECRET_FILE
    names (not both), or None. The file must be a regular file owned by this user and not
    readable or writable by group or others (as ssh demands of a private key); surrounding
    whitespace (a trailing newline) is not part of the secret."""
    raw, path = _get("COLLECTIVES_JOB_SECRET"), _get("COLLECTIVES_JOB_SECRET_FILE")
    if raw and path:
        raise ValueError(
            "$COLLECTIVES_JOB_SECRET and $COLLECTIVES_JOB_SECRET_FILE are both set; set one"
        )
    if raw:
        return _check_secret("$COLLECTIVES_JOB_SECRET", raw.strip().encode())
    if not path:
        return None
    where = f"$COLLECTIVES_JOB_SECRET_FILE={path!r}"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ValueError(f"{where} cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{where} is not a regular file")
        if st.st_uid != os.geteuid():
            raise ValueError(
                f"{where} is owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
            )
        if st.st_mode & 0o077:
            raise ValueError(
                f"{where} is readable or writable by others (mode "
                f"{stat.S_IMODE(st.st_mode):o}); chmod 600 it"
            )
        data = f.read(SECRET_MAX + 2)
    return _check_secret(where, data.strip())


def insecure() -> bool:
    """$COLLECTIVES_INSECURE: 1 turns authentication off; 0 or unset keeps it."""
    raw = (_get("COLLECTIVES_INSECURE") or "0").strip()
    if raw not in ("0", "1"):
        raise ValueError(f"$COLLECTIVES_INSECURE={raw!r} must be 0 or 1")
    return raw == "1"


def runtime_dir() -> str | None:
    """$XDG_RUNTIME_DIR (a per-user directory, mode 0700, on most Linux desktops), or None."""
    return _get("XDG_RUNTIME_DIR") or None


_nofile_raised = False


def open_files_limit() -> int | None:
    """This process's soft limit on open files; None if unlimited or unknown."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def raise_open_files() -> tuple[int, int] | None:
    """Raise this process's soft limit on open files to its hard limit, once, and log it;
    (old, new) if it was raised. Every connection to a coordinator or a rank costs a file
    descriptor until its handshake ends: at the usual soft limit of 1,024, a few hundred idle
    connections from anyone who can reach a port left a rank unable to open the sockets of its
    next generation (docs/security.md, "Bounds")."""
    global _nofile_raised
    if _nofile_raised:
        return None
    _nofile_raised = True
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else soft
        if soft == resource.RLIM_INFINITY or soft >= hard:
            return None
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError) as exc:
        logging.getLogger("collectives").info("open-file limit left as it is: %s", exc)
        return None
    logging.getLogger("collectives").info(
        "raised the open-file limit from %d to %d (the hard limit)", soft, hard
    )
    return soft, hard


def open_files() -> tuple[int, int]:
    """(file descriptors this process has open, its soft limit); -1 where unknown."""
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:  # none left to list them with
        used = -1
    try:
        import resource

        return used, resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError):
        return used, -1
