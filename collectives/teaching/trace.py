"""Tracing: record every message an algorithm sends or receives, chunk by chunk.

    tracer = cl.Tracer()
    cl.simulate(3, fn, wrappers=[tracer.wrap])     # in-process run
    pg.channel_wrappers.append(tracer.wrap)         # any ProcessGroup, ZeroMQ included
    tracer.save_chrome("trace.json")                # open in https://ui.perfetto.dev
    tracer.save_json("events.json")                 # plain JSON, one dict per event

A tracer is a channel wrapper: ProcessGroup builds one OpChannel per operation and passes it
through its `channel_wrappers` before the algorithm sees it. So tracing is off, and costs
nothing, unless a tracer is installed, and it sees exactly what the algorithm does whatever
the transport underneath. Each event is a dict:

    rank, i (its index on that rank), kind ("send" | "recv" | "reduce"), peer, src, dst,
    op ("all_reduce", ...), opkey (the same string on every rank for one operation),
    msg (index of this message between src and dst in this op: pairs a send with its recv),
    phase, step, chunk (the algorithm's labels), nbytes, count, offset (first element, relative
    to the numpy buffer the slice was cut from), dtype,
    t0, t1 (seconds since the tracer was made; a recv's span includes the wait),
    vt0, vt1 (virtual seconds, when an emulate.LinkModel sits below the tracer, else None),
    data (the values sent / after the receive, only with record_data=True).

In a multi-process run each process has its own tracer; `merge` lines their files up on the
wall clock (`epoch` is time.time() when each tracer was made).
"""

from __future__ import annotations

import json
import threading
import os
import time
from typing import Any, Callable, Iterable, Union

import numpy as np

from ..group.group import ProcessGroup
from ..transport.wrapper import ChannelWrapper

Path = Union[str, "os.PathLike[str]"]

__all__ = ["Tracer", "op_key", "match_messages", "chrome_trace", "load", "merge"]


def op_key(ch: Any) -> str:
    """A name for the operation `ch` belongs to that every rank computes alike.

    Collectives share one sequence number per group ("c<seq>"); send/recv pairs have their own
    per direction ("p<seq>:<sender>><receiver>").
    """
    stream = getattr(ch, "stream", 0)
    seq = getattr(ch, "seq", 0)
    if stream == 0:
        return f"c{seq}"
    peers = getattr(ch, "abort_peers", None) or [None]
    peer = peers[0]
    if getattr(ch, "op_name", "") == "send":
        return f"p{seq}:{ch.rank}>{peer}"
    return f"p{seq}:{peer}>{ch.rank}"


