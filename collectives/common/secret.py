"""Sharing a generated job secret between the processes of one user on one host.

When no secret is set (COLLECTIVES_JOB_SECRET or _FILE) and authentication is not turned off,
whoever hosts the coordinator on this host generates a secret and writes it into a file only
this user can read -- as Jupyter shares a kernel's connection file -- named after what the
others know already (the coordinator's port, say), in a directory only this user can enter:
$XDG_RUNTIME_DIR/collectives, else <temp dir>/collectives-<uid>, else (another user took that
name first) one under this user's home (candidates()). The other ranks read it there.
A process of another user, or on another host, cannot; a rank whose coordinator is on another
host refuses to start without a secret (membership/init.py), so a job is never silently
unauthenticated across hosts.

Every check refuses rather than guesses: a directory or file of another owner, or one that
group or others may read or write, is an error naming it. A file records the pid that wrote it;
one whose writer is gone is stale (a crashed job's) and is not used.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
import socket
import stat
import tempfile
import time

from . import config

log = logging.getLogger("collectives")


def generate() -> bytes:
    """A fresh secret: 32 random bytes, hex (what COLLECTIVES_JOB_SECRET would hold)."""
    return secrets.token_hex(32).encode()


def candidates() -> list[str]:
    """Where this user's private directory may be, in the order every process tries them:
    $XDG_RUNTIME_DIR/collectives, <temp dir>/collectives-<uid>, and, should another user have
    taken that name first (any user may create it in a shared temp dir), one under this
    user's home that nobody else can create: ~/.cache/collectives-run/<host> (the host,
    because a home may be shared between hosts and a file names a pid)."""
    out = []
    base = config.runtime_dir()
    if base and os.path.isdir(base):
        out.append(os.path.join(base, "collectives"))
    out.append(os.path.join(tempfile.gettempdir(), f"collectives-{os.geteuid()}"))
    out.append(
        os.path.join(
            os.path.expanduser("~"),
            ".cache",
            "collectives-run",
            socket.gethostname() or "localhost",
        )
    )
    return out


def _private(path: str, create: bool) -> str | None:
    """None if `path` is a directory of this user's, mode 0700 (made so if missing and
    `create`); else why not."""
    if create:
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"{path}: cannot create it ({exc.strerror})"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return (
            f"{path} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o} "
            f"(must be this user's, {os.geteuid()}, mode 700)"
        )
    return None


_passed_over: set[str] = set()


def directory(create: bool = True) -> str:
    """This user's private directory for shared secrets: the first of candidates() that is
    (or, with `create`, can be made) this user's with mode 0700. One that is not -- another
    user's, or open to others -- is passed over with a warning, never used: every process of
    this user passes over the same ones, so they all meet in the same directory."""
    problems = []
    for path in candidates():
        problem = _private(path, create)
        if problem is None:
            if problems and path not in _passed_over:
                _passed_over.add(path)
                log.warning(
                    "not sharing the job secret through %s; using %s instead",
                    "; ".join(problems),
                    path,
                )
            return path
        problems.append(problem)
    raise ValueError(
        "refusing to share a job secret: " + "; ".join(problems) + "; set COLLECTIVES_JOB_SECRET"
    )


def _path(key: str) -> str:
    if not key or not all(c.isalnum() or c in "-_." for c in key):
        raise ValueError(f"bad secret file key {key!r}")
    return os.path.join(directory(), f"{key}.secret")


def publish(key: str, secret: bytes) -> str:
    """Write `secret` for the processes of this user on this host that know `key`; replaces
    a stale file of the same key atomically. Returns the file's path."""
    path = _path(key)
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"secret": secret.decode(), "pid": os.getpid()}, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read(key: str) -> bytes | None:
    """The secret published under `key`, or None if there is none (or only a stale one).
    ValueError if the file is not this user's alone."""
    path = _path(key)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read the shared job secret {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ValueError(
                f"refusing the shared job secret {path}: owned by uid "
                f"{st.st_uid} with mode {stat.S_IMODE(st.st_mode):o} (must be a "
                f"file of this user's, {os.geteuid()}, mode 600)"
            )
        raw = f.read(config.SECRET_MAX + 256)
    try:
        doc = json.loads(raw)
        value, pid = doc["secret"].encode(), int(doc["pid"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # being replaced, or not ours: treated as absent
    if not config.SECRET_MIN <= len(value) <= config.SECRET_MAX or not _alive(pid):
        return None
    return value


def wait(key: str, timeout: float, what: str) -> bytes:
    """read(key), waiting up to `timeout` s for it to appear. ValueError naming `what` (who
    should have published it) if it does not."""
    deadline = time.monotonic() + timeout
    while True:
        value = read(key)
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise ValueError(
                f"no job secret: COLLECTIVES_JOB_SECRET is not set, and {what} published none "
                f"in {directory()} within {timeout:g} s (is the port held by another program? "
                "Set COLLECTIVES_JOB_SECRET to the same value for every rank)"
            )
        time.sleep(0.05)


def unpublish(key: str, secret: bytes):
    """Remove the file of `key` if it still holds `secret` (not a later job's)."""
    try:
        if read(key) == secret:
            os.unlink(_path(key))
    except (OSError, ValueError):
        pass


def is_local(host: str) -> bool:
    """Whether every address `host` resolves to belongs to this host (and network namespace):
    a loopback address, or one this process can bind."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, sockaddr in infos:
        addr = sockaddr[0]
        try:
            if ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback:
                continue
        except ValueError:
            return False
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((addr, 0) if family == socket.AF_INET else (addr, 0, 0, sockaddr[3]))
        except OSError:
            return False
    return bool(infos)
