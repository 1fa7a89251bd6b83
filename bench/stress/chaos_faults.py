"""The faults bench/stress/chaos.py injects, one function per kind. Each is real: a signal to a worker
process, a fault-injection rule the worker installs in its live group (transport/faults.py,
as COLLECTIVES_FAULTS does for generation 0), or a SIGKILL of the standalone coordinator
followed by a restart on the same address.

  sigkill      the worker dies at once; survivors detect it (socket watch, heartbeats) and
               reconstruct; the supervisor starts a replacement that joins
  sigstop      the worker stalls for STOP_FOR s (past the heartbeat timeout), then SIGCONT: it
               has been evicted meanwhile, finds out, and rejoins as a new member
  sigterm      preemption: the library announces the departure and the process exits; a
               replacement joins
  delay        every message on one link into the worker is held for 60 s: the next op stalls
               until its timeout, the coordinator blames a rank on that link and evicts it
  drop         the same link loses every message instead
  slowlink     (--hosts) the links between the worker's host and another held to --slow-rate
               for the rest of the run (bench/stress/chaos_net.py): nothing fails; the
               coordinator flags the links and reroutes around them
  partition    (--hosts) the worker's host cut off (its link down) for PARTITION_FOR s, then
               back: it is evicted meanwhile and rejoins
  coordinator  SIGKILL the coordinator, start it again on the same port after a moment:
               collectives go on meanwhile; the members re-register with the new one
               (membership/restart.py, recovery.py) and the generation stays the same
"""

from __future__ import annotations

import os
import signal
import threading
import time

KINDS = ["sigkill", "sigstop", "sigterm", "delay", "drop", "coordinator", "slowlink", "partition"]
HOSTS_ONLY = {"slowlink", "partition"}  # they need real links: network-namespace hosts
DEFAULT_KINDS = [k for k in KINDS if k not in HOSTS_ONLY]
STOP_FOR = 3.0  # heartbeat timeout (2 s) + a margin: long enough to be evicted
COORDINATOR_AWAY = 1.0  # seconds between the coordinator's death and its restart
PARTITION_FOR = 4.0  # seconds a partitioned host is cut off: past the heartbeat timeout (2 s)
LINK_DELAY = 60  # seconds a delayed link holds every message (far past the op timeout)


def _signal(pid: int, sig) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def sigkill(job, worker) -> bool:
    return _signal(worker.pid, signal.SIGKILL)


def sigterm(job, worker) -> bool:
    return _signal(worker.pid, signal.SIGTERM)


def sigstop(job, worker) -> bool:
    if not _signal(worker.pid, signal.SIGSTOP):
        return False
    worker.stopped = True

    def resume():
        _signal(worker.pid, signal.SIGCONT)
        worker.stopped = False

    threading.Timer(STOP_FOR, resume).start()
    return True


def _order(job, worker, text: str) -> bool:
    """The worker installs the link rule at its next step boundary (chaos_worker.py)."""
    path = os.path.join(job.control, f"order-{worker.pid}")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return True


def delay(job, worker) -> bool:
    return _order(job, worker, f"delay {LINK_DELAY}")


def drop(job, worker) -> bool:
    return _order(job, worker, "drop 0")


def coordinator(job, worker=None) -> bool:
    job.kill_coordinator()
    time.sleep(COORDINATOR_AWAY)
    job.start_coordinator()
    return True


def slowlink(job, worker) -> bool:
    return job.net.slow_pair(worker.host, job.rng) is not None


def partition(job, worker) -> bool:
    job.net.partition(worker.host, PARTITION_FOR)
    return True


INJECT = {
    "sigkill": sigkill,
    "sigstop": sigstop,
    "sigterm": sigterm,
    "delay": delay,
    "drop": drop,
    "coordinator": coordinator,
    "slowlink": slowlink,
    "partition": partition,
}
# what the fault is expected to do to the membership: a new generation (recovery measured as
# the time to the first correct step of it), or none (coordinator: the steps just go on)
CHANGES_GENERATION = {
    "sigkill": True,
    "sigstop": True,
    "sigterm": True,
    "delay": True,
    "drop": True,
    "coordinator": False,
    "slowlink": False,  # recovered: the first correct step after it (the job slows, not stops)
    "partition": True,
}
