"""The tutorial's "Measured beside predicted" section states what its kept run says.

Invariants: the table's predicted / measured pairs are the `bench costmodel --links` section
of bench/results/all_reduce/4ranks_shm_halving_doubling.txt; the one link it fits is the
ring's fit divided as the prose says (2(n-1) alphas, 2(n-1)/n betas); halving-doubling is the
model's winner at every size and measured fastest at none, the measured order tree then ring;
and the message totals the prose gives (tree, halving-doubling, ring at 4 ranks) are counted
from each algorithm's own trace.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest

import collectives as cl
from support.procs import ROOT

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
RESULTS = (
    ROOT / "bench" / "results" / "all_reduce" / "4ranks_shm_halving_doubling.txt"
).read_text()
ALGS = ("ring", "tree", "halving_doubling")
N = 4


def section() -> str:
    start = TUTORIAL.index("## Measured beside predicted")
    return " ".join(TUTORIAL[start : TUTORIAL.index("\n## ", start + 1)].split())


def linked() -> dict[int, dict[str, tuple[float, float]]]:
    """size -> algorithm -> (predicted, measured) us, from the results' one-link section."""
    part = RESULTS[RESULTS.index("--links") :]
    rows = {}
    for m in re.finditer(r"^\s+(\d+) \|(.*)\|\s*$", part, flags=re.M):
        pairs = [tuple(map(float, c.split())) for c in m.group(2).split("|")]
        rows[int(m.group(1))] = dict(zip(ALGS, pairs))
    return rows


def us(x: float) -> str:
    """Whole microseconds as the page writes them: a half rounds up (2,014.5 -> 2,015)."""
    return f"{int(Decimal(str(x)).quantize(Decimal(1), rounding=ROUND_HALF_UP)):,}"


def test_the_table_is_the_kept_runs_one_link_prediction():
    rows = linked()
    assert len(rows) == 6
    for size, label in (
        (4 << 10, "4 KiB"),
        (64 << 10, "64 KiB"),
        (1 << 20, "1 MiB"),
        (4 << 20, "4 MiB"),
    ):
        cells = " | ".join(f"{us(p)} / {us(m)}" for p, m in (rows[size][a] for a in ALGS))
        assert f"| {label} | {cells} |" in TUTORIAL


def test_the_link_is_the_rings_fit_divided_as_the_prose_says():
    ring = re.search(r"^\s+ring\s+([\d.]+)\s+([\d.]+)$", RESULTS, flags=re.M)
    link = re.search(
        r"one link, fitted on the ring: alpha ([\d.]+) us, 1/beta ([\d.]+) GB/s", RESULTS
    )
    assert ring and link
    assert float(ring[1]) == pytest.approx(2 * (N - 1) * float(link[1]), abs=0.5)
    assert float(ring[2]) * 2 * (N - 1) / N == pytest.approx(float(link[2]), abs=0.002)
    assert "`2(n-1)` link alphas, its per-byte cost `2(n-1)/n` link betas" in section()


def test_halving_doubling_wins_the_model_and_no_measurement_tree_then_ring():
    rows = linked()
    predicted = {s: min(ALGS, key=lambda a: r[a][0]) for s, r in rows.items()}
    measured = [min(ALGS, key=lambda a: r[a][1]) for _, r in sorted(rows.items())]
    assert set(predicted.values()) == {"halving_doubling"}
    assert "halving_doubling" not in measured
    first_ring = measured.index("ring")
    assert set(measured[:first_ring]) == {"tree"} and set(measured[first_ring:]) == {"ring"}
    assert (
        "the measurements say tree then ring, and halving-doubling, the model's winner, never wins"
        in section()
    )


def test_the_message_totals_are_the_traces():
    def total(algorithm):
        tracer = cl.Tracer()
        cl.simulate(
            N,
            lambda pg: pg.all_reduce(np.ones(1024, np.float32), algorithm=algorithm),
            wrappers=[tracer.wrap],
        )
        return sum(1 for e in tracer.events if e["kind"] == "send")

    t, h, r = (total(a) for a in ALGS[1:] + ALGS[:1])
    assert f"the tree sends {t} messages in all, halving-doubling {h}, the ring {r}" in section()
