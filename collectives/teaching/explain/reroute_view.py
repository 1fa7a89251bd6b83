"""A slowed link and the schedule the library chooses around it
(`python -m collectives.explain slowlink --slow 0-1`), drawn as the failure views are.

Where the slowlink lesson (slow_link_view.py) emulates a slow link's cost, this view asks the
library's own choice: the figures the coordinator would hold (every link at `beta`, the slow
ones `factor` times slower in throughput -- what tc's rate limit does; their latency as the
others'), the plan it would hand every rank (algorithms/schedule.py plan_around), and what an
"auto" all_reduce runs under that plan at the chosen size and at a small one
(group/rerouted.py choose), each with the cost model's predicted time against the default
schedule's (algorithms/costmodel.py). No run: the predictions are the model's, which for
ring, tree, naive and direct are the emulated makespans (tests/unit/algorithms/test_costmodel.py).
"""

from __future__ import annotations

from ...algorithms import costmodel
from ...algorithms.costmodel import LinkCosts, Schedule, identity
from ...algorithms.schedule import plan_around
from ...algorithms.tree import children_of
from ...group import rerouted, tuning
from .graph_model import ALIVE, BLUE, RED, circle, node

SMALL_BYTES = 32 << 10  # what auto sends "direct" at 3 and 4 ranks (group/tuning.py)


def parse_slow(text: str, n: int) -> list[tuple[int, int]]:
    """'0-1' (the pair, both ways), '0->1' or '0:1' (one way), comma-separated."""
    out: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "->" in part or ":" in part:
                a, b = (int(v) for v in part.replace("->", ":").split(":"))
                pairs = [(a, b)]
            else:
                a, b = (int(v) for v in part.split("-"))
                pairs = [(a, b), (b, a)]
        except ValueError:
            raise ValueError(
                f"explain slowlink: --slow takes links like 0-1 (both ways) or 0->1, "
                f"comma-separated; got {text!r}"
            ) from None
        for x, y in pairs:
            if not (0 <= x < n and 0 <= y < n) or x == y:
                raise ValueError(
                    f"explain slowlink: {x}->{y} is not a link between two of {n} ranks"
                )
            if (x, y) not in out:
                out.append((x, y))
    return out


def _ms(t: float) -> str:
    return f"{t * 1e3:.2f} ms"


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):g} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:g} KiB"


