"""The coordinator's judgements on a stalled or half-finished op: whom a stall blames (the
diagnosis, the same verdict for every rank that asks) and whether an op that failed while some
ranks held its result counts on every survivor or on none (diagnose.py says how). Functions
over a State (state.py); the tables of pending and given judgements are its `judgements`.
"""

from __future__ import annotations


import msgspec

from . import diagnose, probing, tables
from .changes import declare
from ..transport.base import Progress as Picture
from .diagnose import UNPLACED_AFTER, Placed
from .protocol import (
    Diagnose,
    Error,
    Outcome,
    OutcomeAnswer,
    Ping,
    Probed,
    Progress,
    Report,
    Verdict,
)
from .state import Diagnosis, Ident, Key, Mid, OutcomeAsk, Outbox, State


def _stale(seq: int) -> Verdict:
    return Verdict(seq=seq, culprits=[], why="stale generation", evicted=False)


WAITING = float("inf")  # Judgements.answered: the request is not answered yet


def _excused(s: State, now: float, timeout: float) -> set[int]:
    """The ranks that are waiting on our answer about an earlier op, or had it less than an op
    timeout ago: they cannot have entered the next op yet, whatever their peers wait for."""
    answered = s.judgements.answered
    return {
        r
        for r, m in enumerate(s.members or ())
        if (at := answered.get(m)) is not None and (at == WAITING or now - at < timeout)
    }


# --- stall diagnosis ---------------------------------------------------------------------------
def on_diagnose(s: State, out: Outbox, ident: Ident, msg: Diagnose, now: float) -> None:
    """`diagnose {mid, generation, seq, ..., timeout, probe}`: a rank's op passed its deadline."""
    j = s.judgements
    rank = s.rank_of(msg.mid)
    gen, seq = msg.report.generation, msg.report.seq
    if rank is None or gen != s.generation or s.members is None:
        out.send(ident, _stale(seq))
        return
    key: Key = (gen, seq)
    key = j.merged.get(key, key)
    if key in j.given:
        out.send(ident, msgspec.structs.replace(j.given[key], seq=seq))
        j.answered[msg.mid] = now
        return
    d = j.diagnoses.get(key)
    if d is None and len(j.diagnoses) >= tables.MAX_PENDING:
        out.send(ident, Error(message="too many diagnoses pending"))
        return
    if d is None:
        d = j.diagnoses[key] = Diagnosis(until=now + s.diagnose_window, first=now)
        s.probe_tokens += 1
        d.token = s.probe_tokens
        # Every member, the askers too, answers with a picture taken after this moment: the
        # pictures are placed in time (diagnose.Placed), and a link counts as stalled only
        # where its bytes left well before the receiver's picture (diagnose.proven).
        for r, m in enumerate(s.members):
            beat = s.beats.get(m)
            if m in s.failed:
                d.states[r] = None
            elif beat is not None and beat.ident:  # b"": not re-registered yet (ping_late)
                out.send(beat.ident, Ping(token=d.token))
                d.pinged[r] = now
    if len(d.askers) < tables.max_askers(s):
        d.askers.append((ident, seq))
    j.answered[msg.mid] = WAITING
    d.ranks[rank] = ident  # the socket its op thread waits on
    d.asked[rank] = seq  # the op it asked about: what its messages name
    d.asked_at.setdefault(rank, asked_at(msg, now))
    d.can_probe[rank] = msg.probe
    d.timeout = max(d.timeout, msg.timeout or 0.0)
    # its picture, taken when its deadline passed (not placed: nothing of ours preceded it),
    # until the answer to the ping replaces it
    _keep(d, rank, msg.report.picture(len(s.members)), Placed(UNPLACED_AFTER, now))


def asked_at(msg: Diagnose, now: float) -> float:
    """When the rank asked, on our clock: a request sent again to a restarted coordinator
    says how long ago it first went out (the rank took no frame of the op since)."""
    return now - msg.waited


