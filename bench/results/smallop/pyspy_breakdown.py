"""Where a small all_reduce's wall time goes, from `py-spy record --native -f raw` of one rank
(spin_ops.py): the samples inside ProcessGroup.all_reduce, split into blocked in a poll
(waiting for the peer), inside the send syscall (which wakes the peer; on a loaded machine
the sender is often descheduled there), and the rest (the calling thread's Python and its
other syscalls) by the op path's parts. `python pyspy_breakdown.py OUT.raw`"""

import collections
import re
import sys

PARTS = (
    "OpChannel.take_small",
    "OpChannel.send_small",
    "_commit_round",
    "reduce_onto",
    "reduce_into",
    "finalize",
    "OpChannel.__init__",
    "OpChannel.begin",
    "OpChannel.finish",
    "ScheduleBook.for_op",
    "stage",
)
LAYERS = (
    "direct_all_reduce",
    "all_reduce.<locals>.run",
    "GroupCore.submit.<locals>.run",
    "GroupCore.submit",
    "Collectives.all_reduce",
    "ProcessGroup.all_reduce",
)


def main(path: str) -> None:
    total = waits = sends = 0
    parts: collections.Counter[str] = collections.Counter()
    for line in open(path):
        stack, count = line.rstrip().rsplit(" ", 1)
        n = int(count)
        frames = [re.sub(r" \(.*", "", f) for f in stack.split(";")]
        if "ProcessGroup.all_reduce" not in frames:
            continue
        total += n
        if frames[-1] == "poll":
            waits += n
            continue
        if frames[-1] == "send" and "Sender.post_small" in frames:
            sends += n
            continue
        for key in PARTS:
            if key in frames:
                if key == "_commit_round":
                    sub = (
                        "take_small"
                        if "OpChannel.take_small" in frames
                        else ("send_small" if "OpChannel.send_small" in frames else "itself")
                    )
                    key = f"_commit_round: {sub}"
                parts[key] += n
                break
        else:
            key = next((k for k in LAYERS if k in frames), "?")
            parts[key + " (itself)"] += n
    rest = total - waits - sends
    print(
        f"{total} samples in all_reduce: blocked in a poll {waits} ({100 * waits / total:.0f} %), "
        f"in the send syscall {sends} ({100 * sends / total:.0f} %), the rest {rest}:"
    )
    for key, n in parts.most_common():
        print(f"{n:6d} {100 * n / rest:5.1f} % of the rest  {key}")


if __name__ == "__main__":
    main(sys.argv[1])
