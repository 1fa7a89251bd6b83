"""The simulator of the failure side (collectives/simulation/): one seed gives one run, event
for event; each property it checks fails on a run broken the way the property names; the
seeds its sweeps found stay fixed; a short sweep holds."""

from __future__ import annotations

from collections import Counter

import pytest

from collectives.algorithms import commit
from collectives.membership import diagnose, verdicts
from collectives.membership import rank as rk
from collectives.membership.diagnose import UNPLACED_AFTER
from collectives.simulation import programs, properties
from collectives.simulation.__main__ import main
from collectives.simulation.faults import Fault
from collectives.simulation.sweep import run_seed, sweep
from collectives.simulation.world import Config, World

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]


def props(w: World) -> set[str]:
    return {v.prop for v in properties.check(w)}


def test_same_seed_same_run_event_for_event():
    for seed in (3, 17, 680):
        a, b = World(seed, trace=True).run(), World(seed, trace=True).run()
        assert len(a.trace) > 20 and a.digest() == b.digest()
    assert World(3, trace=True).run().digest() != World(4, trace=True).run().digest()


def test_a_run_past_its_event_cap_is_a_hang():
    w = World(5, Config(max_events=100)).run()
    assert w.hang is not None and "hang" in props(w)
    w = World(5, Config(horizon=0.05)).run()
    assert w.hang is not None and "hang" in props(w)


def crash(rank: int = 2) -> list[Fault]:
    return [Fault("crash", rank, 1, 0.005)]


def test_a_crash_is_found_and_costs_one_generation():
    w = World(1, Config(n=4, ops=4), faults=crash()).run()
    assert props(w) == set()
    assert [r.lid for r in w.removals] == [2]


def test_innocent_fails_when_the_judge_blames_the_wrong_rank(monkeypatch):
    links = [Fault("links", 2, 1, 0.005)]
    assert "innocent" not in props(World(1, Config(n=4, ops=4), faults=links).run())
    real = diagnose.judge

    def blame_rank_0(*args, **kwargs):  # a judge that names rank 0 whatever it sees
        judged = real(*args, **kwargs)
        return diagnose.Judgement([0], "rank 0, always", evidence=judged.evidence)

    monkeypatch.setattr(diagnose, "judge", blame_rank_0)
    assert "innocent" in props(World(1, Config(n=4, ops=4), faults=links).run())


def test_agreement_fails_when_a_survivor_commits_another_value(monkeypatch):
    real = World._commit

    def off_by_one(self, p, op):
        real(self, p, op)
        if p.lid == 0:
            gen, value = p.committed[op.step]
            p.committed[op.step] = (gen, value + 1)

    monkeypatch.setattr(World, "_commit", off_by_one)
    assert "agreement" in props(World(1, Config(n=4, ops=4), faults=crash()).run())


def test_op_bound_fails_when_a_deadline_never_fires(monkeypatch):
    links = [Fault("links", 2, 1, 0.005)]  # only the op's deadline ends its stall
    assert props(World(1, Config(n=4, ops=4), faults=links).run()) == set()
    monkeypatch.setattr(World, "_deadline", lambda self, p, op: None)
    assert "op bound" in props(World(1, Config(n=4, ops=4, horizon=30.0), faults=links).run())


def test_detection_fails_when_the_crash_witness_is_silent(monkeypatch):
    monkeypatch.setattr(World, "_witness", lambda self, p: None)
    w = World(1, Config(n=4, ops=4), faults=crash()).run()
    assert "detection" in props(w)  # the heartbeat finds it, a second later
    assert [r.lid for r in w.removals] == [2]


