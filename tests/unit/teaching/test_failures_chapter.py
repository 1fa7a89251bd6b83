"""The tutorial's failures chapter states what the library computes now.

Invariants:
  * the glossary says how many words belong to the failures chapter, and lists that many;
  * each quoted `explain stall` block is lines of the stall text the same run prints now
    (threads, a stalled ring; the culprit and the links the command names);
  * the values the chapter's Python comments print for the stepper (`st.links`, `st.stalled`,
    `early.held`, ...) are the stepper's own, read back from the page and compared;
  * the rerouting prose's two times are the cost model's: the 32 KiB tree that skips the slow
    pair, and direct on healthy links, the default that bounds what the plan shows.
  * the slow pair's step times are the kept runs' (bench/results/failslow), the quoted
    coordinator log's plan and times are plan_around's and the cost model's on the log's own
    figures, and the quoted `explain slowlink` block is what it prints;
  * the stepped lines quoted under reconstruction and the joiner are the stepper's;
  * the heartbeat timeout the STOP run's error names is this job's, the default the library's.
"""

from __future__ import annotations

import ast
import re

import pytest

from collectives.algorithms import costmodel
from collectives.teaching import failures, stall
from support.procs import ROOT

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]

TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
NUMBERS = {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}


def quoted_block(first_line: str) -> list[str]:
    """The lines of the tutorial's fenced block that starts with `first_line`."""
    m = re.search(r"```\n(" + re.escape(first_line) + r".*?)```", TUTORIAL, flags=re.DOTALL)
    assert m, f"the tutorial quotes no block starting {first_line!r}"
    return [ln for ln in m.group(1).splitlines() if ln.strip() and ln.strip() != "..."]


def printed(expression: str):
    """The value the page's comment after `expression  # ` says it prints."""
    m = re.search(re.escape(expression) + r"  # (.+)", TUTORIAL)
    assert m, f"the tutorial prints no {expression!r}"
    return ast.literal_eval(m.group(1).split("  ")[0])


def test_the_glossary_lists_as_many_failure_words_as_it_says():
    m = re.search(r"\n(\w+) more belong to the failures chapter at the end:\n\n", TUTORIAL)
    assert m, "the glossary no longer announces the failures chapter's words"
    words = []
    for line in TUTORIAL[m.end() :].splitlines():
        if line.startswith("* **"):
            words.append(line.split("**")[1])
        elif line and not line.startswith("  "):
            break
    assert NUMBERS[m.group(1).lower()] == len(words), words


@pytest.mark.parametrize(
    "first,culprit,links",
    [
        ("Stalled ring all_reduce on 3 ranks: links 0->1, 1->2", 1, None),
        ("Stalled ring all_reduce on 3 ranks: links 1->0, 2->0", 1, [(2, 0), (1, 0)]),
    ],
)
def test_the_quoted_stalls_are_what_the_stall_prints(first, culprit, links):
    told = stall.text(stall.run_stall(3, culprit, links=links)).splitlines()
    quoted = quoted_block(first)
    assert len(quoted) >= 8
    for line in quoted:
        assert line in told, f"the tutorial says {line!r}; explain stall does not"


def test_the_stepper_values_the_chapter_prints():
    st = failures.stepped_stall(3, culprit=1)
    assert printed("st.links") == st.links
    assert printed("st.stalled, st.blamed, st.why") == (st.stalled, st.blamed, st.why)
    waits = {r: (p["kind"], p["peer"]) for r, p in st.pending.items()}
    assert waits == {0: ("reduce", 2), 1: ("reduce", 0), 2: ("reduce", 1)}
    assert "each rank waits to add in a message: 0 from 2, 1 from 0, 2 from 1" in TUTORIAL
    early = failures.stepped_crash(3, victim=1, after=2)
    late = failures.stepped_crash(3, victim=1, after=7)
    assert printed("early.held, early.outcome") == (early.held, early.outcome)
    assert printed("late.held, late.outcome") == (late.held, late.outcome)


def test_the_rerouting_prose_times_are_the_models():
    n, rate, alpha, nbytes = 4, 1e9, 50e-6, 32 << 10
    slow = {(0, 1): rate / 50, (1, 0): rate / 50}
    costs = costmodel.LinkCosts.of(n, slow, rate=rate, alpha=alpha)
    tree = costmodel.predict(costmodel.Schedule("tree", (0, 2, 3, 1)), nbytes, costs)
    direct = costmodel.Schedule("direct", costmodel.identity(n))
    healthy = costmodel.predict(direct, nbytes, costs.healthy())
    assert tree < healthy  # the reason the prose gives: the default's time bounds the plan's
    said = f"the {healthy * 1e3:.2f} ms above is direct's healthy time, not the tree's own"
    assert " ".join(said.split()) in " ".join(TUTORIAL.split())
    assert f"the tree's own {tree * 1e3:.2f} ms" in " ".join(TUTORIAL.split())


def test_a_four_byte_direct_barely_feels_the_slow_pair():
    """The prose: a 4-byte all_reduce stays direct, its slow link costing 0.2 us of 250."""
    n, rate, alpha = 4, 1e9, 50e-6
    costs = costmodel.LinkCosts.of(
        n, {(0, 1): rate / 50, (1, 0): rate / 50}, rate=rate, alpha=alpha
    )
    direct = costmodel.Schedule("direct", costmodel.identity(n))
    slow, healthy = (costmodel.predict(direct, 4, c) * 1e6 for c in (costs, costs.healthy()))
    assert slow < 1.1 * healthy  # nothing is 10 % faster than what auto picked
    said = f"next to nothing: {slow - healthy:.1f} us of its {slow:.0f})"
    assert said in " ".join(TUTORIAL.split())


