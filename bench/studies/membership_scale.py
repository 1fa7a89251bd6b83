"""Where one coordinator stops: the real membership machine at 100 to 10,000 members, in
virtual time.

    python -m bench membership_scale [--members 100 1000 10000] [--heartbeat-interval 0.5]
                                     [--heartbeat-timeout 5] [--steady 2] [--latency 0.0002]
                                     [--seed 0] [--out bench/results/membership_scale]

No sockets, no threads, no processes: the coordinator is the real `Machine`
(collectives/membership/machine.py) fed the events its shell (server.py) would feed it, in the
shell's order -- each request decoded from its packed bytes (protocol.decode_request), then
`Arrived`, then a `Tick` (a sweep every server.HEARTBEAT_CHECK_EVERY s), and an idle Tick at
that period. The members are records that answer what the machine sends them as a member's
client and heartbeat thread do. The clock is virtual: a message takes `--latency` s each way and
the coordinator's work takes no virtual time, so the virtual figures are the protocol's own, the
same on every host. The coordinator's REAL CPU is measured around every `Machine.feed` (and
around the codec) with time.process_time, per event kind.

One run per member count N, in order:
  formation     every member joins (spread over one heartbeat interval) until its welcome;
  steady        every member beats once per interval, the beats spread over it; no failure
                notice may be sent (a false alarm fails the run);
  silent        one member stops beating: detection is its last beat -> the failure notice
                at the survivors; every survivor then asks to reconstruct (`reconstruct`), answers
                its `regroup` with its `address`, until the new generation's `welcome`;
  connection    one member's heartbeat connection closes (the shell's witness: `Connection
                closed`), it stops beating: detection from the close;
  pidfd         one member whose process is watched (`PidWatch`) dies (`Died`): detection from
                the death.
A fault not detected within heartbeat_timeout + 1 s, or a generation that does not form with
every survivor, raises StudyFailed (exit status 1).

Reported per N: requests in and messages out per second at the coordinator while steady; each
fault's detection and reconstruction (virtual s) and the messages and bytes it took; the real CPU
per event kind (mean us) and per beat (its Arrived + its Tick + its share of the sweeps, and
with the codec); the beats per second one core can take at that N, and the largest N that
implies at the heartbeat interval. Written to OUT/membership_scale.{txt,json}.
"""

from __future__ import annotations

import argparse
import heapq
import json
import pathlib
import random
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from collectives.membership import protocol
from collectives.membership.machine import Arrived, Connection, Died, Event, Machine, PidWatch, Tick
from collectives.membership.protocol import (
    Address,
    Beat,
    Evicted,
    Failure,
    Info,
    Join,
    Reconstruct,
    Regroup,
    Report,
    Welcome,
)
from collectives.membership.server import HEARTBEAT_CHECK_EVERY
from collectives.membership.state import Send, State

RECONSTRUCT_TIMEOUT = 30.0  # s: a member's reconstruct() timeout (its client's default)
SLACK = 1.0  # s: detection must come within heartbeat_timeout + SLACK


class StudyFailed(RuntimeError):
    """The machine did not do what the protocol promises (a fault undetected, a generation
    not formed, a false alarm)."""


@dataclass
class Member:
    """One simulated member: its two connections (a client's, a heartbeat thread's)."""

    mid: str
    client: bytes  # where join, reconstruct and address go from
    hb: bytes  # where beats go from; notices come here
    generation: int = -1
    beating: bool = False
    gone: bool = False  # crashed, or evicted
    asked: int = -1  # the generation it last asked to reconstruct from
    beat_raw: bytes = b""  # its beat, packed for the generation it is in


@dataclass
class Costs:
    """The coordinator's real CPU per event kind: seconds and count."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    count: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, kind: str, dt: float) -> None:
        self.seconds[kind] += dt
        self.count[kind] += 1

    def mean(self, kind: str) -> float:
        return self.seconds[kind] / self.count[kind] if self.count[kind] else 0.0

    def snapshot(self) -> Costs:
        return Costs(defaultdict(float, self.seconds), defaultdict(int, self.count))

    def since(self, before: Costs) -> Costs:
        """What was spent after `before` (a snapshot)."""
        return Costs(
            defaultdict(float, {k: v - before.seconds[k] for k, v in self.seconds.items()}),
            defaultdict(int, {k: v - before.count[k] for k, v in self.count.items()}),
        )

    def table(self) -> dict[str, KindCost]:
        return {
            k: KindCost(self.count[k], 1e6 * self.mean(k), self.seconds[k])
            for k in sorted(self.count)
        }


@dataclass
class Fault:
    """One fault's figures (virtual seconds)."""

    kind: str
    rank: int
    detection_s: float
    reconstruction_s: float
    messages_in: int
    messages_out: int
    bytes_out: int
    cpu_s: float  # the coordinator's real CPU from the fault to the new generation: machine + codec
    generation: int
    world_size: int