def test_cost_fails_when_a_new_generation_drops_a_healthy_rank_too(monkeypatch):
    """One crash; once its generation forms, every survivor asks for another without the
    last rank (as a shrink_group would): two new generations for one fault."""
    real = World._next_op
    asked: set[int] = set()

    def shrink_once(self, p):
        if p.gen == 1 and p.lid not in asked:
            asked.add(p.lid)
            p.waiting_for = "reconstruct"
            last = len(p.roster) - 1
            self.feed(p, rk.AskReconstruct(p.gen, self.report(p), 3.0, exclude=(last,)))
            return
        real(self, p)

    assert "cost" not in props(World(1, Config(n=5, ops=4), faults=crash(1)).run())
    monkeypatch.setattr(World, "_next_op", shrink_once)
    w = World(1, Config(n=5, ops=4), faults=crash(1)).run()
    assert "cost" in props(w)


# --- the seeds the sweeps found: each a bug fixed -------------------------------------------------
# a diagnosis past its deadline while the coordinator was away was ticked again and again at
# one virtual instant, and the run never ended (RankMachine.due)
HANGS = (680, 1052, 1294, 1365, 1626)
# a restarted coordinator's diagnosis never pinged a member not re-registered yet, and judged
# it dead while it beat (verdicts.ping_late)
UNPINGED = (1469, 2614)


def due_at_any_deadline(self: rk.RankMachine) -> float:
    """RankMachine.due as it was: a request's deadline counted while the coordinator was away."""
    s = self.state
    due = [s.next_beat]
    if s.pending is not None:
        due.append(s.pending.deadline)
    if s.rejoin_due is not None:
        due.append(s.rejoin_due)
    if s.link.away_since is not None and s.link.lost is None:
        due.append(s.link.away_since + s.link.grace + 1e-6)
    return min(due)