def test_the_slowed_pairs_step_times_are_the_recorded_runs():
    """The prose's 'N s a step instead of M s' are link4's slowest step and healthy median in
    the kept results, and the slow one is no faster than the slowed pair's wire allows."""
    results = (ROOT / "bench" / "results" / "failslow" / "failslow.txt").read_text()
    m = re.search(r"^link4\s+collectives\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", results, flags=re.M)
    assert m, "failslow.txt has no link4 row of this library"
    n, nbytes, healthy, slowest = (int(v) for v in m.groups())
    said = f"{slowest / 1e3:.1f} s a step instead of {healthy / 1e3:.2f} s"
    assert said in " ".join(TUTORIAL.split())
    on_the_pair = 2 * (n - 1) / n * nbytes * 8 / 40e6  # the ring's bytes over 40 Mbit/s
    assert on_the_pair <= slowest / 1e3


def test_the_coordinators_log_quotes_the_plan_and_the_models_times():
    """The quoted log: the plan is plan_around's, its two predicted times the cost model's on
    the figures the flag line gives (the slowed link's rate, its peers' for the rest)."""
    from collectives.algorithms.schedule import plan_around

    m = re.search(
        r"link (\d)->(\d) flagged as slow: \S+ at (\d+) Mbit/s against its peers' (\d+) "
        r"Mbit/s \(([\d.]+)x slower\)",
        TUTORIAL,
    )
    assert m, "the tutorial quotes no flag line"
    a, b, slow, peers, ratio = int(m[1]), int(m[2]), int(m[3]), int(m[4]), float(m[5])
    assert (peers - 0.5) / (slow + 0.5) <= ratio <= (peers + 0.5) / (slow - 0.5)
    costs = costmodel.LinkCosts.of(4, {(a, b): slow * 1e6 / 8}, rate=peers * 1e6 / 8)
    plan = plan_around(4, [(a, b)], costs)
    assert plan is not None
    assert f"rerouted from op #22: {plan.describe()}" in TUTORIAL


def test_the_quoted_slowlink_block_is_what_explain_prints():
    import contextlib
    import io

    from collectives.teaching import explain

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert explain.main(["slowlink", "-n", "4", "--slow", "0-1", "--no-plot"]) == 0
    told = out.getvalue().splitlines()
    quoted = quoted_block("Routed around: 0->1, 1->0 50x slower, 4 ranks")
    assert len(quoted) >= 4
    for line in quoted:
        assert line in told, f"the tutorial says {line!r}; explain slowlink does not"


@pytest.mark.parametrize(
    "first,after,stepped",
    [
        (
            "Reconstruction after rank 1 died",
            "the redo on 2 ranks:",
            lambda: failures.stepped_redo(2),
        ),
        (
            "A joiner admitted and given the model",
            "the broadcast on 3 ranks:",
            lambda: failures.stepped_handover(3),
        ),
    ],
)
def test_the_quoted_stepped_lines_are_the_steppers(first, after, stepped):
    quoted = [ln.strip() for ln in quoted_block(first)]
    start = quoted.index("stepped in-process, " + after) + 1
    lines = stepped()
    assert quoted[start : start + len(lines)] == lines


def test_the_heartbeat_timeouts_the_chapter_names():
    """'sent no heartbeat for 2 s' is what the recorded STOP run's survivors raised; the
    default the prose sets beside it is the library's."""
    from collectives.common.variables import DEFAULT_HEARTBEAT_TIMEOUT

    recorded = (ROOT / "docs" / "img" / "crash_stop.json").read_text()
    m = re.search(r"sent no heartbeat for (\d+(?:\.\d+)?) s", recorded)
    assert m, "the recorded STOP run has no heartbeat error"
    said = f"(`sent no heartbeat for {m[1]} s`, this job's timeout; the default is "
    said += f"{DEFAULT_HEARTBEAT_TIMEOUT:g} s;"
    assert said in " ".join(TUTORIAL.split())


def test_the_quoted_stalls_blame_the_fewest_ranks_on_every_bad_link():
    """The prose's rule, from the runs: rank 1 alone covers both stalled links; with 1->0 and
    2->0 held the op shows one link (two ends tie: 'rank 0 or rank 2?') and the links the
    probes add leave rank 0 alone."""
    from collectives.membership.evidence import min_covers

    first = stall.run_stall(3, 1)
    assert min_covers(first.links) == [tuple(first.blamed)] == [(1,)]
    assert "The culprits are the fewest ranks that touch every bad link" in " ".join(
        TUTORIAL.split()
    )
    probed = stall.run_stall(3, 1, links=[(2, 0), (1, 0)])
    assert probed.links == [(2, 0)] and min_covers(probed.links) == [(0,), (2,)]
    assert "one stalled link, 2->0: rank 0 or rank 2?" in " ".join(TUTORIAL.split())
    assert min_covers(probed.slowed) == [tuple(probed.blamed)] == [(0,)]


def test_the_toy_models_sums_follow_the_storys_shape():
    """Each committed step adds the ranks that took part: run_story's defaults (n ranks,
    stop_at steps before the kill, the killed step redone by n - 1, the joiner back to n up
    to `steps`) give the prose's 8 after the redo and 14 at the end."""
    import inspect

    d = {k: p.default for k, p in inspect.signature(failures.run_story).parameters.items()}
    n, before, steps = d["n"], d["stop_at"], d["steps"]
    redo = before * n + (n - 1)
    end = redo + (steps - before - 1) * n
    text = " ".join(TUTORIAL.split())
    assert f"{n} + {n} (two steps of three ranks) + {n - 1} = {redo} on both" in text
    assert f"{redo} + {n} + {n} = {end} on every rank" in text
    assert f"step {steps}, model {end}" in text and before == 2 and steps - before - 1 == 2
