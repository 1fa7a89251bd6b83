"""Test hosts made of Linux network namespaces: the one way the tests and benchmarks build them.

    with Hosts(3, net=78) as h:         # h.names, h.devs, h.ips, h.prefix(i)
        ...                             # [*h.prefix(i), cmd...] runs cmd on host i

n "hosts", each a namespace with a veth into one more namespace that holds a bridge (the
switch), on link-local addresses 169.254.NET.1..n that exist only inside them. `rate` (e.g.
"1gbit") gives each host's link a bandwidth with tc's token bucket (netem is not available
here). On leaving, whatever happened, every process inside is SIGKILLed and every namespace
removed; a namespace of the same name left by an earlier process (one that had this pid) is
removed before, not taken for a refusal. A kernel that refuses namespaces raises Refused, with
its reason; tests that get it skip, and under CI=true that skip is a failure (conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess


class Refused(RuntimeError):
    """The kernel (or the missing root / iproute2) would not make a namespace."""


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=20)


class Hosts:
    def __init__(self, n: int, net: int, rate: str | None = None, tag: str = "cl"):
        pid = f"{os.getpid() % 100000}"
        self.names = [f"{tag}h{i}_{net}_{pid}" for i in range(n)]
        self.switch = f"{tag}sw{net}_{pid}"
        self.devs = [f"{tag}v{i}h{net}{pid}"[:15] for i in range(n)]  # IFNAMSIZ
        self.ports = [f"{tag}v{i}s{net}{pid}"[:15] for i in range(n)]
        self.ips = [f"169.254.{net}.{i + 1}" for i in range(n)]
        self.rate = rate
        self.made: list[str] = []

    def __enter__(self):
        try:
            for ns in [self.switch, *self.names]:
                r = ip("netns", "add", ns, check=False)
                if r.returncode != 0 and "File exists" in r.stderr:
                    # a leftover of a process that had our pid (its names are ours): removed,
                    # not skipped over
                    remove(ns)
                    r = ip("netns", "add", ns, check=False)
                if r.returncode != 0:
                    raise Refused(f"the kernel refused a network namespace: {r.stderr.strip()}")
                self.made.append(ns)
            for dev in self.devs:  # a leftover veth of ours in this namespace: gone too
                ip("link", "del", dev, check=False)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for ns, dev, port, addr in zip(self.names, self.devs, self.ports, self.ips):
                ip("link", "add", dev, "type", "veth", "peer", "name", port)
                ip("link", "set", dev, "netns", ns)
                ip("link", "set", port, "netns", self.switch)
                ip("-n", self.switch, "link", "set", port, "master", "br0")
                ip("-n", self.switch, "link", "set", port, "up")
                ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                ip("-n", ns, "link", "set", dev, "up")
                ip("-n", ns, "link", "set", "lo", "up")
                if self.rate:
                    subprocess.run(
                        [
                            "tc",
                            "-n",
                            ns,
                            "qdisc",
                            "add",
                            "dev",
                            dev,
                            "root",
                            "tbf",
                            "rate",
                            self.rate,
                            "burst",
                            "256kb",
                            "latency",
                            "50ms",
                        ],
                        check=True,
                        capture_output=True,
                        text=True,
                        timeout=20,
                    )
        except BaseException:
            self.__exit__()
            raise
        return self

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a process on host i: in its network namespace only.
        Not `ip netns exec`, which also gives every process it starts a mount namespace of
        its own: two ranks so started cannot map each other's shared memory (shm.py checks
        the mount namespace), unlike the ranks of a real host -- they would talk over ipc
        sockets instead, CURVE-encrypted, and every byte within a host would pay for it."""
        return ["nsenter", f"--net=/run/netns/{self.names[i]}", "--"]

    def __exit__(self, *exc):
        for ns in self.made:
            remove(ns)
        self.made = []


def remove(ns: str) -> None:
    """Namespace `ns` gone: anything still running inside dies first."""
    for pid in ip("netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    ip("netns", "del", ns, check=False)
