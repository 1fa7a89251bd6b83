"""Deterministic fault injection, for tests, demos and teaching. Off (and free) unless asked.

A spec is a ';'-separated list of rules, given to `inject_faults(pg, spec)` or, for the
generation-0 group of each process, in $COLLECTIVES_FAULTS:

    delay:0->1:5s          hold every message on the link rank 0 -> rank 1 for 5 s (also 250ms)
    drop:2->0              the link rank 2 -> rank 0 loses every message
    kill:2@op=7            rank 2 SIGKILLs itself at its first transfer of op #7
    kill:1@op=3,phase=all-gather,step=1   ... at a given phase and step of that op
    stall:1@op=4:10s       rank 1 stops inside op #4 for 10 s (its heartbeat thread goes on)

Ranks and op numbers are those of the group the rules are installed on (op #0 is its first
collective). Link faults act at the receiving rank, which holds back or discards frames from
the sender; kill and stall act in a channel wrapper at the named rank's next transfer.

A new group made by reconstruct() starts without faults -- unless they follow the processes:
`inject_faults(pg, spec, by_launch_rank=True)`, or COLLECTIVES_FAULTS_SCOPE=process for
$COLLECTIVES_FAULTS, reads the ranks in the rules as *launch ranks* (the RANK each process of
generation 0 started with; every rank publishes its own with its address) and installs them
again in every generation, mapped to that generation's ranks. A slow link stays slow after
a reconstruct, as a real one would, so a wrong eviction shows as a second stall; op numbers
count from each generation's first op. A replacement that joined later has no launch rank
and no rules.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import config
from ..common.ops import ReduceOp
from .wrapper import ChannelWrapper, OpView

log = logging.getLogger("collectives")

_LINK = re.compile(r"^(delay|drop):(\d+)->(\d+)(?::([\d.]+)(ms|s)?)?$")
_AT = re.compile(r"^(kill|stall):(\d+)@([^:]+)(?::([\d.]+)(ms|s)?)?$")


@dataclass
class Rule:
    kind: str  # delay | drop | kill | stall
    rank: int  # where it acts: the receiving rank of a link, or the rank itself
    src: int | None = None  # link rules: the sending rank
    seconds: float = 0.0
    op: int | None = None
    phase: str | None = None
    step: int | None = None


def _seconds(value: str | None, unit: str | None, default: float) -> float:
    if value is None:
        return default
    return float(value) / (1000.0 if unit == "ms" else 1.0)


def parse(spec: str) -> list[Rule]:
    """Parse a fault spec; raise ValueError naming the rule that does not parse."""
    rules = []
    for text in filter(None, (part.strip() for part in (spec or "").split(";"))):
        m = _LINK.match(text)
        if m:
            kind, src, dst, value, unit = m.groups()
            if kind == "delay" and value is None:
                raise ValueError(f"fault {text!r}: a delay needs a duration, e.g. delay:0->1:5s")
            rules.append(Rule(kind, int(dst), src=int(src), seconds=_seconds(value, unit, 0.0)))
            continue
        m = _AT.match(text)
        if m:
            kind, rank, where, value, unit = m.groups()
            rule = Rule(kind, int(rank), seconds=_seconds(value, unit, 3600.0))
            for item in where.split(","):
                key, _, val = item.partition("=")
                if key == "op" and val.isdigit():
                    rule.op = int(val)
                elif key == "step" and val.isdigit():
                    rule.step = int(val)
                elif key == "phase" and val:
                    rule.phase = val
                else:
                    raise ValueError(
                        f"fault {text!r}: cannot read {item!r} (use op=N, phase=NAME, step=N)"
                    )
            if rule.op is None:
                raise ValueError(f"fault {text!r}: say at which op, e.g. kill:2@op=7")
            rules.append(rule)
            continue
        raise ValueError(
            f"fault {text!r} does not parse; examples: delay:0->1:5s, drop:2->0, "
            "kill:2@op=7, stall:1@op=4:10s"
        )
    return rules


class FaultyChannel(ChannelWrapper):
    """Wraps an op's channel; before each transfer, fires the kill/stall rules that match."""

    def __init__(self, inner: OpView, rules: list[Rule]):
        super().__init__(inner)
        self._rules = rules

    def _fire(self, phase: str, step: int) -> None:
        for rule in self._rules:
            if (
                rule.op != self.seq
                or (rule.phase and rule.phase != phase)
                or (rule.step is not None and rule.step != step)
            ):
                continue
            if rule.kind == "kill":
                log.warning(
                    "rank %d kills itself (injected fault: op #%d, %s step %s)",
                    self.rank,
                    rule.op,
                    phase,
                    step,
                )
                os.kill(os.getpid(), signal.SIGKILL)
            self._rules = [r for r in self._rules if r is not rule]  # a stall fires once
            log.warning(
                "rank %d stalls for %g s (injected fault: op #%d, %s step %s)",
                self.rank,
                rule.seconds,
                rule.op,
                phase,
                step,
            )
            time.sleep(rule.seconds)

    def send(
        self, peer: int, buf: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        self._fire(phase, step)
        super().send(peer, buf, phase=phase, step=step, chunk=chunk)

    def recv_into(
        self, peer: int, out: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        self._fire(phase, step)
        super().recv_into(peer, out, phase=phase, step=step, chunk=chunk)

    def recv_reduce(
        self,
        peer: int,
        out: np.ndarray,
        op: ReduceOp,
        *,
        phase: str = "",
        step: int = 0,
        chunk: int = 0,
    ) -> None:
        self._fire(phase, step)
        super().recv_reduce(peer, out, op, phase=phase, step=step, chunk=chunk)


def inject_faults(pg: Any, spec: str, by_launch_rank: bool = False) -> list[Rule]:
    """Install the rules of `spec` that concern this rank on group `pg` (a ProcessGroup: Any
    here, since the transport never imports the group); return them, in this group's ranks.
    by_launch_rank: the ranks in `spec` are launch ranks (see above); rules naming a process
    that is not in this group are skipped."""
    rules = parse(spec)
    if by_launch_rank:
        rules = _to_current_ranks(rules, pg.transport.launch_ranks)
    rules = [r for r in rules if r.rank == pg.rank]
    t = pg.transport
    for r in rules:
        if r.src is not None:
            if not 0 <= r.src < pg.world_size:
                raise ValueError(f"fault {r.kind}:{r.src}->{r.rank}: no rank {r.src}")
            t.set_link_fault(r.src, r.kind, r.seconds)
    at = [r for r in rules if r.src is None]
    if at:
        pg.channel_wrappers.append(lambda ch, at=at: FaultyChannel(ch, at))
    return rules


def _to_current_ranks(rules: list[Rule], launch_ranks: list[int | None] | None) -> list[Rule]:
    """The rules with launch ranks replaced by the current group's ranks; a rule that names
    a process not in the group is dropped."""
    if not launch_ranks:
        return []
    now = {lr: r for r, lr in enumerate(launch_ranks) if lr is not None}
    out = []
    for rule in rules:
        if rule.rank not in now or (rule.src is not None and rule.src not in now):
            continue
        out.append(
            Rule(
                rule.kind,
                now[rule.rank],
                None if rule.src is None else now[rule.src],
                rule.seconds,
                rule.op,
                rule.phase,
                rule.step,
            )
        )
    return out


def from_environment(pg: Any) -> None:
    """$COLLECTIVES_FAULTS on a group this process just formed. By default for generation 0
    only: a replacement that joins later, with the same environment, must not replay the
    faults meant for the original ranks. With COLLECTIVES_FAULTS_SCOPE=process, in every
    generation, following the processes by launch rank."""
    spec = config.fault_spec()
    if not spec:
        return
    if config.fault_scope() == "process":
        inject_faults(pg, spec, by_launch_rank=True)
    elif pg.generation == 0:
        inject_faults(pg, spec)
