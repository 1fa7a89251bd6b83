"""Link emulation on a virtual clock: what a run would cost on links of per-message cost alpha
and per-byte cost beta, computed while the run happens, without sleeping.

    model = LinkModel(alpha=50e-6, beta=1e-9)            # 50 us a message, 1 GB/s, every link
    cl.simulate(8, fn, wrappers=[model.wrap])
    model.makespan()                                      # virtual seconds until the last rank is done

The model is the one docs/proofs.md proves its bounds in (Hockney's alpha-beta cost, single
port, full duplex): a message of b bytes costs alpha + b*beta, and it holds its sender's port
and its receiver's port for that long. A rank sends one message at a time and receives one at a
time, and may do both at once:

* every rank has a virtual clock, starting at 0;
* send: sending b bytes to `dst` keeps the sender busy from its clock t to t + alpha + b*beta
  (its clock moves on);
* the receiver's port takes one message at a time, in dst's receive order, so the message has
  fully arrived at
      arrival = max(t + alpha + b*beta,  port_free[dst] + alpha + b*beta)
  (port_free[dst] is when dst's port finished its previous message);
* recv: the receiver's clock becomes max(its clock, arrival); recv_reduce adds b*gamma for the
  arithmetic.

alpha is what every message costs each end however small it is: the wire's latency and, on a
real host, the per-message overhead (LogP's o) and the gap between two messages at one port
(LogP's g). Charging it at the ports is what makes a rank that takes n-1 messages (naive's rank
0, direct's every rank) pay n-1 alphas, as it does on real hardware; a model with alpha as pure
wire latency, the messages' alphas overlapping, would price naive at 2 alpha + 2(n-1) N beta and
put it under the latency bound that the schedules of this model obey.

Under this model ring all_reduce of N bytes on n ranks takes exactly 2(n-1)(alpha + N/n*beta),
binomial tree all_reduce 2*ceil(log2 n)*(alpha + N*beta), halving-doubling
2 log2 n * alpha + 2(n-1)/n * N * beta when n is a power of two (`cost` below has every
algorithm's; the tests hold the emulator to it for n = 2..16), and crossover_bytes gives the N
at which ring and tree cost the same.

Every quantity above depends only on each rank's own program order (and the receiver's order
of receives), never on which thread ran first, so the virtual times are deterministic and a
run takes as long as the real in-process run, not the emulated one. alpha and beta may be set
per directed link with `links={(src, dst): (alpha, beta)}`: a slow link holds its sender's
port (and its receiver's) for longer, so every later message of that sender waits too.

The model needs one shared object to see both ends of a message, so it works for in-process
runs (cl.simulate), not across processes.
"""

from __future__ import annotations

import re
import threading
from typing import NamedTuple

from ..algorithms.costmodel import LinkCosts, double_tree_time, identity
from ..transport.wrapper import ChannelWrapper
from .trace import op_key

__all__ = [
    "LinkModel",
    "Cost",
    "cost",
    "parse_time",
    "parse_beta",
    "ring_time",
    "tree_time",
    "halving_doubling_time",
    "crossover_bytes",
]


class LinkModel:
    def __init__(
        self, alpha: float = 0.0, beta: float = 0.0, gamma: float = 0.0, links: dict | None = None
    ):
        for name, v in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
            if not v >= 0:
                raise ValueError(f"LinkModel: {name} must be >= 0, got {v!r}")
        self.alpha, self.beta, self.gamma = float(alpha), float(beta), float(gamma)
        self.links = dict(links or {})
        self._lock = threading.Lock()
        self.reset()

    def reset(self):
        with self._lock:
            self.clock: dict[int, float] = {}
            self._port_free: dict[int, float] = {}
            self._inflight: dict = {}

    def link(self, src: int, dst: int) -> tuple[float, float]:
        return self.links.get((src, dst), (self.alpha, self.beta))

    def wrap(self, ch):
        """The channel wrapper: put `model.wrap` in pg.channel_wrappers (before a tracer)."""
        return _EmulatedChannel(ch, self)

    def time(self, rank: int) -> float:
        return self.clock.get(rank, 0.0)

    def makespan(self) -> float:
        return max(self.clock.values(), default=0.0)

    # --- the model --------------------------------------------------------------------------
    def send_span(self, key, src, dst, nbytes) -> tuple[float, float]:
        alpha, beta = self.link(src, dst)
        with self._lock:
            t = self.clock.get(src, 0.0)
            busy = alpha + nbytes * beta
            end = t + busy
            self.clock[src] = end
            self._inflight[key] = (end, busy)
        return t, end

    def recv_span(self, key, dst, nbytes, reduce: bool) -> tuple[float, float]:
        with self._lock:
            # The sender recorded the message before handing it to the transport, and the
            # transport delivered it before our recv returned, so it is here.
            earliest, busy = self._inflight.pop(key)
            arrival = max(earliest, self._port_free.get(dst, 0.0) + busy)
            self._port_free[dst] = arrival
            t = self.clock.get(dst, 0.0)
            end = max(t, arrival) + (nbytes * self.gamma if reduce else 0.0)
            self.clock[dst] = end
        return t, end


