"""The real stall matrix beside CPU burners: is the right worker evicted, every time?

    python -m bench stallmatrix [--cases c2-two_links-small,...] [--runs 10] [--burners 2]
                                [--name NAME] [--json FILE] [--out bench/results/stallmatrix]
                                [--op-timeout 3] [--heartbeat-timeout 2] [--burner-seconds S]

The seed's scenario, as a user meets it: 3 workers (tests/support/stall_worker.py: an
all_reduce(AVG) loop that reconstructs and drops the step on an error) on 3 network-namespace
hosts, a standalone coordinator on a fourth; op timeout 3 s, heartbeats every 0.2 s with a 2 s
timeout (fixed: the scenario's figures, not grown with the load as the tests' are). Once every
worker is past step 5, tc (htb + u32, tests/support/stall_runs.py) holds the culprit's links to
8 kbit/s for good. Each worker stops 3 kept steps after its first error (STALL_STEPS_AFTER_ERROR),
so that a run lasts seconds, not the whole job.

The matrix: culprit 0, 1, 2 x pattern (two_links: (c-1) -> c and c -> (c+1), the seed's;
whole_host: every link of c, a slow NIC) x gradient (small: 1,000 floats, the direct algorithm;
large: 600,000 floats, the ring). A case is named c<culprit>-<pattern>-<size>. Each case runs
--runs times, one case after another (a busy minute falls on one run of several cases), beside
--burners processes spinning on the CPUs, started before the first run and killed after the
last, whatever happens (Ctrl-C and SIGTERM too). One run at a time: the runs measure what CPU
starvation does to the judgement, and a second run beside would be more starvation.

A run is "right" when exactly the culprit was evicted and the survivors ended together
(stall_runs.check: one dropped step each, the same one, identical models, the final barrier);
"wrong" when it ended otherwise (a healthy rank evicted, or none); "broken" when it never got
to the slowdown or did not end within its deadline. Recorded per run: who was evicted; the
coordinator's judgements as it logs them (COLLECTIVES_DEBUG=TRACE on the coordinator only: the
stalled links, the links found bad, the probes, what decided); each worker's error; when each
rank began the op its first error names; the links the first verdict named stalled that tc did
not slow ("unslowed": evidence that is not causal, whether or not the verdict came out right);
seconds from the slowdown (the last tc filter in place) to the first rank's error or eviction
("verdict s"); the run's wall time (namespaces, processes and teardown included). Writes
NAME.json and NAME.txt to --out (NAME: burners<K> unless given); --json FILE writes the JSON
there too. --op-timeout and --heartbeat-timeout change the job's deadlines (the miniature test
grows them with the load). Needs root, iproute2 and nsenter. Every namespace and process it
makes is removed, even on failure (a final sweep removes this process's namespaces whatever a
run's teardown left).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from types import FrameType

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from support.netns import Hosts, ip, remove  # noqa: E402
from support.ports import coordinator_process  # noqa: E402
from support.procs import ProcessSet, clean_env  # noqa: E402
from support.stall_runs import (  # noqa: E402
    PATTERNS,
    SIZES,
    STEPS,
    WORKER,
    check,
    slow_links,
    wait_for_steps,
    worker_env,
)

N = 3  # workers; the coordinator runs on host N
NET = 91  # 169.254.91.x: no test uses it, so this runs beside the namespace tests
TAG = "sm"
SLOW_AFTER_STEP = 5
STEPS_AFTER_ERROR = 3
RUN_DEADLINE = 90.0  # s from the slowdown: a run still going then is "broken"
SECRET = "stallmatrix-bench-secret-0123456789"
COUNTS = {"small": SIZES["direct"], "large": SIZES["ring"]}
CULPRITS = (0, 1, 2)
# a burner ends by itself after this long too: one left behind by a SIGKILLed harness stops
BURN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


@dataclass(frozen=True)
class Case:
    culprit: int
    pattern: str
    size: str

    @property
    def name(self) -> str:
        return f"c{self.culprit}-{self.pattern}-{self.size}"

    @property
    def links(self) -> list[tuple[int, int]]:
        return PATTERNS[self.pattern](self.culprit, N)

    @property
    def count(self) -> int:
        return COUNTS[self.size]


CASES = {
    c.name: c
    for c in (
        Case(culprit, pattern, size)
        for culprit in CULPRITS
        for pattern in ("two_links", "whole_host")
        for size in ("small", "large")
    )
}


@dataclass(frozen=True)
class Timeouts:
    """What the job is given: the op deadline and the heartbeats (seconds)."""

    op: float = 3.0
    beat: float = 0.2
    beat_timeout: float = 2.0

    def env(self) -> dict[str, str]:
        return {
            "STALL_TIMEOUT": f"{self.op:g}",
            "COLLECTIVES_HEARTBEAT_INTERVAL": f"{self.beat:g}",
            "COLLECTIVES_HEARTBEAT_TIMEOUT": f"{self.beat_timeout:g}",
        }


@dataclass
class Judged:
    """One of the coordinator's judgements of a stalled op, as its log line shows it."""

    op: int
    generation: int
    at_s: float | None  # after the slowdown (the log's clock: milliseconds)
    culprits: list[int]
    why: str
    decided_by: str | None
    stalled: list[list[int]]  # the stalled op's links (sender, receiver)
    bad: list[list[int]]  # the links held against the culprits
    probes: list[list[float | int | None]]  # [sender, receiver, seconds or None]
    judged_op: int | None  # an earlier op judged in this one's place
    line: str  # the log line, as a fallback where the form above was not found


