"""The crash, reconstruct and join views (`python -m collectives.explain crash|reconstruct|
join`): teaching/failures.py's events as a sequence of moments, one node per process (the
joiner and the coordinator last) so that a process keeps its place while its rank changes
(the model: views.py)."""

from __future__ import annotations

from typing import Any

from .graph_model import ALIVE, BLAMED, BLUE, COORD, DEAD, GREEN, GREY, JOINER, RED, STOPPED
from .graph_model import circle, node


def _procs(story: Any) -> tuple[list, dict]:
    """Node order: rank0..rank{n-1} of generation 0, the joiner, the coordinator; positions."""
    n = story.n
    names = [f"rank{r}" for r in range(n)] + ["joiner", "coord"]
    xy = dict(zip(names, circle(n) + [(530.0, 330.0), (530.0, 70.0)]))
    return names, xy


def _frame(story: Any, title: str, note: str, text: list, state: dict, arrows: list) -> dict:
    """state: proc -> (label, sub, color) or None (hidden)."""
    names, xy = _procs(story)
    nodes = []
    for nm in names:
        st = state.get(nm)
        if st is None:
            nodes.append(node("", xy[nm], hidden=True))
            continue
        label, sub, color = st
        nodes.append(
            node(
                label,
                xy[nm],
                color,
                sub,
                text="#fff" if color in (DEAD, BLAMED) else "#000",
                dashed=color in (STOPPED, JOINER) and "wait" in sub,
            )
        )
    idx = {nm: i for i, nm in enumerate(names)}
    arr = [
        {"src": idx[a], "dst": idx[b], "color": c, "dashed": d, "label": lab, "bend": 0.12}
        for a, b, c, d, lab in arrows
    ]
    return {"title": title, "note": note, "text": text, "nodes": nodes, "arrows": arr}


def _gen0(story: Any) -> dict:
    return {f"rank{r}": (f"rank {r}", "gen 0", ALIVE) for r in range(story.n)} | {
        "coord": ("coord", "", COORD)
    }


def crash_model(story: Any, stepped: Any = None) -> dict:
    n, v = story.n, story.victim
    surv = [r for r in range(n) if r != v]
    kill = story.signal == "KILL"
    base = _gen0(story)
    gone = dict(
        base,
        **{f"rank{v}": (f"rank {v}", "killed" if kill else "stopped", DEAD if kill else STOPPED)},
    )
    fails = {p: e for p, e in story.events if e["event"] == "failure"}
    det = story.detection or 0.0
    coord_line = next((w for _, w in story.coordinator if "removed" in w), "")
    ring = [(f"rank{r}", f"rank{(r + 1) % n}", GREY, False, "") for r in range(n)]
    frames = [
        _frame(
            story,
            f"generation 0: {n} ranks, {story.stop_at} steps done",
            "the ring's links",
            [f"every rank has committed steps 1..{story.stop_at}"],
            base,
            ring,
        ),
        _frame(
            story,
            f"step {story.stop_at + 1}: rank {v} gets SIG{story.signal}",
            "killed: the kernel ends it and closes its sockets"
            if kill
            else "stopped: it holds its sockets open and says nothing",
            [f"kill -{story.signal} <pid of rank {v}>"],
            gone,
            [a for a in ring if f"rank{v}" not in a[:2]],
        ),
    ]
    if kill:
        # Name the witness the survivors' errors name: the coordinator's pidfd of the dead
        # process, or the survivors' own closed connections (transport/zmq/peerwatch.py).
        errors = " ".join(str(e["error"]) for e in fails.values())
        if "pidfd" in errors:
            title = f"the kernel's witness: rank {v}'s pidfd, on the coordinator's host"
            arrows = [("coord", f"rank{v}", RED, True, "pidfd")] + [
                ("coord", f"rank{r}", BLUE, False, f"rank {v} died") for r in surv
            ]
        else:
            title = f"the kernel's witness: connections to rank {v} closed"
            arrows = [(f"rank{r}", f"rank{v}", RED, True, "closed") for r in surv]
        frames.append(
            _frame(
                story,
                title,
                f"the survivors' PeerFailure {det:.2f} s after the signal",
                [f"rank {e['rank']}: {e['error']}" for e in fails.values()],
                gone,
                arrows,
            )
        )
    # Which of the coordinator's witnesses spoke: the heartbeats (a frozen process), or, for a
    # dead one, its own kernel witnesses -- the pidfd, the closed connection, the launcher's
    # report (membership/liveness.py) -- usually before the heartbeat timeout.
    by_beats = "no heartbeat" in coord_line or not coord_line
    frames.append(
        _frame(
            story,
            "the heartbeats' witness: the coordinator declares it dead"
            if by_beats
            else "the coordinator's witness: it declares it dead (pidfd or closed connection)",
            coord_line or "no heartbeat for the timeout",
            ([] if kill else [f"rank {e['rank']}: {e['error']}" for e in fails.values()]),
            gone,
            [("coord", f"rank{v}", RED, True, "no heartbeat" if by_beats else "died")]
            + [("coord", f"rank{r}", BLUE, False, f"rank {v} dead") for r in surv],
        )
    )
    drop = [
        f"step {e['step']} raised PeerFailure on rank {e['rank']}: dropped, redone in the "
        f"next generation"
        for e in fails.values()
    ]
    if stepped is not None:
        drop += [
            f"stepped in-process: rank {stepped.victim} stops after {stepped.after} "
            "events; "
            + ", ".join(f"rank {r} holds the result: {h}" for r, h in stepped.held.items()),
            f"  -> {stepped.outcome} (commit only if every survivor holds it)",
        ]
    frames.append(
        _frame(
            story,
            "commit or drop: the step is dropped on every survivor",
            "no survivor holds its result, so none counts it",
            drop,
            gone,
            [],
        )
    )
    return {
        "kind": "graph",
        "title": f"SIG{story.signal} of rank {v} in a job of {n} ranks",
        "frames": frames,
        "summary": "",
        "legend": "blue: a live rank; black: killed; grey: stopped; orange: the "
        "coordinator; red dashed: the witness that found it",
    }