def _offset(arr: np.ndarray) -> int:
    """Index of arr's first element in the numpy array it was sliced from (best effort)."""
    base = arr
    while isinstance(base.base, np.ndarray):
        base = base.base
    if base is arr or not arr.size or not arr.itemsize:
        return 0
    delta = arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return int(delta // arr.itemsize)


class _TracedChannel(ChannelWrapper):
    def __init__(self, ch: Any, tracer: "Tracer") -> None:
        super().__init__(ch)
        self._tr = tracer
        self.key = op_key(ch)
        self.op = getattr(ch, "op_name", "")
        self._sent = [0] * ch.size  # per peer: messages sent in this op (pairs send/recv)
        self._got = [0] * ch.size

    def send(self, peer, buf, *, phase="", step=0, chunk=0):
        msg = self._sent[peer]
        self._sent[peer] += 1
        data = self._tr.data_of(buf)
        t0 = time.perf_counter()
        self._ch.send(peer, buf, phase=phase, step=step, chunk=chunk)
        t1 = time.perf_counter()
        self._tr.record(
            self, "send", peer, self.rank, peer, msg, buf, phase, step, chunk, t0, t1, data
        )

    def _recv(self, kind, peer, out, call, phase, step, chunk):
        msg = self._got[peer]
        self._got[peer] += 1
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        self._tr.record(
            self,
            kind,
            peer,
            peer,
            self.rank,
            msg,
            out,
            phase,
            step,
            chunk,
            t0,
            t1,
            self._tr.data_of(out),
        )

    def recv_into(self, peer, out, *, phase="", step=0, chunk=0):
        self._recv(
            "recv",
            peer,
            out,
            lambda: self._ch.recv_into(peer, out, phase=phase, step=step, chunk=chunk),
            phase,
            step,
            chunk,
        )

    def recv_reduce(self, peer, out, op, *, phase="", step=0, chunk=0):
        self._recv(
            "reduce",
            peer,
            out,
            lambda: self._ch.recv_reduce(peer, out, op, phase=phase, step=step, chunk=chunk),
            phase,
            step,
            chunk,
        )


class Tracer:
    """Records channel events of every operation of every group it is installed on.

    record_data: also keep the values of each message (for small teaching runs; capped at
    `max_data` elements per event). on_event: called with each event dict, in the rank's thread.
    """

    def __init__(
        self,
        *,
        record_data: bool = False,
        max_data: int = 4096,
        on_event: Callable[[dict], object] | None = None,
    ) -> None:
        self.events: list[dict] = []
        self.record_data = record_data
        self.max_data = max_data
        self.on_event = on_event
        self.epoch = time.time()
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._count: dict[int, int] = {}

    # --- installing -------------------------------------------------------------------------------
    def wrap(self, ch: Any) -> Any:
        """The channel wrapper: append `tracer.wrap` to pg.channel_wrappers."""
        return _TracedChannel(ch, self)

    def install(self, pg: ProcessGroup) -> "Tracer":
        pg.channel_wrappers.append(self.wrap)
        return self

    # --- recording --------------------------------------------------------------------------------
    def data_of(self, arr: np.ndarray) -> list | None:
        """The values of `arr` as an event records them, where record_data says so."""
        if not self.record_data or arr.size > self.max_data:
            return None
        return arr.tolist()

    def record(
        self,
        ch: _TracedChannel,
        kind: str,
        peer: int,
        src: int,
        dst: int,
        msg: int,
        arr: np.ndarray,
        phase: str,
        step: Any,
        chunk: Any,
        t0: float,
        t1: float,
        data: list | None,
    ) -> None:
        """One transfer of a traced channel, as an event."""
        vspan = getattr(ch.inner, "last_vspan", None)
        ev = {
            "rank": ch.rank,
            "i": 0,
            "kind": kind,
            "peer": peer,
            "src": src,
            "dst": dst,
            "op": ch.op,
            "opkey": ch.key,
            "msg": msg,
            "phase": phase,
            "step": _plain(step),
            "chunk": _plain(chunk),
            "nbytes": int(arr.nbytes),
            "count": int(arr.size),
            "offset": _offset(arr),
            "dtype": arr.dtype.str,
            "t0": t0 - self._t0,
            "t1": t1 - self._t0,
            "vt0": vspan[0] if vspan else None,
            "vt1": vspan[1] if vspan else None,
        }
        if data is not None:
            ev["data"] = data
        with self._lock:
            ev["i"] = self._count.get(ch.rank, 0)
            self._count[ch.rank] = ev["i"] + 1
            self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def clear(self) -> None:
        with self._lock:
            self.events.clear()
            self._count.clear()

    # --- reading ----------------------------------------------------------------------------------
    def sorted_events(self) -> list[dict]:
        """Events by rank, then in each rank's program order (deterministic across runs)."""
        return sorted(self.events, key=lambda e: (e["rank"], e["i"]))

    def to_json(self) -> dict:
        return {
            "format": "collectives-trace",
            "version": 1,
            "epoch": self.epoch,
            "events": self.sorted_events(),
        }

    def save_json(self, path: Path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f)

    def to_chrome(self, time_base: str = "auto") -> dict:
        return chrome_trace(self.sorted_events(), time_base)

    def save_chrome(self, path: Path, time_base: str = "auto") -> None:
        with open(path, "w") as f:
            json.dump(self.to_chrome(time_base), f)


def _plain(x):
    """Labels as JSON-friendly ints or strings."""
    if isinstance(x, (int, np.integer)):
        return int(x)
    return x if isinstance(x, (str, float)) or x is None else str(x)


def match_messages(events: Iterable[dict]) -> dict:
    """(opkey, src, dst, msg) -> {"send": event, "recv": event}, for every message seen."""
    pairs: dict = {}
    for e in events:
        key = (e["opkey"], e["src"], e["dst"], e["msg"])
        pairs.setdefault(key, {})["send" if e["kind"] == "send" else "recv"] = e
    return pairs


def chrome_trace(events: Iterable[dict], time_base: str = "auto") -> dict:
    """The Chrome trace format (chrome://tracing, ui.perfetto.dev): one track per rank, a slice
    per event, and a flow arrow from each send to its receive.

    time_base: "real", "virtual" (emulated link times), or "auto" (virtual when every event has
    one).
    """
    events = list(events)
    virtual = all(e.get("vt0") is not None for e in events) and bool(events)
    if time_base == "real":
        virtual = False
    elif time_base == "virtual" and not virtual:
        raise ValueError(
            "chrome_trace: time_base='virtual' needs an emulate.LinkModel below the "
            "tracer (some events have no virtual time)"
        )
    a, b = ("vt0", "vt1") if virtual else ("t0", "t1")
    out = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": 0,
            "tid": 0,
            "args": {"name": "collectives" + (" (emulated time)" if virtual else "")},
        }
    ]
    for r in sorted({e["rank"] for e in events}):
        out.append(
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}}
        )
        out.append(
            {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": r, "args": {"sort_index": r}}
        )
    for e in events:
        arrow = "->" if e["kind"] == "send" else "<-"
        out.append(
            {
                "ph": "X",
                "pid": 0,
                "tid": e["rank"],
                "cat": e["phase"] or e["op"],
                "name": f"{e['kind']} chunk {e['chunk']} {arrow} rank {e['peer']}",
                "ts": e[a] * 1e6,
                "dur": max((e[b] - e[a]) * 1e6, 0.0),
                "args": {
                    k: e[k]
                    for k in (
                        "op",
                        "opkey",
                        "phase",
                        "step",
                        "chunk",
                        "msg",
                        "nbytes",
                        "count",
                        "offset",
                        "src",
                        "dst",
                    )
                },
            }
        )
    for n, (key, pair) in enumerate(
        sorted(match_messages(events).items(), key=lambda kv: str(kv[0]))
    ):
        if "send" not in pair or "recv" not in pair:
            continue
        s, r = pair["send"], pair["recv"]
        common = {"pid": 0, "cat": "message", "name": "message", "id": n}
        out.append({"ph": "s", "tid": s["rank"], "ts": (s[a] + s[b]) / 2 * 1e6, **common})
        out.append(
            {"ph": "f", "bp": "e", "tid": r["rank"], "ts": (r[a] + r[b]) / 2 * 1e6, **common}
        )
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def load(path: Path) -> dict:
    """Read a file written by Tracer.save_json."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("format") != "collectives-trace":
        raise ValueError(f"{path}: not a collectives trace (written by Tracer.save_json)")
    return doc


def merge(*docs: Any) -> list[dict]:
    """Events of several tracers (dicts from Tracer.to_json or load, or paths), one per process,
    on one time line: times are rebased on the earliest tracer's wall-clock epoch."""
    docs = [
        load(d) if isinstance(d, (str, bytes)) or hasattr(d, "__fspath__") else d  # type: ignore[assignment]
        for d in docs
    ]
    if not docs:
        return []
    first = min(d["epoch"] for d in docs)
    events = []
    for d in docs:
        shift = d["epoch"] - first
        for e in d["events"]:
            events.append({**e, "t0": e["t0"] + shift, "t1": e["t1"] + shift})
    return sorted(events, key=lambda e: (e["rank"], e["i"]))
