"""The coordinator under load: 1,000 simulated members that only join and beat.

    python -m bench coordinator_load [--members 1000] [--seconds 10] [--silence 3]
                                     [--heartbeat-interval 0.5] [--heartbeat-timeout 5]
                                     [--json bench/results/coordinator_load/1000_members.json]

The coordinator is the real one (`python -m collectives.coordinator`, a process of its own, so
its CPU time can be read from /proc). The members are not processes: one thread of this script
drives one ZeroMQ DEALER per member and speaks the wire protocol of
collectives/membership/protocol.py with raw msgpack messages -- `join` {rank, world_size, mid,
info} until the coordinator's `welcome`, then `beat` {mid, generation, seq, in_op, waiting_on,
sent, recv, ...} every heartbeat interval, the beats of the members spread evenly over the
interval. A member does nothing else (no collectives, no transport), which is what a member
costs the coordinator between failures.

Reported:
  * formation: from the first join to the last welcome;
  * the coordinator's CPU share while the members beat (its user + system time over the
    window's wall time, from /proc/PID/stat; 100% = one core), and this driver's own, with the
    latest any beat left (the driver must keep up, or the figures are the driver's);
  * false alarms: failure notices during the steady window (must be 0);
  * detection: members are silenced one at a time (they stop beating); the time from a silent
    member's last beat to the failure notice naming its rank at the other members' sockets
    (watched on a few of them). It must stay within heartbeat_timeout + 1 s; the script exits
    with status 1 otherwise.

The client side's socket setup is one function, `member_socket`, so that an authenticated
coordinator (CURVE keys from COLLECTIVES_JOB_SECRET) needs a change there only.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import secrets
import sys
import tempfile
import time

import msgpack
import zmq

from collectives.membership import identity
from collectives.common import security

ROOT = pathlib.Path(__file__).resolve().parents[2]
TICK = 0.005  # s: the driver's loop period
WATCHERS = 8  # members whose sockets are read for failure notices


# The job's secret, shared with the coordinator: every member proves the member key (CURVE),
# as a real one does, so the load measured includes the authentication.
SECRET = secrets.token_hex(32)
KEYS = security.JobKeys(SECRET.encode())


def member_socket(ctx: zmq.Context, address: str) -> tuple[zmq.Socket, str]:
    """One member's link to the coordinator at `address` ("host:port"), with a key of its own
    as a real member's (membership/identity.py), and the member id that key gives."""
    pair, mid = identity.new_member(KEYS)
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    security.make_client(s, KEYS, pair)
    s.connect(f"tcp://{address}")
    return s, mid