def _after(story: Any) -> dict:
    v = story.victim
    ren = story.renumbering()
    st = {f"rank{old}": (f"rank {new}", f"was {old}, gen 1", ALIVE) for old, new in ren.items()}
    st[f"rank{v}"] = ("(old 1)".replace("1", str(v)), "gone", STOPPED)
    st["coord"] = ("coord", "", COORD)
    return st


def reconstruct_model(story: Any, stepped: list | None = None) -> dict:
    v = story.victim
    ren = story.renumbering()
    surv = sorted(ren)
    failed = _gen0(story) | {f"rank{v}": (f"rank {v}", "dead", DEAD)}
    after = _after(story)
    steps = [e for p, e in story.events if e["event"] == "step" and e["generation"] == 1]
    frames = [
        _frame(
            story,
            "the survivors hold a PeerFailure",
            "their group of generation 0 is unusable",
            [f"rank {r}: raised PeerFailure in step {story.stop_at + 1}" for r in surv],
            failed,
            [],
        ),
        _frame(
            story,
            "each survivor calls pg.reconstruct()",
            "a barrier at the coordinator",
            ["new = pg.reconstruct()   # collective among the live members"],
            failed,
            [(f"rank{r}", "coord", BLUE, False, "reconstruct") for r in surv],
        ),
        _frame(
            story,
            f"generation 1: {len(surv)} ranks, renumbered densely",
            "ranks in the order of the old ranks",
            [
                f"rank {old} of generation 0 is rank {new} of generation 1"
                for old, new in sorted(ren.items())
            ],
            after,
            [("coord", f"rank{r}", BLUE, False, f"you are rank {ren[r]}") for r in surv],
        ),
        _frame(
            story,
            f"step {story.stop_at + 1} done again, on the new group",
            "the dropped step is redone: nobody counted it",
            [f"rank {e['rank']} (gen 1): step {e['step']}, model {e['model'][0]:g}" for e in steps]
            + (
                [f"stepped in-process, the redo on {len(surv)} ranks:"]
                + [f"  {ln}" for ln in stepped]
                if stepped
                else []
            ),
            after,
            [(f"rank{a}", f"rank{b}", GREY, False, "") for a, b in zip(surv, surv[1:] + surv[:1])],
        ),
    ]
    return {
        "kind": "graph",
        "title": f"Reconstruction after rank {v} died: generation 0 -> 1",
        "frames": frames,
        "summary": "",
        "legend": "blue: a live rank (its new rank; 'was' its old one); grey: gone",
    }


def join_model(story: Any, stepped: list | None = None) -> dict:
    after = _after(story)
    after.pop(f"rank{story.victim}")  # out of the picture by now
    adm = {p: e for p, e in story.events if e["event"] == "generation" and e["why"] == "admitted"}
    joined = next((e for p, e in story.events if e["event"] == "admitted"), None)
    model = next((e for p, e in story.events if e["event"] == "model"), None)
    finals = story.finals()
    waiting = after | {"joiner": ("joiner", "waits to join", JOINER)}
    jr = joined["rank"] if joined else "?"
    gen = joined["generation"] if joined else "?"
    inside = {nm: (f"rank {e['rank']}", f"gen {e['generation']}", ALIVE) for nm, e in adm.items()}
    admitted = after | inside | {"joiner": (f"rank {jr}", f"joined, gen {gen}", JOINER)}
    members = sorted(adm)
    root = next((nm for nm, e in adm.items() if e["rank"] == 0), "rank0")
    order = sorted(members, key=lambda nm: adm[nm]["rank"]) + ["joiner"]  # the new ring
    frames = [
        _frame(
            story,
            "a new process asks to join",
            "init_process_group(join=True)",
            ["it waits until the members next call reconstruct()"],
            waiting,
            [("joiner", "coord", GREEN, True, "join")],
        ),
        _frame(
            story,
            f"the members' reconstruct() admits it: generation {gen}",
            "joiners get the last ranks",
            [f"joiner -> rank {jr} of generation {gen}"]
            + [f"{nm}: rank {e['old_rank']} -> rank {e['rank']}" for nm, e in adm.items()],
            admitted,
            [("coord", nm, BLUE, False, "admitted") for nm in members + ["joiner"]],
        ),
        _frame(
            story,
            "rank 0 broadcasts the model and the step count",
            "pg.broadcast(state, src=0)",
            (
                [f"joiner receives step {model['step']}, model {model['model'][0]:g}"]
                if model
                else []
            )
            + (
                [f"stepped in-process, the broadcast on {story.n} ranks:"]
                + [f"  {ln}" for ln in stepped]
                if stepped
                else []
            ),
            admitted,
            [
                (root, nm, GREEN, False, "(step, model)")
                for nm in members + ["joiner"]
                if nm != root
            ],
        ),
        _frame(
            story,
            "everyone trains on, in step",
            "the same model on every rank",
            [
                f"{nm}: rank {e['rank']}, step {e['step']}, model {e['model'][0]:g}"
                for nm, e in sorted(finals.items())
            ],
            admitted,
            [(a, b, GREY, False, "") for a, b in zip(order, order[1:] + order[:1])],
        ),
    ]
    return {
        "kind": "graph",
        "title": "A joiner admitted and given the model",
        "frames": frames,
        "summary": "",
        "legend": "green: the joiner; blue: members; orange: the coordinator",
    }
