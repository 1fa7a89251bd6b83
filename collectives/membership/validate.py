"""Every message the coordinator takes, checked field by field before any handler reads it.

`check(msg)` returns the message reduced to the fields its type has, each of the expected type
and range, or raises Invalid saying what is wrong. A handler (server.py) therefore never sees a
list where it expects a member id, a string where it expects a rank, a missing field or a
megabyte of something it will keep: what arrives is never trusted, even from a peer holding the
job secret (a member gone bad, or a bug). Fields a type does not have are dropped, so a newer
client's extra field costs nothing; the message as a whole is bounded by the socket's maximum
message size (server.py).
"""

from __future__ import annotations

from typing import Any, Callable

# A field's check: (value, field name for the error) -> the value as the handler gets it
Check = Callable[[Any, str], Any]

MAX_RANKS = 1 << 20  # world sizes and rank numbers
MAX_SEQ = 1 << 62  # op sequence numbers
MAX_GENERATION = 1 << 31
MID_CHARS = 64  # a member id is uuid4().hex: 32 characters
MAX_TIMEOUT = 1e7  # seconds a request may ask the coordinator to wait
MAX_INFO_KEYS = 16
MAX_STR = 512  # an address, a host id, an arena's name
MAX_DONE = 64  # ops a progress report may say how they ended


class Invalid(ValueError):
    """A message that is not what its type says it is."""


def _int(lo: int, hi: int) -> Check:
    def check(v: Any, name: str) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise Invalid(f"{name} must be an integer in {lo}..{hi}, got {_show(v)}")
        return v

    return check


def _opt(inner: Check) -> Check:
    def check(v: Any, name: str) -> Any:
        return None if v is None else inner(v, name)

    return check


def _bool(v: Any, name: str) -> bool:
    if type(v) is not bool:
        raise Invalid(f"{name} must be true or false, got {_show(v)}")
    return v


def _seconds(v: Any, name: str) -> float:
    if type(v) not in (int, float) or not 0 < v <= MAX_TIMEOUT:
        raise Invalid(f"{name} must be a number of seconds in (0, {MAX_TIMEOUT:g}], got {_show(v)}")
    return float(v)


def _str(max_len: int, min_len: int = 0) -> Check:
    def check(v: Any, name: str) -> str:
        if not isinstance(v, str) or not min_len <= len(v) <= max_len:
            raise Invalid(
                f"{name} must be a string of {min_len} to {max_len} characters, got {_show(v)}"
            )
        return v

    return check


def _ints(v: Any, name: str) -> list[int]:
    """A per-rank count list (sent, recv): at most MAX_RANKS non-negative integers."""
    if not isinstance(v, list) or len(v) > MAX_RANKS:
        raise Invalid(f"{name} must be a list of counts, got {_show(v)}")
    for x in v:
        if type(x) is not int or not 0 <= x <= MAX_SEQ:
            raise Invalid(f"{name} must hold counts, got {_show(x)}")
    return v


def _mids(v: Any, name: str) -> list[str]:
    """A generation's member ids by rank."""
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_RANKS:
        raise Invalid(f"{name} must be a list of member ids, got {_show(v)}")
    return [MID(m, name) for m in v]


def _ranks(v: Any, name: str) -> list[int]:
    if not isinstance(v, list) or len(v) > MAX_RANKS:
        raise Invalid(f"{name} must be a list of ranks, got {_show(v)}")
    return [_int(0, MAX_RANKS)(r, name) for r in v]


def _exclude(v: Any, name: str) -> list[int]:
    """Ranks to drop: distinct ranks, sorted (their range within the group: regroup.py)."""
    ranks = _ranks(v, name)
    if len(set(ranks)) != len(ranks):
        raise Invalid(f"{name} names a rank twice: {_show(v)}")
    return sorted(ranks)


def _done(v: Any, name: str) -> list[tuple[int, int]]:
    if not isinstance(v, list) or len(v) > MAX_DONE:
        raise Invalid(
            f"{name} must be a list of at most {MAX_DONE} [seq, how] pairs, got {_show(v)}"
        )
    out = []
    for pair in v:
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and type(pair[0]) is int
            and type(pair[1]) is int
            and -1 <= pair[0] <= MAX_SEQ
            and 0 <= pair[1] <= 8
        ):
            raise Invalid(f"{name} must hold [seq, how] pairs of integers, got {_show(pair)}")
        out.append(tuple(pair))
    return out


_SCALAR = (type(None), bool, int, float, str)