@dataclass
class KindCost:
    """The coordinator's real CPU for one kind of event (or codec call)."""

    count: int
    mean_us: float
    total_s: float


@dataclass
class Run:
    """One member count's figures (virtual seconds unless named `cpu`; CPU in real time)."""

    members: int
    formation_s: float  # the first join -> the last welcome
    formation_cpu_s: float
    welcome_bytes: int  # one member's welcome of generation 0 (every member gets one)
    steady_s: float  # the steady window
    steady_in_per_s: float  # requests into the coordinator
    steady_out_per_s: float  # messages out of it
    beats_per_s: float
    sweeps_per_s: float
    cpu_beat_us: float  # a beat's Arrived and the Tick after it
    cpu_sweep_us: float
    cpu_decode_beat_us: float
    cpu_per_beat_all_us: float  # every CPU second of the steady window per beat, decode too
    machine_share_of_core: float
    beats_per_s_one_core: float  # machine and decode only
    largest_n_at_interval: int
    faults: list[Fault]
    costs_us: dict[str, KindCost]  # by event kind
    codec_us: dict[str, KindCost]  # by codec call


class Sim:
    """The machine, its N members, and a virtual clock."""

    def __init__(self, n: int, interval: float, timeout: float, latency: float):
        self.n, self.interval, self.timeout, self.latency = n, interval, timeout, latency
        self.machine = Machine(
            State(world_size=n, heartbeat_timeout=timeout, diagnose_window=max(0.3, 2 * interval))
        )
        self.members = [
            Member(f"{i:032x}", b"c%d" % i, b"h%d" % i) for i in range(n)
        ]  # by launch rank
        self.by_ident = {m.client: m for m in self.members} | {m.hb: m for m in self.members}
        self.now = 0.0
        self.queue: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self.order = 0
        self.last_sweep = -1.0
        self.costs = Costs()
        self.codec = Costs()
        self.msgs_in = 0
        self.msgs_out = 0
        self.bytes_out = 0
        self.notices: list[tuple[float, Failure]] = []  # (delivered at, notice) to survivors
        self.welcomes: dict[int, list[float]] = defaultdict(list)  # generation -> delivered at
        self.last_beat: dict[str, float] = {}  # mid -> when its last beat arrived
        # (generation, id of its roster) -> (s, bytes) of one welcome's packing
        self.welcome_packed: dict[tuple[int, int], tuple[float, int]] = {}

    # --- the clock -----------------------------------------------------------------------------
    def at(self, t: float, what: Callable[[Any], None], arg: Any = None) -> None:
        """Run what(arg) at the virtual time t (events at one time: in the order given)."""
        self.order += 1
        heapq.heappush(self.queue, (t, self.order, what, arg))

    def step(self) -> None:
        t, _, what, arg = heapq.heappop(self.queue)
        self.now = t
        what(arg)

    def run_until(self, done: Callable[[], bool], limit: float, what: str) -> None:
        """Process events until done() or the virtual time `limit`; StudyFailed then."""
        while not done():
            if not self.queue or self.queue[0][0] > limit:
                raise StudyFailed(f"N={self.n}: {what} by virtual t={limit:.3f} s")
            self.step()

    # --- the coordinator, as its shell drives it ----------------------------------------------
    def feed(self, event: Event, kind: str) -> None:
        t0 = time.process_time()
        effects = self.machine.feed(event, self.now)
        self.costs.add(kind, time.process_time() - t0)
        for e in effects:
            if isinstance(e, Send):
                self.msgs_out += 1
                self._deliver(e)

    def _deliver(self, e: Send) -> None:
        msg = e.msg
        if isinstance(msg, Welcome):  # N of them share one roster: packed once, counted N
            key = (msg.generation, id(msg.infos))
            if key not in self.welcome_packed:
                t0 = time.process_time()
                size = len(protocol.pack(msg))
                self.welcome_packed[key] = (time.process_time() - t0, size)
            dt, size = self.welcome_packed[key]
        else:
            t0 = time.process_time()
            size = len(protocol.pack(msg))
            dt = time.process_time() - t0
        self.codec.add("pack " + msg.kind, dt)
        self.bytes_out += size
        self.at(self.now + self.latency, self._member_gets, (e.to, msg))

    def _arrive(self, arg: tuple[bytes, bytes]) -> None:
        """A request's bytes reach the coordinator: decoded, fed, then the shell's tick."""
        ident, raw = arg
        t0 = time.process_time()
        request = protocol.decode_request(raw)
        self.codec.add("decode " + request.kind, time.process_time() - t0)
        self.msgs_in += 1
        if isinstance(request, Beat):
            self.last_beat[request.mid] = self.now
        self.feed(Arrived(ident, request), request.kind)
        self._tick(None)

    def _tick(self, _: Any) -> None:
        sweep = self.now - self.last_sweep >= HEARTBEAT_CHECK_EVERY
        if sweep:
            self.last_sweep = self.now
        self.feed(Tick(sweep), "Tick sweep" if sweep else "Tick")

    def idle(self, _: Any = None) -> None:
        """The shell's poll timeout: a tick at least every HEARTBEAT_CHECK_EVERY s."""
        self._tick(None)
        self.at(self.now + HEARTBEAT_CHECK_EVERY, self.idle)

    def cpu(self) -> float:
        """The coordinator's real CPU so far: the machine's, and the codec's (each welcome's
        packing counted once per member it goes to, as the shell packs each)."""
        return sum(self.costs.seconds.values()) + sum(self.codec.seconds.values())

    def witness(self, event: Event) -> None:
        """What the shell's crash witnesses (liveness.py) saw, now."""
        self.feed(event, type(event).__name__)

    def advance(self, until: float) -> None:
        """Run every event up to the virtual time `until`."""
        while self.queue and self.queue[0][0] <= until:
            self.step()
        self.now = until

    # --- the members ---------------------------------------------------------------------------
    def send(self, msg: protocol.Request, via: bytes) -> None:
        self.at(self.now + self.latency, self._arrive, (via, protocol.pack(msg)))

    def _beat(self, m: Member) -> None:
        if not m.beating or m.gone:
            return
        self.at(self.now + self.latency, self._arrive, (m.hb, m.beat_raw))
        self.at(self.now + self.interval, self._beat, m)

    def join(self, m: Member) -> None:
        """Member m joins generation 0 (its client's `join`)."""
        rank = int(m.mid, 16)
        host = f"10.{rank >> 16}.{rank >> 8 & 255}.{rank & 255}"  # a host of its own, as a real one
        info = Info(tcp=f"{host}:29500", pid=1000 + rank)
        self.send(Join(mid=m.mid, rank=rank, world_size=self.n, info=info), m.client)

    def _member_gets(self, arg: tuple[bytes, Any]) -> None:
        ident, msg = arg
        m = self.by_ident[ident]
        if m.gone:
            return
        if isinstance(msg, Welcome):
            m.generation = msg.generation
            m.beat_raw = protocol.pack(
                Beat(mid=m.mid, report=Report(generation=msg.generation, seq=-1, in_op=False))
            )
            self.welcomes[msg.generation].append(self.now)
            if not m.beating:  # generation 0: the heartbeat thread starts
                m.beating = True
                offset = self.interval * int(m.mid, 16) / self.n
                self.at(self.now + offset, self._beat, m)
        elif isinstance(msg, Failure):
            self.notices.append((self.now, msg))
            if m.asked < m.generation:  # its next op raises PeerFailure: it reconstructs
                m.asked = m.generation
                ask = Reconstruct(
                    mid=m.mid, generation=m.generation, timeout=RECONSTRUCT_TIMEOUT, seq=-1
                )
                self.send(ask, m.client)
        elif isinstance(msg, Regroup):
            info = Info(tcp=f"10.1.0.1:{30000 + msg.rank}", pid=1000 + int(m.mid, 16))
            self.send(Address(mid=m.mid, generation=msg.generation, info=info), m.client)
        elif isinstance(msg, Evicted):
            m.gone = True
        elif msg.kind in ("unformed", "unchanged", "error"):
            raise StudyFailed(f"N={self.n}: member {m.mid} was told {msg!r}")