def ping_late(s: State, out: Outbox, mid: Mid, ident: Ident, now: float) -> None:
    """A member that beats on a connection the coordinator did not know when a diagnosis
    opened (a restarted coordinator rebuilding its generation: the member had not
    re-registered yet) was never pinged by it: ping it now, or it would be judged silent --
    dead -- while it beats (the simulator found it: tests/unit/simulation)."""
    rank = s.rank_of(mid)
    if rank is None or mid in s.failed:
        return
    for (gen, _), d in s.judgements.diagnoses.items():
        if gen == s.generation and rank not in d.pinged and d.states.get(rank) is None:
            out.send(ident, Ping(token=d.token))
            d.pinged[rank] = now


def _keep(d: Diagnosis, rank: int, picture: Picture, placed: Placed) -> None:
    """Keep a rank's picture unless the one kept was taken later for sure."""
    before = d.placed.get(rank)
    if before is None or placed.after >= before.after:
        d.states[rank] = picture
        d.placed[rank] = placed


def _gathers_until(s: State, d: Diagnosis) -> float:
    """When the diagnosis stops waiting for pictures: its window, or a whole window after a
    late ping (ping_late) to a rank still unheard -- a rank that beats but answers slowly,
    short of CPU, is not silent (the simulator found it: tests/unit/simulation)."""
    late = [at + s.diagnose_window for r, at in d.pinged.items() if r not in d.states]
    return max([d.until, *late])


def _waiting_for_pictures(d: Diagnosis, world_size: int) -> bool:
    """Some live rank has not yet answered the ping round with a picture placed after it."""
    return any(
        not (r in d.states and d.states[r] is None)
        and not (r in d.placed and d.placed[r].after > UNPLACED_AFTER)
        for r in range(world_size)
    )


def _merge(s: State, key: Key, d: Diagnosis, earlier: int) -> None:
    """Op key[1]'s stall waits on op `earlier`'s: its askers join that op's diagnosis (created
    if none of the ranks inside it has asked yet), so that they take part in its probes and
    get its verdict -- one event, judged once, with every rank's links."""
    j = s.judgements
    gen = key[0]
    into = j.diagnoses.get((gen, earlier))
    if into is None:
        into = j.diagnoses[(gen, earlier)] = Diagnosis(until=d.until, first=d.first)
    for r, state in d.states.items():
        if state is None:
            into.states.setdefault(r, None)
            continue
        _keep(into, r, state, _at_ask(into, r, d.placed.get(r, Placed(UNPLACED_AFTER, d.first))))
    room = tables.max_askers(s) - len(into.askers)
    into.askers += d.askers[: max(0, room)]
    into.ranks.update(d.ranks)
    into.asked.update(d.asked)
    for r, at in d.asked_at.items():
        into.asked_at[r] = min(at, into.asked_at.get(r, at))
    into.can_probe.update(d.can_probe)
    into.timeout = max(into.timeout, d.timeout)
    into.first = min(into.first, d.first)
    j.merged[key] = (gen, earlier)  # bounded with `given` (tables.py)
    del j.diagnoses[key]


def _at_ask(d: Diagnosis, rank: int, placed: Placed) -> Placed:
    """A picture placed no later than the rank's ask in diagnosis d: it asked about that op
    then and took none of its frames after, so a later picture of it (another op's ping
    round, merged in) shows no more of them than one taken at the ask."""
    asked = d.asked_at.get(rank)
    if asked is not None and asked < placed.after:
        return Placed(asked, placed.arrived)
    return placed


def take_state(s: State, rank: int, report: Report, token: int | None, now: float) -> None:
    """A member's answer to a ping (`state`): its progress, for the stalls of its generation
    under diagnosis. An answer to a diagnosis's ping (its token) was taken after that ping
    went out to this rank: placed so, or at its own diagnose request if that came first."""
    diagnoses = s.judgements.diagnoses
    after = UNPLACED_AFTER
    for d in diagnoses.values():
        if token is not None and d.token == token and rank in d.pinged:
            after = d.pinged[rank]
    picture = report.picture(len(s.members or ()))
    for (gen, _), d in diagnoses.items():
        if gen == report.generation:
            # a rank that asked stopped taking the op's frames then (it waits for the
            # verdict): a later picture shows no more of them, whatever ping it answers
            placed = Placed(min(after, d.asked_at.get(rank, after)), now)
            _keep(d, rank, picture, placed)