def reroute_model(
    n: int,
    slow: list[tuple[int, int]],
    nbytes: int = 4 << 20,
    alpha: float = 50e-6,
    beta: float = 1e-9,
    factor: float = 50.0,
) -> dict:
    """The graph model: the default schedule over the slow link(s), the plan around them, and
    what a small all_reduce runs under it."""
    if n < 3:
        raise ValueError(f"explain slowlink --slow: needs at least 3 ranks, got {n}")
    if not slow:
        raise ValueError("explain slowlink --slow: name at least one slow link")
    rate = 1 / beta
    costs = LinkCosts.of(n, {link: rate / factor for link in slow}, rate=rate, alpha=alpha)
    plan = plan_around(n, slow, costs, nbytes)
    xy = circle(n)
    hot = {r for link in slow for r in link}
    slow_set = set(slow)
    f = f"{factor:g}x"

    def nodes():
        return [
            node(
                f"rank {r}", xy[r], RED if r in hot else ALIVE, text="#fff" if r in hot else "#000"
            )
            for r in range(n)
        ]

    def arrow(src, dst, color, dashed=False, label="", bend=0.12):
        return {
            "src": src,
            "dst": dst,
            "color": color,
            "dashed": dashed,
            "label": label,
            "bend": bend,
        }

    def draw(s: Schedule | None) -> list:
        out, used = [], set()
        if s is not None and s.kind == "ring":
            for i in range(n):
                a, b = s.order[i], s.order[(i + 1) % n]
                near = (b - a) % n in (1, n - 1)
                on = (a, b) in slow_set
                out.append(
                    arrow(
                        a,
                        b,
                        RED if on else BLUE,
                        label=f if on else "",
                        bend=0.12 if near else -0.45,
                    )
                )
                used.add((a, b))
        elif s is not None:  # a tree or a star: parent -> child (the reduce goes back up)
            n_ = len(s.order)
            kids = (
                {0: list(range(1, n_))}
                if s.kind == "naive"
                else {v: children_of(v, n_) for v in range(n_)}
            )
            for v, ks in kids.items():
                for k in ks:
                    a, b = s.order[v], s.order[k]
                    on = bool({(a, b), (b, a)} & slow_set)
                    out.append(arrow(a, b, RED if on else BLUE, label=f if on else "", bend=0.0))
                    used |= {(a, b), (b, a)}
        seen: set = set()
        for a, b in slow:  # the slow links the schedule leaves out
            if (a, b) not in used and (b, a) not in seen:
                seen.add((a, b))
                out.append(arrow(a, b, RED, dashed=True, label=f"{f}, unused", bend=0.5))
        return out

    big = tuning.all_reduce_algorithm(nbytes, n)
    small = tuning.all_reduce_algorithm(SMALL_BYTES, n)
    d_big = Schedule(big, identity(n))
    d_small = Schedule(small, identity(n))
    t_big = costmodel.predict(d_big, nbytes, costs)
    t_small = costmodel.predict(d_small, SMALL_BYTES, costs)
    healthy = costs.healthy()
    links = ", ".join(f"{a}->{b}" for a, b in slow)
    frames = [
        {
            "title": f"link(s) {links} {f} slower",
            "note": f"auto runs {big} for {_size(nbytes)}: predicted {_ms(t_big)} "
            f"(healthy {_ms(costmodel.predict(d_big, nbytes, healthy))})",
            "nodes": nodes(),
            "arrows": draw(d_big if big in ("ring", "tree", "naive") else None),
            "text": [
                f"every link {1 / beta / 1e9:g} GB/s and {alpha * 1e6:g} us a message;",
                f"{links} at 1/{factor:g} of that throughput",
                "(the figures the coordinator holds: membership/failslow.py)",
            ],
        }
    ]
    if plan is None:
        frames.append(
            {
                "title": "no schedule is predicted faster: the default stays",
                "note": f"{big} {_ms(t_big)}",
                "nodes": nodes(),
                "arrows": draw(d_big if big in ("ring", "tree", "naive") else None),
                "text": ["every ring and tree uses a slow link as much as the default does"],
            }
        )
        summary = f"{links} {f} slower, {n} ranks: no plan; {big} {_ms(t_big)} at {_size(nbytes)}"
    else:
        got = rerouted.choice(plan, big, True, nbytes)
        assert got is not None
        s_big, t_got = got.schedule, got.predicted
        frames.append(
            {
                "title": f"the plan: {plan.schedule.describe()}",
                "note": (
                    f"{_size(nbytes)}: {big} stays, nothing predicted faster ({_ms(t_big)})"
                    if got.kept
                    else f"{_size(nbytes)}: {_ms(t_big)} -> {_ms(t_got)} "
                    f"({t_big / t_got:.1f}x faster), from the same op on every rank"
                ),
                "nodes": nodes(),
                "arrows": draw(s_big if s_big.kind != "direct" else None),
                "text": [
                    f"auto at {_size(nbytes)}: {s_big.describe()}",
                    "the coordinator proposes it from an op just ahead; every rank",
                    "accepts or the proposal is dropped (group/schedbook.py)",
                ],
            }
        )
        small_got = rerouted.choice(plan, small, True, SMALL_BYTES)
        assert small_got is not None
        s_small, t_s = small_got.schedule, small_got.predicted
        frames.append(
            {
                "title": f"a {_size(SMALL_BYTES)} all_reduce under the plan",
                "note": f"auto would run {small}: {_ms(t_small)}; "
                + (
                    f"{s_small.describe()}: {_ms(t_s)}"
                    if not small_got.kept
                    else "it stays (nothing predicted faster)"
                ),
                "nodes": nodes(),
                "arrows": draw(s_small if s_small.kind != "direct" else None),
                "text": [
                    f"{small} sends over every link, the slow one too;",
                    "the model prices each schedule on the same figures",
                    "(group/rerouted.py): the same choice on every rank",
                ],
            }
        )
        summary = (
            f"{links} {f} slower, {n} ranks: {_size(nbytes)} {big} {_ms(t_big)} -> "
            f"{s_big.describe()} {_ms(t_got)}; {_size(SMALL_BYTES)} {small} {_ms(t_small)} -> "
            f"{s_small.describe()} {_ms(t_s)}"
        )
    return {
        "kind": "graph",
        "title": f"Routed around: {links} {f} slower, {n} ranks (the cost model's predictions)",
        "legend": "blue: the links the schedule uses; red: a slow link (dashed: not used)",
        "frames": frames,
        "summary": summary,
    }
