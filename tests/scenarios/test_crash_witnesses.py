"""Each crash witness alone finds a SIGKILLed rank long before the heartbeat timeout
(membership/liveness.py): the pidfd, the closed connection, and the launcher's report. With
heartbeats at 30 s and operation deadlines at 30 s, the survivors can only learn of the death
within DETECT_BOUND s from the witness under test (switched off, the test fails: nothing else
could tell them in time). And none of them evicts a rank that lives: one stopped for a while
(SIGSTOP, shorter than the heartbeat timeout), or one whose connection to the coordinator is
cut and comes back.
"""

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from support.cluster import WORKER, Cluster
from support.procs import clean_env
from support.timing import bound, scaled

SLOW = 30.0  # s: heartbeat timeout and op deadline, far beyond DETECT_BOUND
DETECT_BOUND = 3.0  # s: from the kill to each survivor's PeerFailure, before scaling; at most
#                    4 times that on a busy machine, still below SLOW (timing.bound checks)


def _survivors_notice(c, names, failed, killed_at):
    for n in names:
        ev = c.wait_for(
            lambda e, n=n: (
                e["proc"] == n
                and (
                    (e["event"] == "failure" and e["failed"] == failed)
                    or (e["event"] == "step" and e["ws"] == 3 and e["t"] > killed_at)
                )
            ),
            DETECT_BOUND + 5,
            f"{n} noticing the loss of rank {failed}",
        )
        assert ev["t"] - killed_at < bound(DETECT_BOUND, below=SLOW), ev


@pytest.mark.timeout(90)
@pytest.mark.parametrize("witness", ["pidfd", "connection"])
def test_one_witness_alone_finds_a_sigkill(tmp_path, witness):
    c = Cluster(
        4, tmp_path, heartbeat_timeout=SLOW, detect=witness, worker_args=["--timeout", str(SLOW)]
    )
    try:
        c.start()
        c.wait_steps(["w0", "w1", "w2", "w3"], ws=4, timeout=30)
        killed_at = c.signal("w1", signal.SIGKILL)
        _survivors_notice(c, ["w0", "w2", "w3"], [1], killed_at)
        c.wait_steps(["w0", "w2", "w3"], ws=3, timeout=15, after=killed_at)
        assert any(witness_phrase(witness) in what for _, what in c.coordinator.events), list(
            c.coordinator.events
        )
    finally:
        c.close()


@pytest.mark.timeout(90)
def test_a_rank_killed_as_its_group_forms_is_found_by_its_connection(tmp_path):
    """Rank 1 SIGKILLs itself the moment init_process_group returns: its heartbeat connection
    had spoken before it asked to join (lifecycle.first_group), so its closing names it.
    Started with the group instead, the heartbeat thread had often sent nothing yet: the
    connection was nobody's, and only the 30 s heartbeat timeout could find the death."""
    c = Cluster(
        4,
        tmp_path,
        heartbeat_timeout=SLOW,
        detect="connection",
        worker_args=["--timeout", str(SLOW), "--die-at-init", "1"],
    )
    try:
        c.start()
        died = c.wait_for(lambda e: e["event"] == "dying", 30, "rank 1's last word")
        _survivors_notice(c, ["w0", "w2", "w3"], [1], died["t"])
        c.wait_steps(["w0", "w2", "w3"], ws=3, timeout=15)
        assert any(witness_phrase("connection") in what for _, what in c.coordinator.events), list(
            c.coordinator.events
        )
    finally:
        c.close()


def witness_phrase(witness):
    return {"pidfd": "pidfd", "connection": "connection to the coordinator closed"}[witness]


@pytest.mark.timeout(90)
def test_the_launchers_report_alone_finds_a_sigkill(tmp_path):
    """The elastic launcher (coordinator in a child process) with only the `exit` witness."""
    env = clean_env(
        COLLECTIVES_FAILURE_DETECTION="exit",
        COLLECTIVES_HEARTBEAT_TIMEOUT=SLOW,
        STOP_FILE=str(tmp_path / "stop"),
    )
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collectives.launch",
            "--nproc",
            "4",
            "--elastic",
            "--max-restarts",
            "0",
            "--timeout",
            "80",
            WORKER,
            "--timeout",
            str(SLOW),
            "--seconds",
            "60",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, pids = [], {}
    seen = threading.Event()

    def read():
        for line in p.stdout:
            lines.append((time.time(), line))
            m = re.match(r"\[rank (\d)\] (\{.*\})", line)
            if m and '"event": "step"' in line:
                pids.setdefault(int(m.group(1)), int(re.search(r'"pid": (\d+)', line)[1]))
                if len(pids) == 4:
                    seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(40), "".join(text for _, text in lines)
        killed_at = time.time()
        subprocess.run(["kill", "-KILL", str(pids[1])], check=True)
        deadline = time.monotonic() + scaled(DETECT_BOUND + 5)
        noticed = {}
        while time.monotonic() < deadline and len(noticed) < 3:
            for t, line in list(lines):
                m = re.match(r"\[rank (\d)\] (\{.*\})$", line.strip())
                if not m or t <= killed_at:
                    continue
                e = json.loads(m.group(2))
                # a PeerFailure, or (the death fell between two ops) a step without rank 1
                if (e["event"] == "failure" and e["failed"] == [1]) or (
                    e["event"] == "step" and e["ws"] == 3
                ):
                    noticed.setdefault(int(m.group(1)), e["t"])
            time.sleep(0.05)
        assert sorted(noticed) == [0, 2, 3], "".join(text for _, text in lines[-40:])
        assert max(noticed.values()) - killed_at < bound(DETECT_BOUND, below=SLOW), noticed
    finally:
        (tmp_path / "stop").write_text("stop")
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
        reader.join(5)


