"""The fail-slow harness's rates (tests/support/failslow_runs.py), from made-up steps and CPU
samples: the medians are over the quiet steps; where the machine was busy in both windows
alike the whole windows are compared; where it was busy unlike, speed() raises NotMeasured --
the harness's own exception, not pytest's skip, so that `python -m bench failslow` reports a
run not measured and the test decides to skip; but a job that did nothing about the slow link
is told from a busy machine (NotMeasured.kept_at_most): its steps are slower than any load the
machine had could make them (swept over loads and windows: never a pass, and never a
failure for a job that kept its rate); a half-written line of step times is not read.
"""

from __future__ import annotations

import os

import pytest

from support.failslow_runs import (
    QUIET,
    Foreign,
    NotMeasured,
    Run,
    _step_times,
    most_stretch,
    speed,
)

SLOWED = 100.0  # the slowdown, on the made-up clock


def _run(healthy: float, adapted: float, busy: dict[tuple[float, float], float]) -> Run:
    """Steps of `healthy` s from 60 to the slowdown at 100, then 3 s steps, then steps of
    `adapted` s from 110 to 150; the rest of the machine sampled every 0.1 s, using `busy`
    CPUs over each (t0, t1) of it and none elsewhere."""
    ends, took = [], []
    t = 60.0
    while t + healthy <= SLOWED:
        t += healthy
        ends.append(t)
        took.append(healthy)
    while t < SLOWED + 10:
        t += 3.0
        ends.append(t)
        took.append(3.0)
    while t + adapted <= 150:
        t += adapted
        ends.append(t)
        took.append(adapted)
    foreign = Foreign([])
    used = 0.0
    for i in range(500, 1510):
        now = i / 10
        used += 0.1 * sum(cpus for (a, b), cpus in busy.items() if a <= now - 0.05 < b)
        foreign.samples.append((now, used))
    return Run({0: {"ends": ends, "took": took}}, "", SLOWED, 150.0, None, 60.0, foreign)


def test_quiet_windows_give_the_ratio_of_their_medians():
    s = speed(_run(0.2, 0.25, {}), 10.0)
    assert s.healthy == pytest.approx(0.2) and s.adapted == pytest.approx(0.25)
    assert s.kept == pytest.approx(0.8)
    assert s.slowed == 3.0


def test_busy_steps_are_left_out_of_the_medians():
    # a burst of the rest of the machine during 30 s of the healthy window: its steps are
    # slower (0.4 s would be read) but not quiet, so they do not count
    r = _run(0.2, 0.2, {(62.0, 92.0): 1.5})
    for i, e in enumerate(r.results[0]["ends"]):
        if 62.0 <= e <= 92.0:
            r.results[0]["took"][i] = 0.4
    s = speed(r, 10.0)
    assert s.healthy == pytest.approx(0.2), s
    assert s.steps[0] < len([e for e in r.results[0]["ends"] if 60 <= e <= SLOWED]), s


def test_windows_busy_alike_are_compared_whole():
    s = speed(_run(0.2, 0.25, {(55.0, 151.0): 1.0}), 10.0)
    assert s.kept == pytest.approx(0.8)


def test_windows_busy_unlike_are_not_measured_and_say_why():
    busy = {(55.0, SLOWED): 1.0}  # the healthy window busy, the adapted one quiet
    try:
        with pytest.raises(NotMeasured, match="too busy to time the steps") as got:
            speed(_run(0.2, 0.25, busy), 10.0)
    except pytest.skip.Exception as exc:  # the bench must not meet pytest's skip
        pytest.fail(f"the harness skipped instead of raising NotMeasured: {exc}")
    # the whole windows' medians and loads, for the record
    assert got.value.whole == pytest.approx((0.2, 0.25))
    assert got.value.loads == pytest.approx([1.0, 0.0], abs=0.05)
    assert QUIET < 1.0  # the burst above is not quiet


def test_a_half_written_line_of_step_times_is_not_read(tmp_path):
    f = tmp_path / "times"
    assert _step_times(f) == []
    f.write_text("10.5 0.25\n11.0 0.5\n11.2")
    assert _step_times(f) == [(10.5, 0.25), (11.0, 0.5)]


def test_a_step_begun_after_the_last_sample_is_not_quiet():
    # sampled up to 150.0 while the rest of the machine was busy; a step from 150.2 to 150.4
    # has no sample over any of it: not known to be quiet (clamped to the last sample, it
    # would span no time and read 0 CPUs)
    f = Foreign([])
    f.samples = [(149.8, 0.0), (149.9, 0.2), (150.0, 0.4)]
    assert f.rate(149.8, 150.0) == pytest.approx(2.0)
    assert f.rate(150.2, 150.4) == float("inf")
    assert f.rate(150.0, 150.4) == float("inf")
    assert f.quiet([(150.4, 0.2)]) == []


