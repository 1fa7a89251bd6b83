"""Check the `final ...` lines of a train_digits run (read from a log file or stdin):
every live rank reports the same params_sha256, the world size and test accuracy are as
required. Exit 1, saying what is wrong, otherwise.

    python examples/check_final.py demo.log --world-size 4 --min-acc 0.95
"""

import argparse
import re
import sys

FINAL = re.compile(
    r"final rank=(\d+) world_size=(\d+) generation=(\d+) step=(\d+) "
    r"test_acc=([\d.]+) params_sha256=([0-9a-f]+)"
)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("log", nargs="?", default="-")
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--min-acc", type=float, default=0.95)
    a = p.parse_args()
    text = sys.stdin.read() if a.log == "-" else open(a.log).read()
    finals = [m.groups() for m in FINAL.finditer(text)]
    problems = []
    if not finals:
        problems.append("no `final` line found")
    else:
        ranks = sorted(int(f[0]) for f in finals)
        sizes = {int(f[1]) for f in finals}
        hashes = {f[5] for f in finals}
        accs = [float(f[4]) for f in finals]
        if len(hashes) != 1:
            problems.append(f"{len(hashes)} different params_sha256 among the ranks")
        if len(sizes) != 1 or ranks != list(range(len(finals))):
            problems.append(f"ranks {ranks} do not make one group (world sizes {sorted(sizes)})")
        if a.world_size is not None and sizes != {a.world_size}:
            problems.append(f"world size {sorted(sizes)}, expected {a.world_size}")
        if min(accs) < a.min_acc:
            problems.append(f"test accuracy {min(accs):.4f} < {a.min_acc}")
    if problems:
        print("demo check FAILED: " + "; ".join(problems))
        return 1
    f = finals[0]
    print(
        f"demo check OK: {len(finals)} ranks, generation {f[2]}, step {f[3]}, "
        f"test_acc {float(f[4]):.4f}, identical params_sha256 {f[5][:16]}..."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