def _arena(v: Any, name: str) -> dict[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise Invalid(f"{name} must be a dict or null, got {_show(v)}")
    want = {
        "pid": _int(1, 1 << 31),
        "fd": _int(0, 1 << 31),
        "name": _str(MAX_STR, 1),
        "slots": _int(1, 1 << 16),
        "slot_bytes": _int(1, 1 << 40),
    }
    return {k: f(v.get(k), f"{name}.{k}") for k, f in want.items()}


# Known fields of an address are checked by type; others must be scalars (a rank checks the
# addresses it is given again before it connects: ZmqTransport.connect).
_INFO: dict[str, Check] = {
    "tcp": _str(MAX_STR, 1),
    "pid": _int(1, 1 << 31),
    "rank": _int(0, MAX_RANKS),
    "ipc": _opt(_str(MAX_STR, 1)),
    "host": _str(MAX_STR),
    "shm": _arena,
    "shm_host": _str(MAX_STR),
    "segment_bytes": _int(1, 1 << 40),
    "cpus": _opt(_str(MAX_STR, 1)),
    "lrank": _opt(_int(0, MAX_RANKS)),
}


def _info(v: Any, name: str) -> dict[str, Any]:
    """A rank's transport address (ZmqTransport.address_info): a small dict of known shape."""
    if not isinstance(v, dict) or len(v) > MAX_INFO_KEYS:
        raise Invalid(f"{name} must be a dict of at most {MAX_INFO_KEYS} entries, got {_show(v)}")
    out = {}
    for k, x in v.items():
        if not isinstance(k, str) or len(k) > 32:
            raise Invalid(f"{name} has a bad key {_show(k)}")
        check = _INFO.get(k)
        if check is not None:
            out[k] = check(x, f"{name}.{k}")
        elif isinstance(x, _SCALAR) and not (isinstance(x, str) and len(x) > MAX_STR):
            out[k] = x
        else:
            raise Invalid(f"{name}.{k} must be a scalar, got {_show(x)}")
    return out


def _heard(v: Any, name: str) -> list[float | None]:
    """A probe report: per rank, seconds until its probe arrived, or null (the handler checks
    the length against the world size)."""
    if not isinstance(v, list) or len(v) > MAX_RANKS:
        raise Invalid(f"{name} must be a list of at most {MAX_RANKS} entries, got {_show(v)}")
    for x in v:
        if x is not None and (type(x) not in (int, float) or not 0 <= x <= MAX_TIMEOUT):
            raise Invalid(f"{name} entries must be null or seconds, got {_show(x)}")
    return v


MAX_AGE = 1e7  # s: a send's age (Progress.sent_age); a process up for months stays under it


def _ages(v: Any, name: str) -> list[float | None]:
    """Per rank, seconds since this rank last sent to it, or null (never)."""
    if not isinstance(v, list) or len(v) > MAX_RANKS:
        raise Invalid(f"{name} must be a list of at most {MAX_RANKS} entries, got {_show(v)}")
    for x in v:
        if x is not None and (type(x) not in (int, float) or not 0 <= x <= MAX_AGE):
            raise Invalid(f"{name} entries must be null or seconds, got {_show(x)}")
    return v


def _elapsed(v: Any, name: str) -> float:
    if type(v) not in (int, float) or not 0 <= v <= MAX_TIMEOUT:
        raise Invalid(f"{name} must be a number of seconds, got {_show(v)}")
    return float(v)


def _sched(v: Any, name: str) -> list[int]:
    """A schedule book's state (transport/schedbook.BookState): four op numbers or versions,
    -1 for none."""
    if not isinstance(v, list) or len(v) != 4:
        raise Invalid(f"{name} must be a list of 4 integers, got {_show(v)}")
    for x in v:
        if type(x) is not int or not -1 <= x <= MAX_SEQ:
            raise Invalid(f"{name} must hold integers in [-1, {MAX_SEQ}], got {_show(x)}")
    return v


def _link_rows(v: Any, name: str) -> list[Any]:
    """A beat's link summary (transport/linkstats.py): at most MAX_RANKS rows of six numbers;
    each row is checked again where it is read (LinkCounters.from_wire)."""
    if not isinstance(v, list) or len(v) > MAX_RANKS:
        raise Invalid(f"{name} must be a list of link rows, got {_show(v)}")
    for row in v:
        if not isinstance(row, list) or len(row) != 6:
            raise Invalid(f"{name} rows must be lists of six numbers, got {_show(row)}")
        for x in row:
            if type(x) not in (int, float) or not 0 <= x < 1e15:
                raise Invalid(f"{name} rows must hold non-negative numbers, got {_show(x)}")
    return v


MID = _str(MID_CHARS, 1)
_STATE: dict[str, Check] = {
    "mid": MID,
    "generation": _int(-1, MAX_GENERATION),
    "seq": _int(-1, MAX_SEQ),
    "in_op": _bool,
    "waiting_on": _opt(_int(0, MAX_RANKS)),
    "sent": _opt(_ints),
    "recv": _opt(_ints),
}
_STATE_OPTIONAL: dict[str, Check] = {"has_data": _bool, "done": _done, "sent_age": _ages}
_PID: dict[str, Check] = {"pid": _opt(_int(0, 1 << 31))}

# type -> (required fields, optional fields)
SCHEMAS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "join": (
        {"rank": _int(0, MAX_RANKS), "world_size": _int(1, MAX_RANKS), "mid": MID, "info": _info},
        {},
    ),
    "status": ({}, {}),
    "beat": (_STATE, {**_STATE_OPTIONAL, "links": _link_rows}),
    # token: the diagnosis ping it answers (verdicts.py places the picture after that ping)
    "state": (_STATE, {**_STATE_OPTIONAL, "token": _int(0, MAX_SEQ)}),
    "progress": (_STATE, _STATE_OPTIONAL),
    "diagnose": (_STATE, {**_STATE_OPTIONAL, "timeout": _seconds, "probe": _bool}),
    "probed": (
        {
            "mid": MID,
            "generation": _int(0, MAX_GENERATION),
            "seq": _int(0, MAX_SEQ),
            "token": _int(0, MAX_SEQ),
            "heard": _heard,
            "elapsed": _elapsed,
        },
        {},
    ),
    "outcome": ({**_STATE, "timeout": _seconds}, _STATE_OPTIONAL),
    "leave": ({"mid": MID}, _PID),
    "join_request": ({"mid": MID}, {**_PID, "proc": _opt(_str(MAX_STR, 1)), "spare": _bool}),
    "reconstruct": (
        {"mid": MID, "generation": _int(0, MAX_GENERATION), "timeout": _seconds},
        {"seq": _int(-1, MAX_SEQ), "exclude": _exclude},
    ),
    "address": ({"mid": MID, "generation": _int(0, MAX_GENERATION), "info": _info}, {}),
    "rejoin": (
        {
            **_STATE,
            "generation": _int(0, MAX_GENERATION),
            "rank": _int(0, MAX_RANKS),
            "world_size": _int(1, MAX_RANKS),
            "members": _mids,
            "failed": _ranks,
            "forming": _int(-1, MAX_GENERATION),
        },
        {**_STATE_OPTIONAL, "sched": _sched},
    ),
    "exited": ({"proc": _str(MAX_STR, 1)}, {"code": _opt(_int(-255, 255))}),
    "sched_ack": (
        {
            "mid": MID,
            "generation": _int(0, MAX_GENERATION),
            "version": _int(0, MAX_SEQ),
            "ok": _bool,
        },
        {},
    ),
}


