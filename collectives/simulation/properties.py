"""The properties every simulated run must keep (checked by `check` after each run):

innocent   no process without a fault of its own (a slowed or cut link it is the cover of,
           its crash, its stop) is removed from its generation while a culprit is still a
           member, or when no culprit fault struck at all
agreement  every survivor ends in the same generation, with the same committed steps and
           equal results
op bound   every op ends (or its process was crashed/stopped/cut off) within its bound: the
           deadline, the diagnosis' wait, the outcome's, a starved wait's look at the notice,
           and the coordinator's grace where it died meanwhile
detection  every culprit fault is acted on (its process removed, or ends itself cut off)
           within its bound after it struck
cost       k culprit faults cost at most k new generations
"""

from __future__ import annotations

from dataclasses import dataclass

from .world import WAKE_EVERY, World


@dataclass(frozen=True)
class Violation:
    prop: str
    what: str


def op_bound(w: World) -> float:
    c = w.cfg
    diagnose = max(2.0, 4 * c.heartbeat_interval) + 2 * c.op_timeout
    bound = c.op_timeout + diagnose + (c.op_timeout + 5.0) + WAKE_EVERY + 0.1
    return bound + (c.grace if w.coord_down else 0.0)


def detection_bound(w: World, kind: str) -> float:
    c = w.cfg
    if kind == "crash":
        bound = 0.1 + c.tick
    elif kind in ("stop", "isolated"):
        bound = c.heartbeat_timeout + c.heartbeat_interval + 2 * c.tick
    else:  # a link fault: found by the next op's stall
        bound = c.compute[1] + 0.6 * c.op_timeout + op_bound(w)
    return bound + (c.grace + c.heartbeat_timeout if w.coord_down else 0.0) + 0.5


def check(w: World) -> list[Violation]:
    out: list[Violation] = []
    if w.hang is not None:
        out.append(Violation("hang", f"the run did not end: {w.hang}"))
    culprit_faults = [(i, f) for i, f in enumerate(w.faults) if f.culprits]
    culprits = {f.rank for _, f in culprit_faults}
    struck = {i: w.struck[i] for i, _ in culprit_faults if i in w.struck}
    removed_at: dict[int, float] = {}
    for r in w.removals:
        removed_at.setdefault(r.lid, r.at)
    # innocent
    for r in w.removals:
        if r.lid in culprits:
            continue
        live_culprit = [
            f.rank
            for i, f in culprit_faults
            if i in struck and struck[i] <= r.at and removed_at.get(f.rank, 1e9) > r.at
        ]
        if live_culprit or not struck:
            out.append(
                Violation(
                    "innocent",
                    f"rank (launch id) {r.lid} removed from generation {r.generation} at "
                    f"{r.at:.3f} s: {r.why}"
                    + (f" (culprit(s) {live_culprit} still members)" if live_culprit else ""),
                )
            )
    # agreement
    survivors = [p for p in w.procs if p.status == "done"]
    if not survivors:
        out.append(Violation("agreement", "no process finished"))
    gens = {p.gen for p in survivors}
    if len(gens) > 1:
        out.append(Violation("agreement", f"survivors end in generations {sorted(gens)}"))
    logs = {tuple(sorted(p.committed.items())) for p in survivors}
    if len(logs) > 1:
        detail = "; ".join(f"{p.lid}: {sorted(p.committed.items())}" for p in survivors)
        out.append(Violation("agreement", f"survivors' committed steps differ: {detail}"))
    for p in w.procs:
        if p.status == "up":
            out.append(Violation("op bound", f"rank {p.lid} still running at {w.now:.1f} s"))
    # op bound
    bound = op_bound(w)
    cut = {f.rank for f in w.faults if f.kind in ("crash", "stop", "isolated")}
    for sp in w.spans:
        if sp.ended is None:
            if sp.lid not in cut and w.procs[sp.lid].status not in ("crashed", "stopped"):
                out.append(
                    Violation(
                        "op bound", f"rank {sp.lid}'s op #{sp.seq} (gen {sp.gen}) never ended"
                    )
                )
        elif sp.ended - sp.begun > bound:
            out.append(
                Violation(
                    "op bound",
                    f"rank {sp.lid}'s op #{sp.seq} (gen {sp.gen}) took "
                    f"{sp.ended - sp.begun:.2f} s > {bound:.2f} s ({sp.how})",
                )
            )
    # detection
    for i, at in struck.items():
        f = w.faults[i]
        found = removed_at.get(f.rank)
        p = w.procs[f.rank]
        if found is None:
            if p.status in ("done",) and f.kind not in ("crash", "stop"):
                out.append(Violation("detection", f"{f.describe()}: its rank finished as a member"))
            continue
        if found - at > detection_bound(w, f.kind) and found >= at:
            out.append(
                Violation(
                    "detection",
                    f"{f.describe()}: found {found - at:.2f} s after it struck "
                    f"(bound {detection_bound(w, f.kind):.2f} s)",
                )
            )
    # cost
    for p in survivors:
        new = len(set(p.generations)) - 1
        if new > len(struck):
            out.append(
                Violation(
                    "cost",
                    f"{len(struck)} fault(s) cost rank {p.lid} {new} new generations "
                    f"({p.generations})",
                )
            )
    return out
