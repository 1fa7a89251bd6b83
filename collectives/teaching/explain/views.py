"""The failure views (`python -m collectives.explain stall|crash|reconstruct|join`): each a
sequence of moments, built from what the run recorded (teaching/stall.py's diagnosis,
teaching/failures.py's events), drawn as a row of panels (PNG) and played by the page of
html.py -- the same model for both.

A model is {"kind": "graph", "title", "legend", "frames": [...], "summary"}; a frame is
{"title", "note", "nodes": [{label, sub, color, text, x, y, bold, dashed, hidden}],
"arrows": [{src, dst, color, dashed, label, bend}], "text": [lines]}, with nodes in a fixed
order (one per process, the coordinator last) so that a process keeps its place while its
rank changes.
"""

from __future__ import annotations

import math
from typing import Any

ALIVE, DEAD, STOPPED, BLAMED, JOINER, COORD = (
    "#9ecae1",
    "#333333",
    "#bdbdbd",
    "#d62728",
    "#74c476",
    "#fdd0a2",
)
RED, GREY, BLUE, GREEN = "#d62728", "#555555", "#1f77b4", "#2ca02c"
CX, CY, R = 260.0, 200.0, 135.0


def _circle(n: int) -> list:
    return [
        (
            CX + R * math.cos(math.pi / 2 - 2 * math.pi * r / n),
            CY - R * math.sin(math.pi / 2 - 2 * math.pi * r / n),
        )
        for r in range(n)
    ]


def _node(
    label: str, xy: Any, color: str = ALIVE, sub: str = "", text: str = "#000", **kw: Any
) -> dict:
    return {
        "label": label,
        "sub": sub,
        "color": color,
        "text": text,
        "x": round(xy[0], 1),
        "y": round(xy[1], 1),
        **kw,
    }


def _ring(ranks: list, color: str = GREY) -> list:
    """The ring's links between the given node indices (in rank order)."""
    k = len(ranks)
    return (
        [
            {
                "src": ranks[i],
                "dst": ranks[(i + 1) % k],
                "color": color,
                "dashed": False,
                "label": "",
                "bend": 0.12,
            }
            for i in range(k)
        ]
        if k > 1
        else []
    )


# --- stall ---------------------------------------------------------------------------------------
def stall_model(s: Any) -> dict:
    """Moments of teaching/stall.py's story: the ring, the slowed links, who waits on whom,
    the stalled links, the probes (when the verdict carries them), the verdict."""
    n = s.n
    xy = _circle(n)

    def nodes(blamed: Any = ()) -> list:
        return [
            _node(
                f"rank {r}",
                xy[r],
                BLAMED if r in blamed else ALIVE,
                text="#fff" if r in blamed else "#000",
                bold=r in blamed,
            )
            for r in range(n)
        ]

    slowed = [
        {"src": a, "dst": b, "color": RED, "dashed": False, "label": "held back", "bend": 0.12}
        for a, b in s.slowed
    ]
    waits, lines = [], []
    for r in range(n):
        st = s.states[r]
        if st and st.get("waiting_on") is not None:
            p = st["waiting_on"]
            sent = ((s.states[p] or {}).get("sent") or [0] * n)[r]
            took = (st.get("recv") or [0] * n)[p]
            waits.append(
                {
                    "src": r,
                    "dst": p,
                    "color": GREY,
                    "dashed": True,
                    "label": f"waits on {p}",
                    "bend": -0.18,
                }
            )
            lines.append(f"rank {r} waits on rank {p}: rank {p} sent it {sent}, it took {took}")
    stalled = []
    for p, r in s.links:
        sent = ((s.states[p] or {}).get("sent") or [0] * n)[r]
        took = ((s.states[r] or {}).get("recv") or [0] * n)[p]
        stalled.append(
            {
                "src": p,
                "dst": r,
                "color": RED,
                "dashed": False,
                "label": f"stalled: sent {sent}, taken {took}",
                "bend": 0.12,
            }
        )
    probes, plines = [], []
    for pr in s.evidence.get("probes", []):
        sec = pr.get("seconds")
        label = "no answer" if sec is None else f"{sec * 1e3:.0f} ms"
        plines.append(f"probe {pr['src']}->{pr['dst']}: {label}")
        if sec is None:  # the links the probes found slow; the others answered
            probes.append(
                {
                    "src": pr["src"],
                    "dst": pr["dst"],
                    "color": BLUE,
                    "dashed": True,
                    "label": "probe: no answer",
                    "bend": -0.3,
                }
            )
    decided = s.evidence.get("decided_by") or s.why
    frames = [
        {
            "title": f"ring all_reduce on {n} ranks (op #{s.seq})",
            "nodes": nodes(),
            "arrows": _ring(list(range(n))),
            "text": ["each rank sends to its right neighbour"],
            "note": "the ring's links",
        },
        {
            "title": f"link(s) {', '.join(f'{a}->{b}' for a, b in s.slowed)} hold every "
            "message back",
            "nodes": nodes(),
            "arrows": slowed,
            "note": "an unstable network (fault injection)",
            "text": [" and ".join(f"delay:{a}->{b}" for a, b in s.slowed)],
        },
        {
            "title": "the op passes its deadline: a snapshot of who waits on whom",
            "nodes": nodes(),
            "arrows": waits,
            "text": lines,
            "note": "each rank's op, peer, messages sent and taken",
        },
        {
            "title": "stalled links: sent but not taken",
            "nodes": nodes(),
            "arrows": stalled,
            "text": [f"stalled {p}->{r}" for p, r in s.links] or ["no stalled link"],
            "note": "a message on the wire for longer than the deadline",
        },
    ]
    if plines:
        frames.append(
            {
                "title": "evidence: every link probed",
                "nodes": nodes(),
                "arrows": probes,
                "text": plines,
                "note": "a timed probe over each data link; blue: not heard",
            }
        )
    frames.append(
        {
            "title": f"verdict: rank {', '.join(map(str, s.blamed))} blamed",
            "nodes": nodes(s.blamed),
            "arrows": stalled + probes,
            "text": [f"decided by: {decided}"],
            "note": f"decided by: {decided}"[:90],
        }
    )
    return {
        "kind": "graph",
        "title": f"Stalled all_reduce, {n} ranks",
        "frames": frames,
        "legend": "red: slowed or stalled link; grey dashed: waits on; blue dashed: a "
        "probe; the blamed rank in red",
        "summary": "",
    }