def beat_msg(mid: str) -> bytes:
    """What a member's heartbeat carries (membership/heartbeat.py: a transport's Progress
    before its first op)."""
    return msgpack.packb(
        {
            "t": "beat",
            "mid": mid,
            "report": {
                "generation": 0,
                "seq": -1,
                "in_op": False,
                "waiting_on": None,
                "sent": None,
                "recv": None,
                "has_data": False,
                "done": [],
            },
        }
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_coordinator(n: int, a, tmp: pathlib.Path):
    port_file = tmp / "port"
    env = dict(
        os.environ,
        COLLECTIVES_HEARTBEAT_TIMEOUT=str(a.heartbeat_timeout),
        COLLECTIVES_JOB_SECRET=SECRET,
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    env.pop("COLLECTIVES_DEBUG", None)
    err = open(tmp / "coordinator.log", "w")
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collectives.coordinator",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--world-size",
            str(n),
            "--heartbeat-interval",
            str(a.heartbeat_interval),
        ],
        env=env,
        stdout=err,
        stderr=err,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise RuntimeError(
                f"the coordinator did not start: {(tmp / 'coordinator.log').read_text()}"
            )
        time.sleep(0.05)
    return p, f"127.0.0.1:{int(port_file.read_text())}"


class Members:
    """n simulated members, driven from one thread."""

    def __init__(self, n: int, address: str, interval: float):
        self.n, self.interval = n, interval
        self.ctx = zmq.Context(io_threads=2)
        self.socks, self.mids = map(
            list, zip(*(member_socket(self.ctx, address) for _ in range(n)))
        )
        self.beats = [beat_msg(m) for m in self.mids]
        self.silent: set[int] = set()
        self.last_beat = [0.0] * n
        self.next_beat = [0.0] * n
        self.late = 0.0  # the latest a beat left after its time (steady window)
        self.notices: list[tuple[float, int, dict]] = []  # (time, watcher, failure notice)

    def join(self, timeout: float) -> float:
        """Every member joins; the time from the first join to the last welcome."""
        t0 = time.monotonic()
        for r, s in enumerate(self.socks):
            s.send(
                msgpack.packb(
                    {
                        "t": "join",
                        "rank": r,
                        "world_size": self.n,
                        "mid": self.mids[r],
                        "info": {"pid": os.getpid(), "rank": r},
                    }
                )
            )
        welcomed = 0
        poller = zmq.Poller()
        for s in self.socks:
            poller.register(s, zmq.POLLIN)
        deadline = t0 + timeout
        while welcomed < self.n:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {welcomed} of {self.n} members were welcomed in {timeout:g} s"
                )
            for s, _ in poller.poll(100):
                msg = msgpack.unpackb(s.recv())
                if msg.get("t") == "error":
                    raise RuntimeError(f"the coordinator refused a join: {msg}")
                if msg.get("t") == "welcome":
                    welcomed += 1
        took = time.monotonic() - t0
        now = time.monotonic()
        # first beats spread evenly over one interval
        self.next_beat = [now + self.interval * r / self.n for r in range(self.n)]
        return took

    def run(self, seconds: float, until=None):
        """Beat for `seconds` s (or until `until()` is true); read the watchers' sockets."""
        end = time.monotonic() + seconds
        order = list(range(self.n))
        while time.monotonic() < end and not (until and until()):
            now = time.monotonic()
            for r in order:
                if self.next_beat[r] <= now and r not in self.silent:
                    self.late = max(self.late, now - self.next_beat[r])
                    self.socks[r].send(self.beats[r])
                    self.last_beat[r] = now
                    self.next_beat[r] += self.interval
            for w in range(WATCHERS):
                self._read(w)
            time.sleep(max(0.0, TICK - (time.monotonic() - now)))

    def _read(self, w: int):
        s = self.socks[w]
        while True:
            try:
                raw = s.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = msgpack.unpackb(raw)
            if msg.get("t") == "failure":
                self.notices.append((time.monotonic(), w, msg))
            elif msg.get("t") == "ping":  # answered as a member's heartbeat thread does
                state = {**msgpack.unpackb(self.beats[w]), "t": "state", "token": msg.get("token")}
                s.send(msgpack.packb(state))

    def close(self):
        for s in self.socks:
            s.close(linger=0)
        self.ctx.term()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench coordinator_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--members", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=10.0, help="the steady window")
    p.add_argument("--silence", type=int, default=3, help="members silenced, one at a time")
    p.add_argument("--heartbeat-interval", type=float, default=0.5)
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    n = a.members
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = pathlib.Path(tmpdir)
        coord, address = start_coordinator(n, a, tmp)
        members = None
        try:
            members = Members(n, address, a.heartbeat_interval)
            formation = members.join(timeout=120)
            members.run(2 * a.heartbeat_interval)  # settle
            members.late = 0.0
            c0, d0, w0 = cpu_seconds(coord.pid), time.process_time(), time.monotonic()
            members.run(a.seconds)
            wall = time.monotonic() - w0
            coord_share = (cpu_seconds(coord.pid) - c0) / wall
            driver_share = (time.process_time() - d0) / wall
            late = members.late
            false_alarms = len(members.notices)

            detections = []
            for k in range(a.silence):
                victim = n - 1 - k
                members.silent.add(victim)
                seen = len(members.notices)

                def named():
                    return any(
                        victim in msg["failed_ranks"] for _, _, msg in members.notices[seen:]
                    )

                members.run(a.heartbeat_timeout + 10, until=named)
                got = [t for t, _, msg in members.notices[seen:] if victim in msg["failed_ranks"]]
                if not got:
                    raise RuntimeError(
                        f"member {victim} went silent and no failure notice "
                        f"came within {a.heartbeat_timeout + 10:g} s"
                    )
                detections.append(got[0] - members.last_beat[victim])
        finally:
            if members is not None:
                members.close()
            coord.send_signal(signal.SIGTERM)
            try:
                coord.wait(10)
            except subprocess.TimeoutExpired:
                coord.kill()
                coord.wait(5)
    limit = a.heartbeat_timeout + 1.0
    ok = all(d <= limit for d in detections) and false_alarms == 0
    print(
        f"{n} members, heartbeat every {a.heartbeat_interval:g} s "
        f"({n / a.heartbeat_interval:.0f} beats/s), timeout {a.heartbeat_timeout:g} s, "
        f"{os.cpu_count()} cores"
    )
    print(f"  formation (first join -> last welcome): {formation:.2f} s")
    print(
        f"  coordinator CPU over {wall:.1f} s of beats: {100 * coord_share:.1f}% of one core "
        f"(driver: {100 * driver_share:.1f}%; latest beat {1e3 * late:.0f} ms late)"
    )
    print(f"  false alarms while beating: {false_alarms}")
    print(
        "  detection of a silent member (last beat -> failure notice): "
        + ", ".join(f"{d:.2f} s" for d in detections)
        + f"  (limit heartbeat_timeout + 1 s = {limit:g} s: {'ok' if ok else 'EXCEEDED'})"
    )
    if a.json:
        pathlib.Path(a.json).write_text(
            json.dumps(
                {
                    "members": n,
                    "cores": os.cpu_count(),
                    "heartbeat_interval": a.heartbeat_interval,
                    "heartbeat_timeout": a.heartbeat_timeout,
                    "formation_s": formation,
                    "steady_seconds": wall,
                    "coordinator_cpu_share": coord_share,
                    "driver_cpu_share": driver_share,
                    "latest_beat_s": late,
                    "false_alarms": false_alarms,
                    "detection_s": detections,
                    "limit_s": limit,
                    "ok": ok,
                    "command": "python -m bench coordinator_load "
                    + " ".join(argv if argv is not None else sys.argv[1:]),
                },
                indent=1,
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
