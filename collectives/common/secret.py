"""Sharing a generated job secret between the processes of one user on one host.

When no secret is set (COLLECTIVES_JOB_SECRET or _FILE) and authentication is not turned off,
whoever hosts the coordinator on this host generates a secret and writes it into a file only
this user can read -- as Jupyter shares a kernel's connection file -- named after what the
others know already (the coordinator's port, say), in a directory only this user can enter:
$XDG_RUNTIME_DIR/collectives, else <temp dir>/collectives-<uid>. The other ranks read it there.
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
import os
import secrets
import socket
import stat
import tempfile
import time

from . import config


def generate() -> bytes:
    """A fresh secret: 32 random bytes, hex (what COLLECTIVES_JOB_SECRET would hold)."""
    return secrets.token_hex(32).encode()


def directory(create: bool = True) -> str:
    """This user's private directory for shared secrets (checked: ours, mode 0700)."""
    base = config.runtime_dir()
    if base and os.path.isdir(base):
        path = os.path.join(base, "collectives")
    else:
        path = os.path.join(tempfile.gettempdir(), f"collectives-{os.geteuid()}")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"refusing to share a job secret through {path}: not a directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ValueError(f"refusing to share a job secret through {path}: owned by uid "
                         f"{st.st_uid} with mode {stat.S_IMODE(st.st_mode):o} (must be this "
                         f"user's, {os.geteuid()}, mode 700); remove it, or set "
                         "COLLECTIVES_JOB_SECRET")
    return path


def _path(key: str) -> str:
    if not key or not all(c.isalnum() or c in "-_." for c in key):
        raise ValueError(f"bad secret file key {key!r}")
    return os.path.join(directory(), f"{key}.secret")


def publish(key: str, secret: bytes) -> str:
    """Write `secret` for the processes of this user on this host that know `key`; replaces
    a stale file of the same key atomically. Returns the file's path."""
    path = _path(key)
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 0o600)
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
            raise ValueError(f"refusing the shared job secret {path}: owned by uid "
                             f"{st.st_uid} with mode {stat.S_IMODE(st.st_mode):o} (must be a "
                             f"file of this user's, {os.geteuid()}, mode 600)")
        raw = f.read(config.SECRET_MAX + 256)
    try:
        doc = json.loads(raw)
        value, pid = doc["secret"].encode(), int(doc["pid"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None       # being replaced, or not ours: treated as absent
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
                "Set COLLECTIVES_JOB_SECRET to the same value for every rank)")
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