# Fields that hold one entry per rank (or fewer): no longer than the largest group the job can
# have (tables.max_ranks), whatever MAX_RANKS allows -- checked before anything else is.
PER_RANK = ("sent", "recv", "sent_age", "members", "failed", "heard", "exclude", "links")


def check(msg: Any, max_ranks: int = MAX_RANKS) -> dict[str, Any]:
    """The message reduced to its type's fields, all checked; Invalid if it is not one.
    max_ranks: the most entries a per-rank list may hold (PER_RANK)."""
    if not isinstance(msg, dict):
        raise Invalid(f"a message must be a dict, got {_show(msg)}")
    kind = msg.get("t")
    if not isinstance(kind, str) or kind not in SCHEMAS:
        raise Invalid(f"unknown message type {_show(kind)}")
    required, optional = SCHEMAS[kind]
    for name in PER_RANK:
        v = msg.get(name)
        if isinstance(v, list) and len(v) > max_ranks:
            raise Invalid(
                f"{kind}.{name} has {len(v)} entries, more than the {max_ranks} "
                "ranks this job can have"
            )
    out = {"t": kind}
    for name, f in required.items():
        if name not in msg:
            raise Invalid(f"{kind}: field {name!r} is missing")
        out[name] = f(msg[name], f"{kind}.{name}")
    for name, f in optional.items():
        if name in msg:
            out[name] = f(msg[name], f"{kind}.{name}")
    return out


def _show(v: Any) -> str:
    """A short description of a bad value for an error message (never the whole of it)."""
    text = repr(v)
    return f"{type(v).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
