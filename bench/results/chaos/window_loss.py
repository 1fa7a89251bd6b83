"""The steps lost after each fault of a chaos run, against a fault-free rate.

    python bench/results/chaos/window_loss.py RUN.events.jsonl BASELINE_STEPS_PER_S [SPAN_S]

For each injection (the `inject` events of `--events`), the job's step count over the SPAN_S
(default 15) seconds that follow it, or up to the next injection or the job's last step,
against what the baseline's rate would have done in that time: the seconds lost (negative:
the window ran faster than the baseline), with the longest gap between two step reports in
it; then the sum per fault kind."""

import bisect
import collections
import json
import sys


def main(path: str, base_rate: float, span: float = 15.0) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    faults = [e for e in rows if e["run"] == "faults"]
    steps = sorted((e["t"], e["step"]) for e in faults if e["event"] == "step")
    times = [t for t, _ in steps]
    last_step = times[-1] if times else 0.0  # a window is cut there: the job is over
    highest, top = [], -1
    for _, s in steps:
        top = max(top, s)
        highest.append(top)

    def done_by(t: float) -> int:
        i = bisect.bisect_right(times, t) - 1
        return highest[i] if i >= 0 else 0

    injected = sorted((e["t"], e["kind"], e["target"]) for e in faults if e["event"] == "inject")
    lost_by_kind = collections.defaultdict(list)
    for k, (t, kind, target) in enumerate(injected):
        end = (
            min(t + span, last_step)
            if k + 1 == len(injected)
            else min(t + span, injected[k + 1][0])
        )
        end = max(end, t)
        got = done_by(end) - done_by(t)
        lost = (end - t) - got / base_rate
        lost_by_kind[kind].append(lost)
        i, j = bisect.bisect_left(times, t), bisect.bisect_right(times, end)
        gap = max((times[q + 1] - times[q] for q in range(i, j - 1)), default=0.0)
        print(
            f"{t - injected[0][0]:7.1f} s {kind:12} {target:>5}: {got:4d} steps in "
            f"{end - t:4.1f} s, lost {lost:6.2f} s, longest gap {gap:4.2f} s"
        )
    for kind, lost in sorted(lost_by_kind.items()):
        lost.sort()
        print(
            f"{kind:12} {len(lost):2d} faults: lost {sum(lost):6.1f} s in all, "
            f"median {lost[len(lost) // 2]:5.2f}, max {lost[-1]:5.2f}"
        )
    print(f"all: {sum(sum(v) for v in lost_by_kind.values()):.1f} s lost")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), *(float(a) for a in sys.argv[3:4]))