def on_probed(s: State, out: Outbox, ident: Ident, msg: Probed, now: float) -> None:
    """`probed {mid, generation, seq, token, heard, elapsed}`: a probe report. One about
    an earlier generation's stall is dropped: its ranks were renumbered since (the probe
    round's ranks and the report's row would not match), and that stall's verdict is stale
    whatever the probes say."""
    j = s.judgements
    rank = s.rank_of(msg.mid)
    key: Key = (msg.generation, msg.seq)
    d = j.diagnoses.get(j.merged.get(key, key))
    if rank is not None and d is not None and msg.generation == s.generation:
        probing.take_report(d, rank, msg, len(s.members or ()), now)


def finish_diagnoses(s: State, out: Outbox, now: float) -> None:
    """The periodic work: judge the stalls whose states (or probe reports) are in."""
    j = s.judgements
    n = len(s.members or ())
    for key in list(j.diagnoses):
        d = j.diagnoses[key]
        gen, seq = key
        probes = None
        if d.probe is not None:
            if not probing.done(d.probe, now):
                continue
            probes = probing.results(d.probe)
        elif now < _gathers_until(s, d) and _waiting_for_pictures(d, n):
            continue
        if gen != s.generation:
            verdict = _stale(seq)
        elif key in j.given:
            verdict = j.given[key]  # the same verdict for every asker
        else:
            judged = diagnose.judge(
                seq,
                d.states,
                n,
                probes=probes,
                history=_link_history(s),
                placed=d.placed,
                hold=diagnose.causal_hold(d.timeout),
                excused=_excused(s, now, d.timeout),
            )
            earlier = judged.judged_op
            if earlier is not None and earlier < seq and probes is None:
                _merge(s, key, d, earlier)
                continue
            if judged.needs_probes and probes is None and d.timeout > 0:
                live_ranks = [r for r in (s.rank_of(m) for m in s.live()) if r is not None]
                if not probing.ready_to_probe(d, live_ranks, now):
                    continue  # every member's deadline passes soon: wait
                s.probe_tokens += 1
                if probing.start(out, d, seq, s.probe_tokens, now):
                    out.note(
                        f"op #{seq} of generation {gen}: the stalled links tie; probing "
                        f"the links of rank(s) {d.probe.ranks if d.probe is not None else []}"
                    )
                    continue
                if len(d.ranks) < 2:
                    judged = diagnose.alone(judged, sorted(d.ranks))
            verdict = _verdict(s, out, seq, judged)
        del j.diagnoses[key]
        members = s.members or ()
        for r in d.ranks:
            if r < len(members):
                j.answered[members[r]] = now
        for ident, asked in d.askers:
            answer = msgspec.structs.replace(verdict, seq=asked)
            out.send(ident, answer)
            if asked != seq and verdict.evicted:
                j.given.setdefault((gen, asked), answer)


def _verdict(s: State, out: Outbox, seq: int, judged: diagnose.Judgement) -> Verdict:
    """The verdict on op `seq` of the current generation, given once (invariant I4); a stall's
    culprits are removed."""
    members = s.members or []
    out.note(f"op #{seq} of generation {s.generation} judged: {judged!r}", detail=True)
    culprits, why = judged.culprits, judged.why
    # One event, one error on every rank: culprits this stall removes make it a stall
    # everywhere (PeerTimeout, the notice says so); culprits already removed (dead, left)
    # were announced as a PeerFailure, and the askers raise that too.
    earlier = [r for r in culprits if members[r] in s.failed]
    stalled = bool(culprits) and not earlier
    if earlier:
        why = s.failed[members[earlier[0]]]
    verdict = Verdict(
        seq=seq,
        culprits=culprits,
        why=why,
        evicted=True,
        stall=stalled,
        evidence=judged.evidence,
    )
    s.judgements.given[(s.generation, seq)] = verdict
    if stalled:
        history = s.judgements.link_history
        for p, r in judged.bad:
            for rank in (p, r):
                history[members[rank]] = history.get(members[rank], 0) + 1
        declare(
            s,
            out,
            [members[r] for r in culprits],
            f"stalled op #{seq}: rank(s) {culprits} {why}",
            op=seq,
        )
    return verdict


