"""A recorded multi-process run, replayed (`python -m collectives.explain replay`): the failure
story's job (teaching/failures.py) with every worker reporting each message it sends or takes
as it happens (failure_worker.py traces its group), merged into one time line -- the process
that gets the SIGKILL included, up to its last message -- and told one operation a moment,
with the signal, the survivors' PeerFailure and the new generations where they fell.

A graph model, as the failure views (panels.py draws it, html.py plays it): processes on a
circle, a moment's messages as arrows (a count where a pair exchanged several).
"""

from __future__ import annotations

from typing import Any

from .failure_views import _procs
from .graph_model import ALIVE, BLUE, DEAD, GREY, JOINER, RED, STOPPED, node

MAX_LINES = 8  # message lines told per moment (the count says how many there were)


def _sends(story: Any) -> list:
    return [(p, e) for p, e in story.events if e["event"] == "msg" and e["kind"] == "send"]


def _who(story: Any) -> dict:
    """(generation, rank) -> the process that had that rank in that generation."""
    return {(e["generation"], e["rank"]): p for p, e in story.events if e["event"] == "msg"}


def moments(story: Any) -> list[dict]:
    """The run in time order: one moment per operation (its sends), and one each for the
    signal, the first PeerFailure and every new generation."""
    ops: dict = {}
    for p, e in _sends(story):
        key = (e["generation"], e["opkey"])
        ops.setdefault(key, {"kind": "op", "t": e["t"], "key": key, "op": e["op"], "sends": []})
        ops[key]["sends"].append((p, e))
    out = list(ops.values())
    if story.t_signal is not None:
        out.append({"kind": "signal", "t": story.t_signal})
    fails = story.of("failure")
    if fails:
        first = min(fails, key=lambda e: e["t"])
        out.append({"kind": "failure", "t": first["t"], "events": fails})
    gens: dict = {}
    for e in story.of("generation"):
        gens.setdefault(e["generation"], []).append(e)
    for g, evs in gens.items():
        out.append({"kind": "generation", "t": min(e["t"] for e in evs), "g": g, "events": evs})
    return sorted(out, key=lambda m: m["t"])


def replay_model(story: Any) -> dict:
    names, xy = _procs(story)
    idx = {nm: i for i, nm in enumerate(names)}
    who = _who(story)
    v, sig = story.victim, story.signal
    t0 = min((m["t"] for m in moments(story)), default=story.t0)
    state = {f"rank{r}": ALIVE for r in range(story.n)}
    label = {f"rank{r}": f"rank {r}" for r in range(story.n)}
    frames = []

    def nodes():
        out = []
        for nm in names:
            if nm not in state:
                out.append(node("", xy[nm], hidden=True))
                continue
            c = state[nm]
            out.append(node(label[nm], xy[nm], c, "", text="#fff" if c == DEAD else "#000"))
        return out

    for m in moments(story):
        when = f"t = {m['t'] - t0:.3f} s"
        if m["kind"] == "op":
            g, key = m["key"]
            pairs: dict = {}
            lines = []
            for p, e in m["sends"]:
                dst = who.get((g, e["dst"]), "")
                if dst:
                    pairs[(p, dst, e["phase"] in ("confirm", "commit"))] = (
                        pairs.get((p, dst, e["phase"] in ("confirm", "commit")), 0) + 1
                    )
                lines.append(
                    f"+{e['t'] - t0:.3f} s  {label.get(p, p)} -> {label.get(dst, dst)}  "
                    f"{e['phase']} step {e['step']}  {e['nbytes']} B"
                )
            arrows = [
                {
                    "src": idx[a],
                    "dst": idx[b],
                    "color": GREY if bookkeeping else BLUE,
                    "dashed": bookkeeping,
                    "label": f"x{k}" if k > 1 else "",
                    "bend": 0.12,
                }
                for (a, b, bookkeeping), k in pairs.items()
                if a in idx and b in idx
            ]
            more = len(lines) - MAX_LINES
            frames.append(
                {
                    "title": f"generation {g}: {m['op']} ({len(m['sends'])} messages)",
                    "note": when,
                    "nodes": nodes(),
                    "arrows": arrows,
                    "text": lines[:MAX_LINES] + ([f"... {more} more"] if more > 0 else []),
                }
            )
        elif m["kind"] == "signal":
            state[f"rank{v}"] = DEAD if sig == "KILL" else STOPPED
            label[f"rank{v}"] = f"rank {v} ({'killed' if sig == 'KILL' else 'stopped'})"
            frames.append(
                {
                    "title": f"SIG{sig} to rank {v}",
                    "note": when,
                    "nodes": nodes(),
                    "arrows": [],
                    "text": [f"kill -{sig} <pid of rank {v}>: its messages stop here"],
                }
            )
        elif m["kind"] == "failure":
            frames.append(
                {
                    "title": "the survivors' PeerFailure",
                    "note": f"{when}, {m['t'] - (story.t_signal or m['t']):.3f} s after the signal",
                    "nodes": nodes(),
                    "arrows": [
                        {
                            "src": idx[f"rank{e['rank']}"] if f"rank{e['rank']}" in idx else 0,
                            "dst": idx[f"rank{v}"],
                            "color": RED,
                            "dashed": True,
                            "label": "",
                            "bend": 0.12,
                        }
                        for e in m["events"]
                        if f"rank{e['rank']}" in idx and e["generation"] == 0
                    ],
                    "text": [f"rank {e['rank']}: {e['error']}" for e in m["events"]],
                }
            )
        else:
            for p, e in story.events:
                if e["event"] == "generation" and e["generation"] == m["g"]:
                    label[p] = f"rank {e['rank']}"
                if e["event"] == "admitted" and e["generation"] == m["g"]:
                    state[p], label[p] = JOINER, f"rank {e['rank']}"
            frames.append(
                {
                    "title": f"generation {m['g']}",
                    "note": when,
                    "nodes": nodes(),
                    "arrows": [],
                    "text": [
                        f"rank {e['old_rank']} -> rank {e['rank']} ({e['why']})"
                        for e in m["events"]
                    ],
                }
            )
    return {
        "kind": "graph",
        "title": f"A recorded run: SIG{sig} of rank {v} in a job of {story.n} processes, "
        "replayed from every process's messages",
        "legend": "blue: a moment's messages (xk: k of them between that pair); grey dashed: "
        "the confirm and commit rounds; red dashed: the survivors' PeerFailure",
        "frames": frames,
        "summary": f"{len(_sends(story))} messages recorded from {len(names) - 1} processes",
    }