# --- crash, reconstruct, join (teaching/failures.py) ----------------------------------------------
def _procs(story: Any) -> tuple[list, dict]:
    """Node order: rank0..rank{n-1} of generation 0, the joiner, the coordinator; positions."""
    n = story.n
    names = [f"rank{r}" for r in range(n)] + ["joiner", "coord"]
    xy = dict(zip(names, _circle(n) + [(530.0, 330.0), (530.0, 70.0)]))
    return names, xy


def _frame(story: Any, title: str, note: str, text: list, state: dict, arrows: list) -> dict:
    """state: proc -> (label, sub, color) or None (hidden)."""
    names, xy = _procs(story)
    nodes = []
    for nm in names:
        st = state.get(nm)
        if st is None:
            nodes.append(_node("", xy[nm], hidden=True))
            continue
        label, sub, color = st
        nodes.append(
            _node(
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
        frames.append(
            _frame(
                story,
                f"the kernel's witness: connections to rank {v} closed",
                f"the survivors' PeerFailure {det:.2f} s after the signal",
                [f"rank {e['rank']}: {e['error']}" for e in fails.values()],
                gone,
                [(f"rank{r}", f"rank{v}", RED, True, "closed") for r in surv],
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
            coord_line[:90] or "no heartbeat for the timeout",
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
            "  the stepped events:",
        ] + [f"  {ln}" for ln in stepped.log]
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


# --- PNG: the frames as a row of panels ----------------------------------------------------------
def draw_panels(model: dict, path: str, per_row: int = 3) -> str:
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = model["frames"]
    rows = (len(frames) + per_row - 1) // per_row
    fig, axes = plt.subplots(rows, per_row, figsize=(4.6 * per_row, 3.9 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= len(frames):
            continue
        f = frames[i]
        ax.set_xlim(0, 600)
        ax.set_ylim(450, 20)
        ax.set_aspect("equal")
        nodes = f["nodes"]
        for a in f["arrows"]:
            p, q = nodes[a["src"]], nodes[a["dst"]]
            ax.annotate(
                "",
                xy=(q["x"], q["y"]),
                xytext=(p["x"], p["y"]),
                arrowprops=dict(
                    arrowstyle="-|>",
                    color=a["color"],
                    lw=1.4 if a["dashed"] else 2.2,
                    linestyle="--" if a["dashed"] else "-",
                    shrinkA=17,
                    shrinkB=17,
                    connectionstyle=f"arc3,rad={-a.get('bend', 0.12)}",
                ),
            )
            if a.get("label"):
                b = a.get("bend", 0.12)
                mx = (p["x"] + q["x"]) / 2 + b * 0.75 * (q["y"] - p["y"])
                my = (p["y"] + q["y"]) / 2 - b * 0.75 * (q["x"] - p["x"])
                ax.text(
                    mx,
                    my,
                    a["label"],
                    fontsize=6.5,
                    color=a["color"],
                    ha="center",
                    va="center",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85),
                )
        for nd in nodes:
            if nd.get("hidden"):
                continue
            ax.add_patch(
                plt.Circle(
                    (nd["x"], nd["y"]),
                    42,
                    facecolor=nd["color"],
                    edgecolor="#333",
                    lw=2.5 if nd.get("bold") else 0.8,
                    linestyle="--" if nd.get("dashed") else "-",
                )
            )
            ax.text(
                nd["x"],
                nd["y"] - 6,
                nd["label"],
                ha="center",
                va="center",
                fontsize=7.5,
                weight="bold",
                color=nd["text"],
            )
            if nd["sub"]:
                ax.text(
                    nd["x"],
                    nd["y"] + 14,
                    nd["sub"],
                    ha="center",
                    va="center",
                    fontsize=5.5,
                    color=nd["text"],
                )
        ax.set_title(textwrap.fill(f"{i}. {f['title']}", 48), fontsize=8.5)
        lines = [textwrap.fill(f["note"], 80)] if f.get("note") else []
        lines += [ln if len(ln) <= 90 else ln[:87] + "..." for ln in f.get("text", [])[:5] if ln]
        ax.text(
            10,
            365,
            "\n".join(lines),
            ha="left",
            va="top",
            fontsize=6.3,
            color="#333",
            family="monospace",
        )
    fig.suptitle(model["title"], fontsize=11)
    fig.text(0.01, 0.005, model.get("legend", ""), fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def text(model: dict) -> str:
    out = [model["title"], ""]
    for i, f in enumerate(model["frames"]):
        out.append(f"{i}. {f['title']}" + (f" -- {f['note']}" if f.get("note") else ""))
        out += [f"     {ln}" if ln else "" for ln in f.get("text", [])]
    return "\n".join(out) + "\n"