class CuttingProxy:
    """A TCP forwarder to `target` on port 0 of 127.0.0.1; cut() closes every connection it
    carries (both ends, as a reset middlebox would) and goes on accepting new ones."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.pairs = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.listener.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            with self.lock:
                self.pairs.append((a, b))
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(x, y), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def carrying(self) -> int:
        """The connections it carries now (made since the last cut)."""
        with self.lock:
            return len(self.pairs)

    def wait_carrying(self, n: int, timeout: float) -> None:
        """Until it carries `n` connections (`timeout` scaled)."""
        deadline = time.monotonic() + scaled(timeout)
        while self.carrying() < n:
            assert time.monotonic() < deadline, f"the proxy carries {self.carrying()} of {n}"
            time.sleep(0.02)

    def cut(self) -> int:
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        return len(pairs)

    def close(self):
        self.listener.close()
        self.cut()


@pytest.mark.timeout(90)
def test_a_connection_that_comes_back_is_no_death(tmp_path):
    """Rank 1 reaches the coordinator through a proxy that cuts its connections three times:
    ZeroMQ connects again within the grace, so nobody is evicted and every rank goes on at
    world size 4 (the connection witness alone, so that no pidfd vouches for the process).
    Each cut finds both of rank 1's connections (control and heartbeat) made again since the
    last: a rank evicted at a cut exits, and the next cut finds none."""
    c = Cluster(4, tmp_path, heartbeat_timeout=scaled(5.0), detect="connection")
    proxy = CuttingProxy(c.address)
    try:
        for r in (0, 2, 3):
            c.spawn(f"w{r}", r)
        direct, c.address = c.address, proxy.address  # spawn() hands out c.address
        # the secret the coordinator published for its own port, given outright
        c.spawn("w1", 1, env={"COLLECTIVES_JOB_SECRET": c.coordinator.keys.secret.decode()})
        c.address = direct
        c.wait_steps(["w0", "w1", "w2", "w3"], ws=4, timeout=30)
        for i in range(3):
            proxy.wait_carrying(2, 10)
            assert proxy.cut() >= 2, f"cut {i}"
            time.sleep(1.0)  # not a wait: rank 1 goes on this long after each cut
        cut_done = time.time()
        c.wait_steps(["w0", "w1", "w2", "w3"], ws=4, timeout=15, after=cut_done)
        bad = [e for e in c.seen if e["event"] in ("failure", "evicted", "error")]
        assert not bad, bad
        assert not [w for _, w in c.coordinator.events if "removed" in w], list(
            c.coordinator.events
        )
    finally:
        c.close()
        proxy.close()


@pytest.mark.timeout(90)
def test_a_rank_stopped_briefly_is_no_death(tmp_path):
    """SIGSTOP for 1.5 s (heartbeat timeout 5 s), every witness on: its process, its pidfd and
    its connections live, so it is not evicted; after SIGCONT all four go on at world size 4."""
    c = Cluster(
        4, tmp_path, heartbeat_timeout=scaled(5.0), worker_args=["--timeout", f"{scaled(10):g}"]
    )
    try:
        c.start()
        c.wait_steps(["w0", "w1", "w2", "w3"], ws=4, timeout=30)
        c.signal("w2", signal.SIGSTOP)
        time.sleep(1.5)  # not a wait: the stop lasts this long (below the heartbeat timeout)
        resumed = c.signal("w2", signal.SIGCONT)
        c.wait_steps(["w0", "w1", "w2", "w3"], ws=4, timeout=15, after=resumed)
        bad = [e for e in c.seen if e["event"] in ("failure", "evicted")]
        assert not bad, bad
    finally:
        c.close()