class _EmulatedChannel(ChannelWrapper):
    """Forwards to the real channel and advances the virtual clocks; `last_vspan` is the virtual
    (start, end) of the last call, for a tracer wrapped around this channel."""

    def __init__(self, ch, model: LinkModel):
        super().__init__(ch)
        self._m = model
        self._key = op_key(ch)
        self._sent = [0] * ch.size
        self._got = [0] * ch.size
        self.last_vspan = None

    def send(self, peer, buf, *, phase="", step=0, chunk=0):
        key = (self._key, self.rank, peer, self._sent[peer])
        self._sent[peer] += 1
        span = self._m.send_span(key, self.rank, peer, buf.nbytes)
        self._ch.send(peer, buf, phase=phase, step=step, chunk=chunk)
        self.last_vspan = span

    def recv_into(self, peer, out, *, phase="", step=0, chunk=0):
        self._ch.recv_into(peer, out, phase=phase, step=step, chunk=chunk)
        self.last_vspan = self._m.recv_span(self._next(peer), self.rank, out.nbytes, False)

    def recv_reduce(self, peer, out, op, *, phase="", step=0, chunk=0):
        self._ch.recv_reduce(peer, out, op, phase=phase, step=step, chunk=chunk)
        self.last_vspan = self._m.recv_span(self._next(peer), self.rank, out.nbytes, True)

    def _next(self, peer):
        key = (self._key, peer, self.rank, self._got[peer])
        self._got[peer] += 1
        return key


# --- the closed forms, and units for the command line -------------------------------------------
def _log2_ceil(n: int) -> int:
    return max(n - 1, 0).bit_length()


class Cost(NamedTuple):
    """An all_reduce's time in the single-port model: rounds * alpha + per_byte * N * beta.
    rounds is also what invariants.port_rounds counts on a trace of it."""

    rounds: int
    per_byte: float
    rounds_formula: str
    per_byte_formula: str

    def time(self, nbytes: float, alpha: float, beta: float) -> float:
        return self.rounds * alpha + self.per_byte * nbytes * beta


COSTED = ("ring", "tree", "halving_doubling", "naive", "direct", "double_tree")


def double_tree_rounds(n: int, segments: int) -> int:
    """The rounds of double_tree.py's all_reduce with each half in `segments` segments: its
    steps counted through the port model with every message one round (costmodel.py's
    _port_model, the count this module's LinkModel makes of a run with alpha = 1, beta = 0).
    No closed form: the in-order trees of n ranks are uneven; 4 segments plus a fill of O(log n)
    from n = 4 up (2 segments at n = 2, 3 segments + 3 at n = 3: the busiest ranks are roots)."""
    healthy = LinkCosts(n, rate=1.0, alpha=1.0)
    return round(double_tree_time(identity(n), 0.0, healthy, segments))


def best_double_tree_segments(
    n: int, nbytes: int, alpha: float, beta: float, itemsize: int = 4
) -> int:
    """The number of segments per half (a power of two, each at least one element) at which
    the model prices double_tree's all_reduce of nbytes fastest."""
    best, best_t, s = 1, float("inf"), 1
    while nbytes / (2 * s) >= itemsize and s <= 1024:
        t = cost("double_tree", n, s).time(nbytes, alpha, beta)
        if t < best_t:
            best, best_t = s, t
        s *= 2
    return best


