"""The tests' time scale (tests/support/timing.py): the load per CPU from the larger of the
runnable tasks now (sampled, the reader left out) and the 1-minute average, within [1, MAX];
TEST_TIME_SCALE fixes it; measured again before a test only once REFRESH s have passed."""

from __future__ import annotations

import pytest

from support import timing


def test_runnable_now_averages_the_reads_less_the_reader():
    reads = iter([3, 5, 1, 7])  # the reader is one of each count
    slept = []
    got = timing.runnable_now(lambda: next(reads), samples=4, gap=0.5, sleep=slept.append)
    assert got == (2 + 4 + 0 + 6) / 4
    assert slept == [0.5, 0.5, 0.5]  # between reads, not before the first


def test_runnable_now_is_none_where_it_cannot_be_read():
    assert timing.runnable_now(lambda: None, samples=3, sleep=lambda s: None) is None


def test_read_running_takes_the_fourth_fields_numerator(tmp_path):
    f = tmp_path / "loadavg"
    f.write_text("0.52 0.31 0.20 7/412 12345\n")
    assert timing.read_running(str(f)) == 7
    f.write_text("garbage\n")
    assert timing.read_running(str(f)) is None
    assert timing.read_running(str(tmp_path / "absent")) is None


def test_read_running_counts_at_least_the_reader():
    """On Linux the reader is running while it reads; elsewhere there is no file."""
    n = timing.read_running()
    assert n is None or n >= 1


@pytest.mark.parametrize(
    "loads, ncpus, scale",
    [
        ([0.1, 0.3], 2, 1.0),  # idle: never below 1
        ([None, None], 2, 1.0),  # nothing measured
        ([6.0, 1.0], 2, 3.0),  # load begun a moment ago, not in the average yet
        ([1.0, 6.0], 2, 3.0),  # a lull while sampling; the average remembers
        ([5.0, None], 2, 2.5),
        ([100.0, 40.0], 2, timing.MAX_SCALE),
        ([3.0, 0.0], 4, 1.0),
        ([10.0 / 3, 0.0], 1, 3.33),
    ],
)
def test_the_larger_load_per_cpu_within_bounds(loads, ncpus, scale):
    assert timing.scale_for(loads, ncpus) == scale


def test_the_override_wins_and_is_at_least_1(monkeypatch):
    monkeypatch.setattr(timing, "runnable_now", lambda: 50.0)
    monkeypatch.setenv(timing.ENV, "2.5")
    assert timing.measure() == 2.5
    monkeypatch.setenv(timing.ENV, "0.5")
    assert timing.measure() == 1.0
    monkeypatch.delenv(timing.ENV)
    monkeypatch.setattr(timing, "load_average", lambda: 0.0)
    monkeypatch.setattr(timing, "cpus", lambda: 2)
    assert timing.measure() == timing.MAX_SCALE


def test_the_override_is_capped_like_a_measurement(monkeypatch):
    """TEST_TIME_SCALE=10 would stretch the crash witnesses' 3 s bound to 30 s, the heartbeat
    timeout it guards: capped at MAX_SCALE, as a measured scale is."""
    monkeypatch.setenv(timing.ENV, "10")
    assert timing.measure() == timing.MAX_SCALE


def test_a_bound_must_stay_below_the_deadline_it_guards(monkeypatch):
    monkeypatch.setattr(timing, "SCALE", 2.0)
    assert timing.bound(3.0, below=30.0) == 6.0  # 12 s at the cap: below 30
    with pytest.raises(AssertionError, match="could not fail"):
        timing.bound(3.0, below=12.0)  # 12 s at the cap: it reaches the deadline
    assert timing.bound(3.0, below=4.0, below_scaled=True) == 6.0  # both scaled alike
    with pytest.raises(AssertionError, match="could not fail"):
        timing.bound(3.0, below=3.0, below_scaled=True)


def test_refresh_measures_again_only_after_refresh_seconds(monkeypatch):
    measured = iter([2.0, 3.0])
    monkeypatch.setattr(timing, "measure", lambda: next(measured))
    monkeypatch.setattr(timing, "SCALE", 1.0)
    monkeypatch.setattr(timing, "_measured_at", 100.0)
    assert timing.refresh(now=100.0 + timing.REFRESH / 2) == 1.0  # too soon: kept
    assert timing.refresh(now=100.0 + timing.REFRESH) == 2.0
    assert timing.scaled(1.5) == 3.0  # what the test then waits with
    assert timing.heartbeats(0.2, 1.0)["COLLECTIVES_HEARTBEAT_TIMEOUT"] == "2"
    assert timing.refresh(now=100.0 + timing.REFRESH * 1.5) == 2.0
    assert timing.refresh(now=100.0 + timing.REFRESH * 2) == 3.0
