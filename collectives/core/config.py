"""The environment: every variable the library reads is read here, and nowhere else.

An explicit argument always wins over the environment. Each reader checks what it finds and
raises ValueError naming the variable ("COLLECTIVES_TRANSPORT='udp' is not one of auto, tcp,
ipc, shm"). VARIABLES is the table the README shows (tests/test_config.py keeps them equal).
The launcher (collectives/launch) sets these variables for its workers; it reads none.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

DEFAULT_HEARTBEAT_INTERVAL = 0.5   # 10 beats per timeout: one lost beat is never a death
DEFAULT_HEARTBEAT_TIMEOUT = 5.0    # torchft's default; a GC pause or a busy host is not a death
# Shared memory each rank offers for its outgoing payloads (0 turns it off); it is cut into
# slots of one segment each, and only the pages a payload has touched take memory.
DEFAULT_SHM_BYTES = 64 << 20
TRANSPORTS = ("auto", "tcp", "ipc", "shm")


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    meaning: str


VARIABLES = (
    Variable("RANK", "required", "this process's rank (set by the launcher, torchrun); a "
             "replacement worker leaves it unset and sets COLLECTIVES_JOIN=1"),
    Variable("WORLD_SIZE", "required", "the number of ranks"),
    Variable("MASTER_ADDR", "127.0.0.1", "host of the coordinator"),
    Variable("MASTER_PORT", "required", "port of the coordinator (MASTER_PORT + 1 under "
             "torchrun, whose store holds MASTER_PORT); 0 on rank 0: host the coordinator on "
             "any free port and print it"),
    Variable("TORCHELASTIC_RUN_ID", "unset", "set by torchrun: the coordinator is then at "
             "MASTER_PORT + 1"),
    Variable("COLLECTIVES_COORDINATOR", "unset", "host:port of the coordinator; wins over "
             "MASTER_ADDR and MASTER_PORT (the launcher sets it)"),
    Variable("COLLECTIVES_JOIN", "0", "1 (with RANK unset): wait to be admitted into a "
             "running job at its next reconstruct()"),
    Variable("COLLECTIVES_TRANSPORT", "auto", "auto, tcp, ipc or shm (ipc plus shared memory "
             "for large payloads)"),
    Variable("COLLECTIVES_SHM_BYTES", str(DEFAULT_SHM_BYTES), "bytes of shared memory each "
             "rank offers for its outgoing payloads; 0 turns it off"),
    Variable("COLLECTIVES_HEARTBEAT_INTERVAL", f"{DEFAULT_HEARTBEAT_INTERVAL:g}", "seconds "
             "between a worker's heartbeats"),
    Variable("COLLECTIVES_HEARTBEAT_TIMEOUT", f"{DEFAULT_HEARTBEAT_TIMEOUT:g}", "seconds "
             "without a heartbeat before the coordinator declares a rank dead (read where "
             "the coordinator runs)"),
    Variable("COLLECTIVES_FAULTS", "unset", "fault injection rules for generation 0, e.g. "
             "kill:2@op=7 (docs/faults.md)"),
    Variable("COLLECTIVES_BIND_HOST", "unset", "torch backend: the address its sockets bind "
             "(default: the interface that routes to MASTER_ADDR)"),
    Variable("COLLECTIVES_JOB_SECRET", "unset", "the job's secret (16 to 4096 characters): "
             "every socket is authenticated (CURVE) with keys derived from it; the launcher "
             "makes one per job when unset; ranks across hosts need it (docs/security.md)"),
    Variable("COLLECTIVES_JOB_SECRET_FILE", "unset", "a file holding the job's secret instead "
             "(owned by this user, not readable by group or others)"),
    Variable("COLLECTIVES_INSECURE", "0", "1: no authentication on any socket (one warning "
             "line): whoever reaches a port can join the job, read and forge its data"),
    Variable("XDG_RUNTIME_DIR", "unset", "where ranks of one user on one host share a "
             "generated secret when none is set (else the temp dir)"),
)
_NAMES = frozenset(v.name for v in VARIABLES)


def _get(name: str) -> str | None:
    assert name in _NAMES, name     # every variable read is in the table
    return os.environ.get(name)


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


def required_int(name: str, value=None) -> int:
    """`value` if given, else $name (RANK, WORLD_SIZE, MASTER_PORT): an integer."""
    if value is not None:
        return int(value)
    raw = _get(name)
    if raw is None:
        raise ValueError(f"init_process_group: {name.lower()} not given and ${name} is not set "
                         "(launch with `python -m collectives.launch` or torchrun, or pass it)")
    return _int(name, raw)


def join_requested(rank=None) -> bool:
    """A replacement worker: no rank given, $RANK unset and $COLLECTIVES_JOIN set (not 0)."""
    return rank is None and _get("RANK") is None and \
        (_get("COLLECTIVES_JOIN") or "") not in ("", "0")


def transport(value: str | None = None) -> str:
    name = value if value is not None else (_get("COLLECTIVES_TRANSPORT") or "auto")
    if name not in TRANSPORTS:
        where = "transport" if value is not None else "$COLLECTIVES_TRANSPORT"
        raise ValueError(f"{where}={name!r} is not one of {', '.join(TRANSPORTS)}")
    return name


def heartbeat_interval(value: float | None = None) -> float:
    return _seconds("COLLECTIVES_HEARTBEAT_INTERVAL", "heartbeat_interval", value,
                    DEFAULT_HEARTBEAT_INTERVAL)


def heartbeat_timeout(value: float | None = None) -> float:
    return _seconds("COLLECTIVES_HEARTBEAT_TIMEOUT", "heartbeat_timeout", value,
                    DEFAULT_HEARTBEAT_TIMEOUT)


def shm_bytes() -> int:
    raw = _get("COLLECTIVES_SHM_BYTES") or ""
    try:
        return max(0, int(raw)) if raw else DEFAULT_SHM_BYTES
    except ValueError:
        raise ValueError(f"COLLECTIVES_SHM_BYTES must be a number of bytes, got {raw!r}") from None


def fault_spec() -> str:
    """$COLLECTIVES_FAULTS, or "" (its rules are checked by transport/faults.py's parse)."""
    return _get("COLLECTIVES_FAULTS") or ""


def bind_host() -> str | None:
    return _get("COLLECTIVES_BIND_HOST") or None


def master_addr() -> str | None:
    return _get("MASTER_ADDR") or None


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
        host = master_addr or _get("MASTER_ADDR") or "127.0.0.1"
        port = required_int("MASTER_PORT", master_port)
        if master_port is None and port and _get("TORCHELASTIC_RUN_ID"):
            port += 1   # torchrun's TCPStore holds MASTER_PORT itself
    if not 0 <= port < 65536:
        raise ValueError(f"init_process_group: master_port {port} is not a TCP port")
    return host, port


SECRET_MIN, SECRET_MAX = 16, 4096   # characters (bytes) of a job secret


def _check_secret(where: str, secret: bytes) -> bytes:
    if not SECRET_MIN <= len(secret) <= SECRET_MAX:
        raise ValueError(f"{where} must hold {SECRET_MIN} to {SECRET_MAX} characters, got "
                         f"{len(secret)} (make one with: python -c 'import secrets; "
                         "print(secrets.token_hex(32))')")
    return secret


def job_secret() -> bytes | None:
    """The job's secret from $COLLECTIVES_JOB_SECRET or the file $COLLECTIVES_JOB_SECRET_FILE
    names (not both), or None. The file must be a regular file owned by this user and not
    readable or writable by group or others (as ssh demands of a private key); surrounding
    whitespace (a trailing newline) is not part of the secret."""
    raw, path = _get("COLLECTIVES_JOB_SECRET"), _get("COLLECTIVES_JOB_SECRET_FILE")
    if raw and path:
        raise ValueError("$COLLECTIVES_JOB_SECRET and $COLLECTIVES_JOB_SECRET_FILE are both "
                         "set; set one")
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
            raise ValueError(f"{where} is owned by uid {st.st_uid}, not by this user "
                             f"({os.geteuid()})")
        if st.st_mode & 0o077:
            raise ValueError(f"{where} is readable or writable by others (mode "
                             f"{stat.S_IMODE(st.st_mode):o}); chmod 600 it")
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