@pytest.mark.parametrize("seed", HANGS)
def test_regression_a_deadline_past_while_the_coordinator_is_away(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    if seed == HANGS[0]:  # the old due() hangs it (each such run costs its 200,000 events)
        monkeypatch.setattr(rk.RankMachine, "due", due_at_any_deadline)
        assert "hang" in props(World(seed).run())


@pytest.mark.parametrize("seed", UNPINGED)
def test_regression_a_member_that_rejoins_during_a_diagnosis_is_pinged(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(verdicts, "ping_late", lambda *args: None)
    assert "innocent" in props(World(seed).run())


# late, CPU-starved ranks whose pictures, taken at different moments, show a wait cycle with no
# link proven stalled: the cycle rule (the highest of the ranks most waited on) evicted a healthy
# rank (diagnose.judge now evicts nobody there)
LATE = (435, 1960, 2571, 2708)


def judge_by_the_cycle_rule(*args, **kw):
    """diagnose.judge as it was: a wait cycle evicted the highest of the ranks most waited on,
    whenever the pictures were taken."""
    j = real_judge(*args, **kw)
    if j.culprits or "wait in a cycle" not in j.why:
        return j
    seq, states = args[0], args[1]
    waited = Counter(
        s.waiting_on
        for s in states.values()
        if s is not None and s.seq == seq and s.in_op and s.waiting_on is not None
    )
    top = max(waited.values())
    return diagnose.Judgement(
        [max(r for r, c in waited.items() if c == top)],
        "is not sending (a wait cycle; rule)",
        needs_probes=j.needs_probes,
        evidence=j.evidence,
    )


real_judge = diagnose.judge


@pytest.mark.parametrize("seed", LATE)
def test_regression_a_late_rank_is_not_a_culprit(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(diagnose, "judge", judge_by_the_cycle_rule)
    assert "innocent" in props(World(seed).run())


# a late rank's frames reached receivers already waiting for the verdict, which take no frame
# then; a later ping's pictures (another op's diagnosis) placed them after it, and the late
# rank's links counted as stalled in time (verdicts.take_state places them at the ask)
ASKED = (3448,)


def take_state_placed_at_any_ping(s, rank, report, token, now):
    """verdicts.take_state as it was: a picture placed at the ping it answers, even when its
    rank asked earlier and took no frame since."""
    after = UNPLACED_AFTER
    for d in s.judgements.diagnoses.values():
        if token is not None and d.token == token and rank in d.pinged:
            after = d.pinged[rank]
    picture = report.picture(len(s.members or ()))
    for (gen, _), d in s.judgements.diagnoses.items():
        if gen == report.generation:
            verdicts._keep(d, rank, picture, diagnose.Placed(after, now))


@pytest.mark.parametrize("seed", ASKED)
def test_regression_a_rank_waiting_for_the_verdict_is_placed_at_its_ask(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(verdicts, "take_state", take_state_placed_at_any_ping)
    assert "innocent" in props(World(seed).run())


# a starved member that re-registered with a restarted coordinator during a diagnosis was
# pinged late and answered after the diagnosis' window: judged silent -- dead -- while it beat
# (verdicts._gathers_until: a late ping gets a whole window)
PINGED_LATE = (3255,)


@pytest.mark.parametrize("seed", PINGED_LATE)
def test_regression_a_late_ping_gets_a_whole_window(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(verdicts, "_gathers_until", lambda s, d: d.until)
    assert "innocent" in props(World(seed).run())


# a slow NIC beside a starved rank that had not asked yet: the probes of the two others tied
# on the link between them, and the rule evicted the healthy end (diagnose._from_links: a tie
# with a rank left out of the probes evicts nobody)
UNPROBED = (1587,)


def rule_whoever_was_probed(*args, **kw):
    """diagnose._from_links as it was: the rule decides a tie even with ranks left unprobed."""
    return real_from_links(*args[:-1], 0)


real_from_links = diagnose._from_links


@pytest.mark.parametrize("seed", UNPROBED)
def test_regression_a_tie_with_a_rank_left_unprobed_evicts_nobody(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(diagnose, "_from_links", rule_whoever_was_probed)
    assert "innocent" in props(World(seed).run())


# an op that raised as it began (an abort that came early) stayed "in the op": the next abort
# frame for it failed it a second time: the rank dropped two steps for one, finished early,
# and was judged absent from the op its peers were in (World._begin)
RAISED_AT_BEGIN = (76565,)


@pytest.mark.parametrize("seed", RAISED_AT_BEGIN)
def test_regression_an_op_that_raised_at_begin_fails_once(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    real_end = World._end_span

    def end_leaving_it_in_the_op(self, p, op, how):
        real_end(self, p, op, how)
        if how.endswith("at begin"):
            op.in_op = True

    monkeypatch.setattr(World, "_end_span", end_leaving_it_in_the_op)
    assert "innocent" in props(World(seed).run())


# a rank waiting on the coordinator's verdict about one op was judged absent from the next,
# which its peers had entered meanwhile (verdicts._excused: time spent waiting on our answer,
# and an op timeout after it, is not absence)
HELD = (90846, 94501)


@pytest.mark.parametrize("seed", HELD)
def test_regression_a_rank_held_by_the_coordinator_is_not_absent(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(verdicts, "_excused", lambda *args: set())
    assert "innocent" in props(World(seed).run())


# two slowed links 2->0 and 0->1 whose 0->1 probe was left out (rank 0 began its window late,
# short of CPU) looked like one slow link 2->0, and the rule evicted its healthy end
# (diagnose._from_links: a tie where a probe told nothing evicts nobody, before history speaks:
# 106784's earlier stall had found the healthy end on a bad link)
UNJUDGED = (10362, 78745, 91588, 106784)


@pytest.mark.parametrize("seed", UNJUDGED)
def test_regression_a_tie_with_a_probe_left_out_evicts_nobody(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(diagnose, "_unjudged", lambda *args: set())
    assert "innocent" in props(World(seed).run())


# a later op's ping round, merged into the earlier op's diagnosis, placed the pictures of ranks
# that had asked about the earlier op (and took none of its frames since) at that later ping:
# a late rank's frames counted as stalled in time (verdicts._at_ask)
MERGED = (12942,)


@pytest.mark.parametrize("seed", MERGED)
def test_regression_a_merged_picture_is_placed_at_the_ask(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(verdicts, "_at_ask", lambda d, rank, placed: placed)
    assert "innocent" in props(World(seed).run())


# a rank whose deadline passed while the coordinator was away asked again once it was back;
# its ask was placed when the request arrived, not when it stopped taking the op's frames, and
# a late rank's frames sent in between counted as stalled in time (Diagnose.waited)
ASKED_AWAY = (18529,)


@pytest.mark.parametrize("seed", ASKED_AWAY)
def test_regression_an_ask_sent_again_is_placed_when_first_sent(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(verdicts, "asked_at", lambda msg, now: now)
    assert "innocent" in props(World(seed).run())


# two faults at once in a group of five or more (0->1 slowed, rank 2's links cut) stalled 0->1
# and 1->2, whose one cover is the healthy rank 1 between them (diagnose.CONFIRM_FROM: the
# probes confirm a cover of stalled links first)
TWO_AT_ONCE = (64073, 77856, 90128)


@pytest.mark.parametrize("seed", TWO_AT_ONCE)
def test_regression_two_faults_at_once_are_probed_before_an_eviction(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(diagnose, "CONFIRM_FROM", 1 << 20)
    assert "innocent" in props(World(seed).run())


# the only rank still in the op (the others were done with the job) asked alone: no probe could
# run, and the rule evicted the healthy end of the one stalled link (diagnose.alone)
ALONE = (47375, 56735)


@pytest.mark.parametrize("seed", ALONE)
def test_regression_a_tie_no_probe_could_tell_evicts_nobody(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(diagnose, "alone", lambda j, askers: j)
    assert "innocent" in props(World(seed).run())


# a group of two (it ran no commit round then) whose op one rank finished while the other
# timed out on it, judged "nobody": the two went on with different steps (commit.SKIP_AT_MOST)
DIVERGED = (80844,)


@pytest.mark.parametrize("seed", DIVERGED)
def test_regression_a_group_of_two_runs_the_commit_round(seed, monkeypatch):
    assert props(World(seed).run()) == set()
    monkeypatch.setattr(commit, "SKIP_AT_MOST", 2)
    programs.programs.cache_clear()
    try:
        assert "agreement" in props(World(seed).run())
    finally:
        programs.programs.cache_clear()


@pytest.mark.parametrize("seed", (4, 5, 8))
def test_detection_still_catches_a_fault_judged_to_blame_nobody(seed, monkeypatch):
    """The detection property lets a culprit finish as a member only where at most one op
    begun after it struck was judged to blame nobody: a judge that never blames a link is
    still caught."""
    assert props(World(seed).run()) == set()

    def never_a_link(*args, **kw):
        j = real_judge(*args, **kw)
        if j.evidence.bad:
            return diagnose.Judgement([], f"nobody (op #{args[0]})", evidence=j.evidence)
        return j

    monkeypatch.setattr(diagnose, "judge", never_a_link)
    assert "detection" in props(World(seed).run())


SHORT = (0, 1000)  # about 13 s of one core's CPU (a fail-slow run about 60 ms)


@pytest.mark.timeout(300)  # a loaded machine: the CPU it needs is small, the wall time is not
def test_a_short_sweep_holds():
    failing, took = sweep(*SHORT)
    assert [(o.seed, o.violations) for o in failing] == []


def test_run_and_sweep_commands(capsys):
    assert main(["run", "--seed", "3", "--trace"]) == 0
    out = capsys.readouterr().out
    assert "0 violation(s)" in out and "begins step" in out
    assert main(["sweep", "--seeds", "0:20"]) in (0, 1)
    assert "20 seeds in" in capsys.readouterr().out
    assert run_seed(3).violations == ()


def test_a_large_world_forms_without_data_traffic():
    """The constructor and a generation's formation at 2,000 members (no ops): the link
    figures are drawn per link when used, the roster read once per generation."""
    w = World(0, Config(n=2000, ops=0), faults=[]).run()
    assert w.hang is None and {p.status for p in w.procs} == {"done"}
    assert {p.gen for p in w.procs} == {0} and len(w.latency) == 0