def test_two_unsampled_windows_are_not_measured():
    # no sample at all: each window's load is not known (inf); inf - inf is nan, which must
    # not pass for "busy alike"
    r = _run(0.2, 0.25, {})
    r.foreign.samples.clear()
    with pytest.raises(NotMeasured, match="too busy to time the steps") as got:
        speed(r, 10.0)
    assert got.value.loads == [float("inf"), float("inf")]


KEPT = 0.7  # tests/scenarios/test_failslow.py's bound


def _four_workers(r: Run) -> Run:
    return r._replace(results={k: r.results[0] for k in range(4)})


def test_a_job_that_does_nothing_is_told_from_a_busy_machine():
    # four workers still on the slow link: 0.2 s steps become 4 s (5 % kept), while two
    # burners' worth of other work runs in the adapted window only. The windows are busy
    # unlike, so not measured -- but no reading of that load makes up the difference.
    r = _four_workers(_run(0.2, 4.0, {(SLOWED, 151.0): 2.0}))
    with pytest.raises(NotMeasured) as got:
        speed(r, 10.0)
    assert got.value.kept_at_most < KEPT, got.value.kept_at_most
    # the bound credits every one of the job's five processes and the two foreign CPUs
    # sharing this machine's cores
    cores = len(os.sched_getaffinity(0))
    assert got.value.kept_at_most == pytest.approx(0.05 * most_stretch(2.0, 5, cores), rel=0.05)


def test_a_healthy_job_on_a_busy_machine_is_not_failed():
    # kept 90 %, but the same load made its adapted steps twice as slow: the bound cannot
    # tell, so the run stays not measured (a skip), never a failure
    r = _four_workers(_run(0.2, 0.44, {(SLOWED, 151.0): 2.0}))
    with pytest.raises(NotMeasured) as got:
        speed(r, 10.0)
    assert got.value.kept_at_most >= KEPT, got.value.kept_at_most


def test_an_unsampled_adapted_window_bounds_nothing():
    r = _four_workers(_run(0.2, 4.0, {(SLOWED, 151.0): 2.0}))
    r.foreign.samples[:] = [x for x in r.foreign.samples if x[0] < SLOWED + 5]
    with pytest.raises(NotMeasured) as got:
        speed(r, 10.0)
    assert got.value.kept_at_most == float("inf")


def test_a_last_step_past_the_samples_does_not_void_the_bound():
    # the sampler stops a little before the job's last step ends: that step's load is not
    # known, the others' are, and they bound what was kept
    r = _four_workers(_run(0.2, 4.0, {(SLOWED, 151.0): 2.0}))
    r.foreign.samples[:] = [x for x in r.foreign.samples if x[0] < 147.0]
    with pytest.raises(NotMeasured) as got:
        speed(r, 10.0)
    assert got.value.kept_at_most < KEPT


def test_most_stretch():
    assert most_stretch(0.0, 1, 2) == 1.0  # one process, two cores: no contention
    assert most_stretch(2.0, 5, 2) == 3.5


def _verdict(r: Run) -> str:
    """What tests/scenarios/test_failslow.py's _speed makes of a run: "pass", "fail" or
    "skip" (not measured, and nothing bounds what was kept below KEPT)."""
    try:
        s = speed(r, 10.0)
    except NotMeasured as exc:
        return "fail" if exc.kept_at_most < KEPT else "skip"
    return "pass" if s.kept >= KEPT else "fail"


def _loaded(healthy: float, adapted: float, load: float, where: str) -> Run:
    span = {"healthy": (55.0, SLOWED), "adapted": (SLOWED, 151.0), "both": (55.0, 151.0)}
    return _four_workers(_run(healthy, adapted, {span[where]: load} if load else {}))


@pytest.mark.parametrize("where", ["healthy", "adapted", "both"])
@pytest.mark.parametrize("load", [0.0, 0.3, 1.0, 2.0, 4.0, 8.0, 32.0])
@pytest.mark.parametrize("kept", [0.02, 0.05, 0.09])
def test_a_job_that_does_nothing_never_passes(kept, load, where):
    # a library that does nothing about the slow link keeps 2-9 %: whatever the machine's
    # load and whichever window it falls in, it never passes; up to two burners' worth of
    # load, with the adapted window long enough to bound (steps of 2.2-4 s), it fails
    got = _verdict(_loaded(0.2, 0.2 / kept, load, where))
    assert got != "pass", got
    if kept >= 0.05 and load <= 2.0:
        assert got == "fail", got


@pytest.mark.parametrize("where", ["healthy", "adapted", "both"])
@pytest.mark.parametrize("load", [0.0, 0.3, 1.0, 2.0, 4.0])
def test_a_job_that_kept_its_rate_never_fails_on_load(load, where):
    # kept 90 %, the steps of each busy window stretched by the load they ran beside (a third
    # per CPU, the module's docstring's figure for a parallel test's burst): passes or is not
    # measured, never fails
    stretch = 1.0 + load / 3
    healthy = 0.2 * (stretch if where != "adapted" else 1.0)
    adapted = 0.2 / 0.9 * (stretch if where != "healthy" else 1.0)
    got = _verdict(_loaded(healthy, adapted, load, where))
    assert got != "fail", got