def _link_history(s: State) -> dict[int, int]:
    """rank -> bad links earlier stalls found it on, for this generation's members (the table
    is keyed by member id, so it follows a process across generations)."""
    history = s.judgements.link_history
    for mid in [m for m in history if s.rank_of(m) is None]:
        del history[mid]
    return {r: k for m, k in history.items() if (r := s.rank_of(m)) is not None}


# --- the outcome of an op that failed while some held its result -------------------------------
def learn(s: State, mid: Mid, report: Report) -> None:
    """What a member's report says of the ops whose outcome is asked. Facts only ever
    accumulate (an older report, arriving late over another socket, adds nothing false)."""
    asks = s.judgements.outcome_asks
    if not asks or report.generation != s.generation:
        return
    rank = s.rank_of(mid)
    if rank is None:
        return
    for seq, ask in asks.items():
        if rank not in ask.held:
            held = diagnose.holds_result(seq, report.seq, report.has_data, report.done)
            if held is not None:
                ask.held[rank] = held


def on_progress(s: State, out: Outbox, ident: Ident, msg: Progress, now: float) -> None:
    """`progress {mid, generation, seq, state}`: a rank's op ended in failure."""
    learn(s, msg.mid, msg.report)


def on_outcome(s: State, out: Outbox, ident: Ident, msg: Outcome, now: float) -> None:
    """`outcome {mid, generation, seq, state, timeout}`: does op seq count on every survivor?"""
    j = s.judgements
    rank = s.rank_of(msg.mid)
    seq = msg.report.seq
    if rank is None or msg.report.generation != s.generation:
        out.send(ident, OutcomeAnswer(seq=seq, verdict=None, why="stale generation"))
        return
    if seq in j.outcomes:
        out.send(ident, OutcomeAnswer(seq=seq, verdict=j.outcomes[seq]))
        j.answered[msg.mid] = now
        return
    ask = j.outcome_asks.get(seq)
    if ask is None and len(j.outcome_asks) >= tables.MAX_PENDING:
        out.send(ident, Error(message="too many outcomes asked"))
        return
    if ask is None:
        ask = j.outcome_asks[seq] = OutcomeAsk(until=now + msg.timeout)
        for m in s.live():
            beat = s.beats.get(m)
            if beat is not None:
                if beat.report is not None:
                    learn(s, m, beat.report)
                if m != msg.mid:
                    out.send(beat.ident, Ping())  # fresh states, sooner
    if len(ask.askers) < tables.max_askers(s):
        ask.askers.append(ident)
        ask.mids.append(msg.mid)
    j.answered[msg.mid] = WAITING
    learn(s, msg.mid, msg.report)


def finish_outcomes(s: State, out: Outbox, now: float) -> None:
    """The periodic work: answer the outcomes that are decided, or past their time."""
    j = s.judgements
    for seq in list(j.outcome_asks):
        ask = j.outcome_asks[seq]
        verdict = diagnose.outcome(
            ask.held.get(r) for r in map(s.rank_of, s.live()) if r is not None
        )
        if verdict is None and now < ask.until:
            continue
        del j.outcome_asks[seq]
        if verdict is not None:
            j.outcomes[seq] = verdict
            out.note(
                f"generation {s.generation}: op #{seq} "
                f"{'counts' if verdict == 'commit' else 'is dropped'} on every survivor"
            )
        for ident in ask.askers:
            out.send(ident, OutcomeAnswer(seq=seq, verdict=verdict))
        for mid in ask.mids:
            j.answered[mid] = now
