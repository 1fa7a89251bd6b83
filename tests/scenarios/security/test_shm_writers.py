"""Shared memory cannot be written by anyone but its owner (docs/security.md, transport/shm.py).

Invariant: while two ranks sum through shared memory (transport shm: arenas, return pages), a
process of the same user that does not hold the job secret finds every one of their memfds in
/proc/<pid>/fd and tries every way in -- write(2) through a read-write open, a shared writable
mapping, a hole punched with fallocate -- again and again, and every attempt (each one is
recorded) is refused with EPERM; an attacker that dies is a failure; every element of every
sum stays n(n+1)/2 exactly. (Writing another process's memory through ptrace or /proc/<pid>/mem
stays open to the same user; docs/security.md says so.)
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
import time

import pytest

from support.security_world import SECRET, Procs, base_env, finish, start_world, wait_json
from support.timing import scaled

FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x1, 0x2
REFUSED = {"write": errno.EPERM, "mmap": errno.EPERM, "punch": errno.EPERM}
_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


def memfds(pid: int) -> list[str]:
    """/proc paths of the library's memfds that process `pid` holds."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:collectives-"):
                found.append(path)
        except OSError:
            pass  # closed meanwhile
    return found


def try_writes(path: str) -> dict:
    """Every way to change the memfd at `path`: {way: errno or 0 if it worked}."""
    out = {}
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise  # closed meanwhile: not an attempt
    except OSError as exc:
        return {"open": exc.errno}
    try:
        size = os.fstat(fd).st_size
        try:
            out["write"] = 0 if os.pwrite(fd, b"\x7f" * 4096, 4096) else -1
        except OSError as exc:
            out["write"] = exc.errno
        try:
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
            at = 4096 if size >= 8192 else 0  # slot 0 of an arena; a return page's counts
            mm[at : at + 4096] = b"\x7f" * 4096
            mm.close()
            out["mmap"] = 0
        except OSError as exc:
            out["mmap"] = exc.errno
        except (ValueError, IndexError) as exc:  # empty (not sized yet), or smaller than that
            out["mmap"] = f"{type(exc).__name__}: {exc} (size {size})"
        rc = _libc.fallocate(
            fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, ctypes.c_long(0), ctypes.c_long(size)
        )
        out["punch"] = 0 if rc == 0 else ctypes.get_errno()
    finally:
        os.close(fd)
    return out


@pytest.mark.timeout(120)
def test_a_same_uid_writer_gets_eperm_and_the_sums_stay_exact(procs, tmp_path):
    env = base_env(
        COLLECTIVES_JOB_SECRET=SECRET,
        COLLECTIVES_TRANSPORT="shm",
        COLLECTIVES_FAST_LINKS="0",
        TEST_ROUNDS="60",
        TEST_COUNT=str(1 << 16),
    )
    start_world(procs, tmp_path, 2, "sum", env)
    pids = [
        wait_json(tmp_path / f"rank{r}.addr.json", 60, procs, f"rank{r}")["pid"] for r in range(2)
    ]
    # every attempt, in order: (memfd, what each way gave); one that got in is never hidden
    # behind a later refusal of the same memfd
    tried: list[tuple[str, dict]] = []
    died: list[str] = []  # the attacker's end, if anything but the stop ended it
    stop = threading.Event()

    def attack():
        try:
            while not stop.is_set():
                for pid in pids:
                    try:
                        paths = memfds(pid)
                    except FileNotFoundError:
                        continue  # the rank exited
                    for path in paths:
                        try:
                            name = os.readlink(path)
                            tried.append((name, try_writes(path)))
                        except FileNotFoundError:
                            pass  # closed meanwhile
                stop.wait(0.01)
        except BaseException as exc:  # the attack must not end in silence
            died.append(f"{type(exc).__name__}: {exc}")

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    try:
        # attacks already under way when the sums start (each pass takes milliseconds)
        deadline = time.monotonic() + scaled(30)
        while len(tried) < 8 and not died:
            assert time.monotonic() < deadline, f"{len(tried)} attempts in 30 s"
            time.sleep(0.01)
        during = len(tried)
        (tmp_path / "go").touch()
        for r in range(2):
            procs.wait(f"rank{r}", 90)
    finally:
        stop.set()
        attacker.join(scaled(10))
    assert not attacker.is_alive(), "the attacker did not stop"
    assert not died, f"the attacker died: {died[0]}"
    got_in = [(name, ways) for name, ways in tried if ways != REFUSED]
    assert not got_in, f"{len(got_in)} of {len(tried)} attempts were not refused: {got_in[:5]}"
    names = {name for name, _ in tried}
    arenas = [k for k in names if k.startswith("/memfd:collectives-arena-")]
    returns = [k for k in names if k.startswith("/memfd:collectives-ret-")]
    assert len(arenas) == 2 and len(returns) == 2, sorted(names)
    assert len(tried) > during, "no attempt while the ranks summed"
    print(f"{len(tried)} attempts on {len(names)} memfds, every one refused")
    finish(procs, tmp_path, 2)  # every rank exited 0, every element exact