def live_ranks(sim: Sim) -> list[Member]:
    members = sim.machine.state.members or []
    by_mid = {m.mid: m for m in sim.members}
    return [by_mid[mid] for mid in members if mid not in sim.machine.state.failed]


def fault(sim: Sim, kind: str, victim: Member) -> Fault:
    """Make `victim` fail as `kind` says; wait for the notice and the next generation."""
    s = sim.machine.state
    rank = (s.members or []).index(victim.mid)
    gen = s.generation
    seen = len(sim.notices)
    in0, out0, bytes0 = sim.msgs_in, sim.msgs_out, sim.bytes_out
    cpu0 = sim.cpu()
    if kind == "pidfd":  # the shell watches its process (liveness.py: a pidfd on this host)
        sim.witness(PidWatch(victim.mid, True))
    start = sim.now
    victim.beating = False
    victim.gone = True
    if kind == "silent":  # it stops beating: the heartbeat clock is the only witness
        start = sim.last_beat.get(victim.mid, sim.now)
    elif kind == "connection":  # its process ended: the socket monitor saw its connection close
        sim.witness(Connection(fd=7, what="closed", ident=victim.hb))
    else:  # its pidfd became readable
        sim.witness(Died(victim.mid, "died: its process ended (its pidfd)"))

    def noticed() -> bool:
        return any(rank in n.failed_ranks for _, n in sim.notices[seen:])

    limit = start + sim.timeout + SLACK
    sim.run_until(noticed, limit, f"{kind}: rank {rank} failed and no failure notice named it")
    told = next(t for t, n in sim.notices[seen:] if rank in n.failed_ranks)
    survivors = len(s.members or []) - 1
    sim.run_until(
        lambda: len(sim.welcomes[gen + 1]) >= survivors,
        told + RECONSTRUCT_TIMEOUT,
        f"{kind}: generation {gen + 1} did not form with the {survivors} survivors",
    )
    if len(s.members or []) != survivors or s.generation != gen + 1:
        raise StudyFailed(
            f"N={sim.n}: {kind}: generation {s.generation} formed with "
            f"{len(s.members or [])} members, not {survivors}"
        )
    return Fault(
        kind=kind,
        rank=rank,
        detection_s=told - start,
        reconstruction_s=max(sim.welcomes[gen + 1]) - told,
        messages_in=sim.msgs_in - in0,
        messages_out=sim.msgs_out - out0,
        bytes_out=sim.bytes_out - bytes0,
        cpu_s=sim.cpu() - cpu0,
        generation=s.generation,
        world_size=len(s.members or []),
    )