@dataclass
class Run:
    case: str
    burners: int
    outcome: str = "broken"  # right | wrong | broken
    reason: str = ""  # why not right: whom it evicted, check's message, or what broke
    evicted: list[int] = field(default_factory=list)
    verdict_s: float | None = None  # slowdown -> the first rank's error or eviction
    # rank -> seconds from the slowdown to when it began the op its first error (or eviction)
    # names: a rank that came late to the stalled op shows here
    entered_s: dict[int, float | None] = field(default_factory=dict)
    wall_s: float = 0.0
    judged: list[Judged] = field(default_factory=list)
    # links the first verdict's picture named stalled that tc did not slow (unslowed_named)
    unslowed: list[list[int]] = field(default_factory=list)
    probing: list[str] = field(default_factory=list)  # the coordinator's "probing" lines
    removed: list[str] = field(default_factory=list)  # its "removed" lines
    errors: dict[int, list[str]] = field(default_factory=dict)  # rank -> its errors / eviction
    exit_codes: dict[int, int | None] = field(default_factory=dict)


# --- the coordinator's log ------------------------------------------------------------------------
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
JUDGED = re.compile(r"op #(\d+) of generation (\d+) judged: (.*)$")
CULPRITS_FIELD = re.compile(r"culprits=(\[[^\]]*\])")
WHY_FIELD = re.compile(r"""why=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")
EVIDENCE_FIELD = re.compile(r"evidence=(\{.*\})\)\s*$")


def _stamp(line: str) -> float | None:
    """The wall-clock time of a logging line ("YYYY-MM-DD HH:MM:SS,mmm ...", local time)."""
    m = STAMP.match(line)
    if not m:
        return None
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def relative(line: str, slowed_wall: float) -> str:
    """The line with its wall-clock stamp replaced by the seconds since the slowdown."""
    stamp = _stamp(line)
    if stamp is None:
        return line
    return f"{stamp - slowed_wall:+.3f}s {STAMP.sub('', line, count=1)}"


def _literal(pattern: re.Pattern[str], text: str, default: object) -> object:
    m = pattern.search(text)
    if not m:
        return default
    try:
        return ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return default


def parse_judged(line: str, slowed_wall: float) -> Judged | None:
    """A judgement from the coordinator's DEBUG line "op #S of generation G judged: <repr>"
    (membership/verdicts.py), or None where the line is not one."""
    m = JUDGED.search(line)
    if not m:
        return None
    body = m.group(3)
    evidence = _literal(EVIDENCE_FIELD, body, {})
    ev = evidence if isinstance(evidence, dict) else {}
    culprits = _literal(CULPRITS_FIELD, body, [])
    why = _literal(WHY_FIELD, body, "")
    stamp = _stamp(line)
    return Judged(
        op=int(m.group(1)),
        generation=int(m.group(2)),
        at_s=None if stamp is None else round(stamp - slowed_wall, 3),
        culprits=list(culprits) if isinstance(culprits, list) else [],
        why=str(why),
        decided_by=ev.get("decided_by"),
        stalled=list(ev.get("stalled", [])),
        bad=list(ev.get("bad", [])),
        probes=list(ev.get("probes", [])),
        judged_op=ev.get("judged_op"),
        line=relative(line, slowed_wall),
    )


def unslowed_named(judged: list[Judged], links: list[tuple[int, int]]) -> list[list[int]]:
    """The links the first judgement of generation 0 named stalled although tc did not slow
    them: evidence that is not causal. A diagnostic, not the verdict's test: a link whose
    reverse is slowed carries its ACKs slowly, and a large transfer on it may truly stall."""
    first = next((j for j in judged if j.generation == 0), None)
    if first is None:
        return []
    slowed = {tuple(link) for link in links}
    return [link for link in first.stalled if tuple(link) not in slowed]


# --- one run --------------------------------------------------------------------------------------
def _start(procs: ProcessSet, hosts: Hosts, case: Case, t: Timeouts) -> list[str]:
    """The standalone coordinator on host N, then the workers; their process names."""
    address = coordinator_process(
        procs,
        "coord",
        N,
        prefix=hosts.prefix(N),
        host=hosts.ips[N],
        # the coordinator's judgements (a DEBUG line each) and membership changes; the workers
        # log as a user's would (warnings only)
        env=clean_env(COLLECTIVES_JOB_SECRET=SECRET, COLLECTIVES_DEBUG="TRACE", **t.env()),
    )
    base = worker_env(
        N,
        case.count,
        MASTER_ADDR=hosts.ips[N],
        MASTER_PORT=address.rsplit(":", 1)[1],
        COLLECTIVES_JOB_SECRET=SECRET,
        STALL_PACE="0.05",
        STALL_TRACE="1",
        STALL_STEPS_AFTER_ERROR=str(STEPS_AFTER_ERROR),
        **t.env(),
    )
    names = [f"rank{r}" for r in range(N)]
    for r, name in enumerate(names):
        procs.spawn(
            name, [*hosts.prefix(r), sys.executable, WORKER, STEPS], dict(base, RANK=str(r))
        )
    return names


def _wait(procs: ProcessSet, names: list[str], until: float) -> dict[int, int | None]:
    """Each worker's exit code, None for one still running at `until` (monotonic)."""
    codes: dict[int, int | None] = {}
    for r, name in enumerate(names):
        try:
            codes[r] = procs.procs[name].wait(timeout=max(0.1, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[r] = None
    return codes


def _last_json(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def one_run(case: Case, burners: int, t: Timeouts) -> Run:
    began = time.monotonic()
    run = Run(case.name, burners)
    with tempfile.TemporaryDirectory() as tmp, Hosts(N + 1, NET, tag=TAG) as hosts:
        procs = ProcessSet(tmp)
        try:
            names = _start(procs, hosts, case, t)
            wait_for_steps(procs, names, SLOW_AFTER_STEP, timeout=120)
            slow_links(hosts, case.links)
            slowed, slowed_wall = time.monotonic(), time.time()
            run.exit_codes = _wait(procs, names, slowed + RUN_DEADLINE)
            _record(run, procs, names, case, slowed, slowed_wall)
        except (AssertionError, subprocess.SubprocessError) as exc:
            # the coordinator's port, wait_for_steps (a worker ended or hung) or tc failed
            # the head says which worker and when, the tail the exception it died of
            why = str(exc)
            run.reason = "before the slowdown: " + (
                why if len(why) <= 2000 else f"{why[:500]}\n[...]\n{why[-1500:]}"
            )
        finally:
            procs.close()
    run.wall_s = round(time.monotonic() - began, 2)
    return run


def _record(
    run: Run, procs: ProcessSet, names: list[str], case: Case, slowed: float, slowed_wall: float
) -> None:
    coord = procs.stderr("coord").splitlines()
    run.judged = [j for j in (parse_judged(ln, slowed_wall) for ln in coord) if j is not None]
    run.unslowed = unslowed_named(run.judged, case.links)
    run.probing = [relative(ln, slowed_wall) for ln in coord if "probing the links" in ln]
    run.removed = [relative(ln, slowed_wall) for ln in coord if " removed: " in ln]
    results: dict[int, dict] = {}
    firsts = []
    for r, name in enumerate(names):
        res = _last_json(procs.lines(name))
        if res is None:
            continue
        results[r] = res
        # (when, when it began the op named, the text) of each error, the eviction last
        events = list(
            zip(res.get("errors_at", []), res.get("errors_op_began", []), res.get("errors", []))
        )
        if "evicted" in res:
            run.evicted.append(r)
            events.append((res.get("at"), res.get("op_began"), f"Evicted: {res['evicted']}"))
        run.errors[r] = [text for _, _, text in events]
        if events:
            at, began, _ = events[0]
            firsts.append(at)
            run.entered_s[r] = None if began is None else round(began - slowed, 3)
    known = [x for x in firsts if x is not None]
    run.verdict_s = round(min(known) - slowed, 3) if known else None
    if any(code is None for code in run.exit_codes.values()):
        late = [r for r, code in run.exit_codes.items() if code is None]
        run.reason = f"rank(s) {late} still ran {RUN_DEADLINE:g} s after the slowdown"
        return
    failed = {r: code for r, code in run.exit_codes.items() if code != 0}
    crashed = f"; exit codes {failed}:\n{procs.stderr_tail()[-1500:]}" if failed else ""
    if run.evicted != [case.culprit]:
        healthy = [r for r in run.evicted if r != case.culprit]
        run.outcome = "wrong"
        run.reason = (
            f"healthy rank(s) {healthy} evicted" if healthy else "the culprit was not evicted"
        ) + f" (evicted {run.evicted}, culprit {case.culprit}){crashed}"
        return
    try:  # the culprit alone: did the survivors end together?
        check(results, N, case.culprit, case.count, steps_after_error=STEPS_AFTER_ERROR)
    except AssertionError as exc:
        run.outcome, run.reason = "wrong", f"the survivors differ: {str(exc)[:800]}{crashed}"
        return
    run.outcome, run.reason = "right", ""


# --- burners --------------------------------------------------------------------------------------
class Burners:
    """k processes spinning on the CPUs while inside; all killed and reaped on leaving, their
    pids and the CPU seconds each had used kept (the record shows that they burned)."""

    def __init__(self, k: int, seconds: float = 4 * 3600):
        self.k, self.seconds = k, seconds
        self.procs: list[subprocess.Popen] = []
        self.pids: list[int] = []
        self.cpu_s: list[float | None] = []

    def __enter__(self) -> Burners:
        try:
            for _ in range(self.k):
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", BURN.format(s=self.seconds)],
                        start_new_session=True,
                    )
                )
                self.pids.append(self.procs[-1].pid)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_s = [cpu_seconds(p.pid) for p in self.procs]
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass  # gone already
        for p in self.procs:
            p.wait(timeout=10)
        self.procs = []


def sweep() -> None:
    """Whatever a run interrupted in its own teardown left: every namespace by the names this
    process gives its hosts (and whatever runs inside), and a veth not yet moved into one."""
    planned = Hosts(N + 1, NET, tag=TAG)
    for ns in [planned.switch, *planned.names]:
        remove(ns)
    for dev in planned.devs:
        ip("link", "del", dev, check=False)


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system) process `pid` has used; None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sigterm(signum: int, frame: FrameType | None) -> None:
    # once: a second SIGTERM must not cut the cleanup short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds: burners, processes, namespaces


# --- the report -----------------------------------------------------------------------------------
def spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def run_line(i: int, runs: int, x: Run) -> str:
    v = "-" if x.verdict_s is None else f"{x.verdict_s:.1f}"
    by = ",".join(str(j.decided_by) for j in x.judged) or "-"
    return (
        f"  run {i}/{runs} {x.case}: {x.outcome}, evicted {x.evicted}, verdict {v} s "
        f"(decided by {by}), wall {x.wall_s:.1f} s"
        + (f"; named stalled, not slowed: {x.unslowed}" if x.unslowed else "")
    )


def evidence_lines(x: Run) -> list[str]:
    """What a run that was not right shows: each judgement, each rank's error, the reason."""
    out = []
    for j in x.judged:
        at = "?" if j.at_s is None else f"{j.at_s:.2f}"
        out.append(
            f"    judged op #{j.op} gen {j.generation} at +{at} s: culprits {j.culprits}, "
            f"decided by {j.decided_by}; stalled {j.stalled}; bad {j.bad}"
            + (f"; judged op #{j.judged_op} instead" if j.judged_op is not None else "")
        )
        if j.probes:
            out.append(f"      probes [src, dst, s]: {j.probes}")
        if j.decided_by is None:
            out.append(f"      log: {j.line[:300]}")
    out += [f"    coordinator at {ln}" for ln in x.probing + x.removed]
    if x.entered_s:
        entered = ", ".join(
            f"rank {r} {'?' if s is None else f'{s:+.2f} s'}"
            for r, s in sorted(x.entered_s.items())
        )
        out.append(f"    began the op of its first error, after the slowdown: {entered}")
    for r, errs in sorted(x.errors.items()):
        out += [f"    rank {r}: {e[:300]}" for e in errs]
    if x.reason:
        out.append(f"    why: {x.reason[:600]}")
    return out


def table(runs: list[Run], cases: list[Case]) -> list[str]:
    lines = [
        f"{'case':24} {'right':>7} {'wrong':>5} {'broken':>6} {'unslowed':>8} {'verdict s':>16}"
        f" {'wall s':>16}  decided by"
    ]
    for c in cases:
        mine = [x for x in runs if x.case == c.name]
        if not mine:
            continue
        right = sum(x.outcome == "right" for x in mine)
        wrong = sum(x.outcome == "wrong" for x in mine)
        broken = sum(x.outcome == "broken" for x in mine)
        unslowed = sum(bool(x.unslowed) for x in mine)
        verdict = [x.verdict_s for x in mine if x.verdict_s is not None]
        decided: dict[str, int] = {}
        for x in mine:
            key = "+".join(str(j.decided_by) for j in x.judged) or "-"
            decided[key] = decided.get(key, 0) + 1
        by = ", ".join(f"{k} x{v}" for k, v in sorted(decided.items()))
        lines.append(
            f"{c.name:24} {right:>3}/{len(mine):<3} {wrong:>5} {broken:>6} {unslowed:>8} "
            f"{spread(verdict):>16} {spread([x.wall_s for x in mine]):>16}  {by}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench stallmatrix", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--cases", default=",".join(CASES), help="e.g. c2-two_links-small (default all)")
    p.add_argument("--runs", type=int, default=10, help="runs of each case")
    p.add_argument("--burners", type=int, default=2, help="CPU burners beside the runs")
    p.add_argument(
        "--burner-seconds",
        type=float,
        default=4 * 3600,
        help="a burner also ends by itself after this long (one a SIGKILLed harness left)",
    )
    p.add_argument("--name", default=None, help="the results' file name (default burners<K>)")
    p.add_argument("--json", metavar="FILE", help="the JSON record here too")
    p.add_argument("--out", default="bench/results/stallmatrix")
    p.add_argument("--op-timeout", type=float, default=Timeouts.op)
    p.add_argument("--heartbeat-timeout", type=float, default=Timeouts.beat_timeout)
    args = p.parse_args(argv)
    cases = []
    for name in [c for c in args.cases.split(",") if c]:
        if name not in CASES:
            p.error(f"no case {name!r}; one of: {', '.join(CASES)}")
        cases.append(CASES[name])
    t = Timeouts(op=args.op_timeout, beat_timeout=args.heartbeat_timeout)
    name = args.name or f"burners{args.burners}"
    out = pathlib.Path(args.out)
    command = "python -m bench stallmatrix " + " ".join(sys.argv[1:] if argv is None else argv)
    head = [
        f"# command: {command}",
        f"# machine: {os.cpu_count()} CPUs, shared with other work; {args.burners} CPU burner(s)"
        f" beside the runs; 3 workers on 3 network-namespace hosts, a standalone coordinator on"
        f" a fourth; tc htb holds the culprit's links to 8 kbit/s after step {SLOW_AFTER_STEP}",
        f"# op timeout {t.op:g} s, heartbeats every {t.beat:g} s with a {t.beat_timeout:g} s"
        f" timeout; each worker stops {STEPS_AFTER_ERROR} steps after its first error",
        "# verdict s: from the slowdown to the first rank's error or eviction, median (min-max)"
        " over the runs; wall s: each run whole (namespaces, processes, teardown); unslowed:"
        " runs whose first verdict named a link stalled that tc did not slow",
    ]
    print("\n".join(head), flush=True)
    runs: list[Run] = []
    previous = signal.signal(signal.SIGTERM, _sigterm)
    began = time.monotonic()
    burners = Burners(args.burners, args.burner_seconds)
    interrupted = False
    try:
        with burners:
            for i in range(1, args.runs + 1):
                for c in cases:
                    x = one_run(c, args.burners, t)
                    runs.append(x)
                    print(run_line(i, args.runs, x), flush=True)
                    if x.outcome != "right":
                        print("\n".join(evidence_lines(x)), flush=True)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sweep()
        signal.signal(signal.SIGTERM, previous)
        lines = head + table(runs, cases)
        for x in [x for x in runs if x.outcome != "right"]:
            lines.append(f"{x.case} {x.outcome}: evicted {x.evicted}")
            lines += evidence_lines(x)
        lines.append(
            f"# {len(runs)} runs in {time.monotonic() - began:.0f} s"
            + (" (interrupted)" if interrupted else "")
        )
        print("\n".join(lines[len(head) :]), flush=True)
        record = {
            "command": command,
            "burners": args.burners,
            "runs_per_case": args.runs,
            "timeouts": asdict(t),
            "steps_after_error": STEPS_AFTER_ERROR,
            "interrupted": interrupted,
            "burner_pids": burners.pids,
            "burner_cpu_s": burners.cpu_s,
            "cases": [c.name for c in cases],
            "runs": [asdict(x) for x in runs],
        }
        text = json.dumps(record, indent=1) + "\n"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.json").write_text(text)
        (out / f"{name}.txt").write_text("\n".join(lines) + "\n")
        if args.json:
            pathlib.Path(args.json).write_text(text)
        print(f"wrote {out}/{name}.json, {name}.txt", flush=True)
    if interrupted:
        sys.exit(130)


if __name__ == "__main__":
    main()
