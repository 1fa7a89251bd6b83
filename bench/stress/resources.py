"""What a long run must not leak, sampled in one process (bench/stress/soak.py, bench/stress/chaos.py).

sample(pg) reads, for this process: open fds (/proc/self/fd), threads (/proc/self/task, which
also counts ZeroMQ's and torch's), private RSS (RssAnon: the shared-memory arenas' pages are
RssShmem and fill up as slots are first used, which is not a leak; "shm_slots" and "arenas"
watch them instead), shared-memory slots of its arena not yet handed
back (transport/zmq/shm.py), arenas mapped (its own and its peers': memfd mappings in
/proc/self/maps), the ipc endpoints it has bound (its sockets named collectives-*.ipc in
/proc/net/unix: abstract names on Linux, transport/zmq/transport.py; one per transport not closed), and
files of /dev/shm it holds open or mapped. The last two count only this process's own: other
jobs on the machine create and remove theirs at any time.

BOUNDS is the growth allowed between the middle and the end of a run (end - middle).
"""

from __future__ import annotations

import glob
import os

# growth allowed from the middle sample to the end one; why each is what it is:
BOUNDS = {
    "fds": 2,  # none expected; 2 for a lazily opened file (e.g. a log) at the end
    "threads": 0,  # a thread per group or op that outlives it is the classic slow leak
    "rss_mib": 64,  # private memory (RssAnon): allocator noise and numpy/torch caches;
    # a leak of 4 MiB buffers over thousands of ops is far past it
    "shm_slots": 0,  # at a quiet point every slot must be back (a lost one never returns)
    "arenas": 0,  # memfd mappings: one per arena, ours and our peers'
    "ipc_endpoints": 0,
    "dev_shm": 0,
}
FIELDS = list(BOUNDS)


def _arena(pg):
    t = getattr(pg, "transport", None)
    while t is not None and not hasattr(t, "arena") and hasattr(t, "inner"):
        t = t.inner
    return getattr(getattr(t, "sender", None), "arena", None)


def thread_names() -> dict:
    """name -> count of this process's threads (as the kernel names them: ZeroMQ's are
    ZMQbg/..., Python's all "python"), and of Python's own threads by their names: to say
    what a thread count that grew is made of."""
    out: dict = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        out[name] = out.get(name, 0) + 1
    import threading

    for t in threading.enumerate():
        out[f"py:{t.name}"] = out.get(f"py:{t.name}", 0) + 1
    return out


def fd_kinds() -> dict:
    """kind -> count of this process's open fds (socket, anon_inode:[eventfd], pipe, memfd,
    or the file's directory): to say what an fd count that grew is made of."""
    out: dict = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kind = (
            target.split(":[")[0]
            if ":[" in target
            else "memfd"
            if target.startswith("/memfd:")
            else os.path.dirname(target)
        )
        kind = target if kind == "anon_inode" else kind
        out[kind] = out.get(kind, 0) + 1
    return out


def unix_sockets() -> list[tuple[str, str]]:
    """(inode, name) of every named Unix socket of this network namespace (/proc/net/unix);
    a name in the abstract namespace starts with "@"."""
    with open("/proc/net/unix") as f:
        next(f)
        return [(r[6], r[7]) for r in (line.split() for line in f) if len(r) >= 8]


def ipc_endpoints(pid="self") -> list[str]:
    """The collectives-*.ipc endpoints that process `pid` has bound now: the Unix sockets
    whose inode is one of its descriptors (not a match on the pid in the name: pids are
    reused, and an earlier process of the same pid may have had that name)."""
    inodes = set()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed since the listing
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return sorted(
        {
            name
            for inode, name in unix_sockets()
            if inode in inodes
            and os.path.basename(name.lstrip("@")).startswith("collectives-")
            and name.endswith(".ipc")
        }
    )


def sample(pg=None) -> dict:
    fds = os.listdir("/proc/self/fd")
    with open("/proc/self/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    dev_shm = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed since listdir
        if target.startswith("/dev/shm/"):
            dev_shm.add(target)
    dev_shm.update(line.split()[-1] for line in maps if " /dev/shm/" in line)
    arenas = {
        line.split()[-2] if line.endswith("(deleted)") else line.split()[-1]
        for line in maps
        if "memfd:collectives-arena" in line
    }
    arena = _arena(pg) if pg is not None else None
    return {
        "fds": len(fds),
        "threads": len(os.listdir("/proc/self/task")),
        "rss_mib": round(rss_kb / 1024, 1),
        "shm_slots": arena.in_use() if arena is not None else 0,
        "arenas": len(arenas),
        "ipc_endpoints": len(ipc_endpoints()),
        "dev_shm": len(dev_shm),
    }


def table(samples: dict) -> tuple[str, list[str]]:
    """samples[process][phase] -> (a text table, the failures). phases: start, middle, end.
    (A process is named by the rank it started as.)"""
    head = (
        f"{'proc':>4} {'what':10} {'start':>8} {'middle':>8} {'end':>8} {'growth':>7} "
        f"{'bound':>6}  verdict"
    )
    lines, failures = [head], []
    for rank in sorted(samples):
        s = samples[rank]
        for k in FIELDS:
            grew = round(s["end"][k] - s["middle"][k], 1)
            bad = grew > BOUNDS[k]
            if bad:
                failures.append(
                    f"process of rank {rank}: {k} grew from {s['middle'][k]} to "
                    f"{s['end'][k]} between the middle and the end "
                    f"(bound +{BOUNDS[k]})"
                )
            lines.append(
                f"{rank:>4} {k:10} {s['start'][k]:>8} {s['middle'][k]:>8} "
                f"{s['end'][k]:>8} {grew:>+7g} {'+' + str(BOUNDS[k]):>6}  "
                f"{'LEAK' if bad else 'ok'}"
            )
    return "\n".join(lines), failures


def conclude(text: str, record: dict, failures: list, out, ok: str) -> int:
    """The end of a long run (bench/stress/soak.py, bench/stress/chaos.py): its record to OUT.json and its
    table to OUT.txt if `out` is given, the table printed, then the failures (exit status 1)
    or the line `ok` (0)."""
    if out:
        import json
        import pathlib

        path = pathlib.Path(out)
        path.with_suffix(".json").write_text(json.dumps(record, indent=1))
        path.with_suffix(".txt").write_text(text + "\n")
    print(text)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nOK: " + ok)
    return 0