def study(n: int, interval: float, timeout: float, steady: float, latency: float, seed: int) -> Run:
    """One member count: formation, a steady window, three faults."""
    sim = Sim(n, interval, timeout, latency)
    rng = random.Random(seed)
    for i, m in enumerate(sim.members):
        sim.at(interval * i / n, sim.join, m)
    sim.at(0.0, sim.idle)
    sim.run_until(lambda: len(sim.welcomes[0]) == n, 60.0, "generation 0 did not form")
    formation = max(sim.welcomes[0])
    formation_cpu = sum(sim.costs.seconds.values())
    welcome_bytes = next(iter(sim.welcome_packed.values()))[1]

    sim.advance(sim.now + interval)  # every member has beaten once
    before = sim.costs.snapshot()
    in0, out0, t0 = sim.msgs_in, sim.msgs_out, sim.now
    sim.advance(sim.now + steady)
    span = sim.now - t0
    if sim.notices:
        raise StudyFailed(f"N={n}: a failure notice while every member beat: {sim.notices[0]}")
    steady_costs = sim.costs.since(before)
    rate_in, rate_out = (sim.msgs_in - in0) / span, (sim.msgs_out - out0) / span

    faults = []
    for kind in ("silent", "connection", "pidfd"):
        live = live_ranks(sim)
        faults.append(fault(sim, kind, live[rng.randrange(len(live))]))

    beats_per_s = steady_costs.count["beat"] / span
    sweeps_per_s = steady_costs.count["Tick sweep"] / span
    # a beat's own work: its Arrived and the Tick after it; the sweeps are shared
    machine_per_beat = steady_costs.mean("beat") + steady_costs.mean("Tick")
    sweep_s = steady_costs.mean("Tick sweep")
    codec_per_beat = sim.codec.mean("decode beat")
    # one core: beats/s * (machine + codec) + sweeps/s * sweep = 1 s of CPU per s
    capacity = (1 - sweeps_per_s * sweep_s) / (machine_per_beat + codec_per_beat)
    busy = sum(steady_costs.seconds.values())
    return Run(
        members=n,
        formation_s=formation,
        formation_cpu_s=formation_cpu,
        welcome_bytes=welcome_bytes,
        steady_s=span,
        steady_in_per_s=rate_in,
        steady_out_per_s=rate_out,
        beats_per_s=beats_per_s,
        sweeps_per_s=sweeps_per_s,
        cpu_beat_us=1e6 * machine_per_beat,
        cpu_sweep_us=1e6 * sweep_s,
        cpu_decode_beat_us=1e6 * codec_per_beat,
        cpu_per_beat_all_us=1e6 * (busy / steady_costs.count["beat"] + codec_per_beat),
        machine_share_of_core=busy / span,
        beats_per_s_one_core=capacity,
        largest_n_at_interval=int(capacity * interval),
        faults=faults,
        costs_us=sim.costs.table(),
        codec_us=sim.codec.table(),
    )