def cost(algorithm: str, n: int, segments: int = 1) -> Cost:
    """The closed form of `algorithm`'s all_reduce on n ranks (one segment per message; for
    double_tree, `segments` segments in each half, every message N / (2 segments) bytes)."""
    if n <= 1:
        return Cost(0, 0.0, "0", "0")
    if algorithm == "double_tree":
        rounds = double_tree_rounds(n, segments)
        return Cost(
            rounds,
            rounds / (2 * segments),
            "R(n, S): double_tree.program counted (4S + O(log n) fill)",
            "R(n, S) / 2S",
        )
    k = _log2_ceil(n)
    if algorithm == "ring":
        return Cost(2 * (n - 1), 2 * (n - 1) / n, "2(n-1)", "2(n-1)/n")
    if algorithm == "tree":
        return Cost(2 * k, 2.0 * k, "2 ceil(log2 n)", "2 ceil(log2 n)")
    if algorithm == "halving_doubling":
        p = 1 << (n.bit_length() - 1)
        if p == n:
            return Cost(2 * k, 2 * (n - 1) / n, "2 log2 n", "2(n-1)/n")
        lg = p.bit_length() - 1
        return Cost(
            2 * lg + 2, 2 * (p - 1) / p + 2, "2 log2 p + 2 (the fold)", "2(p-1)/p + 2 (the fold)"
        )
    if algorithm == "naive":
        return Cost(2 * (n - 1), 2.0 * (n - 1), "2(n-1)", "2(n-1)")
    if algorithm == "direct":
        # Every rank sends to 0, 1, ... in turn and takes the buffers in rank order, so the
        # buffers reach a port staggered: n-1 sends, then n-2 more slots for the last arrival.
        return Cost(2 * n - 3, 2.0 * n - 3, "2n-3", "2n-3")
    raise ValueError(f"emulate.cost: no closed form for {algorithm!r}; one of {', '.join(COSTED)}")


def ring_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """Ring all_reduce: 2(n-1) steps of alpha + (N/n) beta."""
    return cost("ring", n).time(nbytes, alpha, beta)


def tree_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """Binomial tree all_reduce: 2 ceil(log2 n) rounds of alpha + N beta (the root sends to
    and takes from its ceil(log2 n) children one after another)."""
    return cost("tree", n).time(nbytes, alpha, beta)


def halving_doubling_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """Halving-doubling all_reduce: 2 log2 n alpha + 2(n-1)/n N beta for n a power of two."""
    return cost("halving_doubling", n).time(nbytes, alpha, beta)


def crossover_bytes(
    n: int, alpha: float, beta: float, small: str = "tree", large: str = "ring"
) -> float | None:
    """The N at which `small` and `large` cost the same, `small` winning below it and `large`
    above; None if one of them is never slower (at n = 2 and 3 ring and tree take as many
    rounds, and the ring's bytes are fewer: the ring always wins)."""
    if n <= 1 or beta <= 0:
        return None
    s, g = cost(small, n), cost(large, n)
    numer = alpha * (g.rounds - s.rounds)
    denom = beta * (s.per_byte - g.per_byte)
    if denom <= 0 or numer <= 0:
        return None
    return numer / denom


_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_BYTE_UNITS = {
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
}
_NUM = r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"


def parse_time(text: str) -> float:
    """'50us', '0.2ms', '1e-5' (seconds) -> seconds."""
    m = re.fullmatch(_NUM + r"(s|ms|us|µs|ns)?\s*", str(text))
    if not m:
        raise ValueError(f"cannot read {text!r} as a time; write e.g. 50us, 0.5ms, 2e-5")
    return float(m.group(1)) * _TIME_UNITS[m.group(2) or "s"]


def parse_beta(text: str) -> float:
    """A bandwidth '1GB/s', '100MB/s', '10Gb/s' (bits), or a per-byte time '1ns/B' -> s/byte."""
    s = str(text).strip()
    m = re.fullmatch(_NUM + r"([kKmMgGtT]?i?[bB])/s\s*", s)
    if m:
        unit = m.group(2)
        bits = unit.endswith("b") and unit != "b"  # Gb/s is bits, GB/s bytes
        rate = float(m.group(1)) * _BYTE_UNITS[unit.lower()] / (8 if bits else 1)
        if rate <= 0:
            raise ValueError(f"bandwidth must be positive, got {text!r}")
        return 1.0 / rate
    m = re.fullmatch(_NUM + r"(s|ms|us|µs|ns)/[bB]\s*", s)
    if m:
        return float(m.group(1)) * _TIME_UNITS[m.group(2)]
    raise ValueError(
        f"cannot read {text!r} as a bandwidth; write e.g. 1GB/s, 100MB/s, 10Gb/s "
        "or a time per byte such as 1ns/B"
    )