def report(runs: list[Run], a: argparse.Namespace) -> str:
    """The tables, as text."""
    lines = [
        f"membership_scale: the real coordinator Machine, virtual time; heartbeat every "
        f"{a.heartbeat_interval:g} s, timeout {a.heartbeat_timeout:g} s, latency "
        f"{1e3 * a.latency:g} ms, steady window {a.steady:g} s, seed {a.seed}",
        "",
        "      N   in/s  out/s  beat+tick us  sweep us  decode us  all/beat us  core share"
        "  beats/s/core  largest N",
    ]
    for r in runs:
        lines.append(
            f"{r.members:7d} {r.steady_in_per_s:6.0f} {r.steady_out_per_s:6.0f}"
            f" {r.cpu_beat_us:13.1f} {r.cpu_sweep_us:9.0f} {r.cpu_decode_beat_us:10.1f}"
            f" {r.cpu_per_beat_all_us:12.1f} {100 * r.machine_share_of_core:10.1f}%"
            f" {r.beats_per_s_one_core:13.0f} {r.largest_n_at_interval:10d}"
        )
    lines += [
        "",
        "      N  fault        detection s  reconstruction s  msgs in  msgs out  MB out  CPU s",
    ]
    for r in runs:
        for f in r.faults:
            lines.append(
                f"{r.members:7d}  {f.kind:11s} {f.detection_s:12.3f}"
                f" {f.reconstruction_s:17.4f} {f.messages_in:8d} {f.messages_out:9d}"
                f" {f.bytes_out / 1e6:7.1f} {f.cpu_s:6.2f}"
            )
    lines += ["", "      N  formation s  formation CPU s  welcome bytes (x N)"]
    for r in runs:
        lines.append(
            f"{r.members:7d} {r.formation_s:12.3f} {r.formation_cpu_s:16.3f} {r.welcome_bytes:14d}"
        )
    lines += ["", "the coordinator's CPU per event kind (mean us, count), every phase:"]
    for r in runs:
        kinds = ", ".join(f"{k} {v.mean_us:.1f} ({v.count})" for k, v in r.costs_us.items())
        lines.append(f"{r.members:7d}  {kinds}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench membership_scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--members", type=int, nargs="+", default=[100, 1000, 10000])
    p.add_argument("--heartbeat-interval", type=float, default=0.5)
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--steady", type=float, default=2.0, help="virtual s of beats measured")
    p.add_argument("--latency", type=float, default=0.0002, help="one way, virtual s")
    p.add_argument("--seed", type=int, default=0, help="which members fail")
    p.add_argument("--out", default=None, help="write membership_scale.{txt,json} here")
    a = p.parse_args(argv)
    runs: list[Run] = []
    try:
        for n in a.members:
            runs.append(
                study(
                    n,
                    a.heartbeat_interval,
                    a.heartbeat_timeout,
                    a.steady,
                    a.latency,
                    a.seed,
                )
            )
    except StudyFailed as exc:
        print(f"membership_scale: FAILED: {exc}", file=sys.stderr)
        return 1
    text = report(runs, a)
    print(text)
    if a.out:
        out = pathlib.Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        command = "python -m bench membership_scale " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        (out / "membership_scale.txt").write_text(f"$ {command}\n{text}\n")
        (out / "membership_scale.json").write_text(
            json.dumps({"command": command, "runs": [asdict(r) for r in runs]}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
