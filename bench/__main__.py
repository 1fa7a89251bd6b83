"""python -m bench [STUDY] [ARGS...]: every benchmark behind one command.

Without a study (or with an option first) it is the harness, `python -m bench collectives`:
every backend on every size, nccl-tests style. `python -m bench --list` names the studies.
"""

from __future__ import annotations

import runpy
import sys

# study -> (module, what it measures). Workers (bench.*.*_worker) are started by their study.
STUDIES = {
    "collectives": ("bench.harness.cli", "one collective, every backend, every size (the harness)"),
    "costmodel": ("bench.harness.costmodel", "alpha-beta fits and the auto crossovers"),
    "limit": ("bench.floors.limit", "the loopback limit: a raw pyzmq ring"),
    "pyfloor": ("bench.floors.pyfloor", "the fastest exchange pure Python can make"),
    "smallop": ("bench.studies.smallop", "small-op latency against its floor"),
    "registered": ("bench.studies.registered", "registered buffers against ordinary ones"),
    "ddp_speed": ("bench.studies.ddp_speed", "DDP steps per second: Gloo vs collectives"),
    "train_speed": (
        "bench.studies.train_speed",
        "the digits example: steps/s and a failure's cost",
    ),
    "scale": ("bench.studies.scale", "all_reduce, reconstruct and detection against world size"),
    "multihost": ("bench.studies.multihost", "2 hosts x 2 ranks over a slow link (root)"),
    "fault_recovery": ("bench.studies.fault_recovery", "time from a fault to a working group"),
    "recovery": ("bench.studies.recovery", "SIGKILL -> every survivor's next op; a spare's step"),
    "torch_shrink": (
        "bench.studies.torch_shrink",
        "SIGKILL -> first op: dist.shrink_group vs reconstruct()",
    ),
    "stall": ("bench.studies.stall", "a stall's culprit: time to the verdict, probes on and off"),
    "stallmatrix": (
        "bench.studies.stallmatrix",
        "the tc stall matrix beside CPU burners: the right worker evicted?",
    ),
    "failslow": ("bench.studies.failslow", "a slowed link found, routed around; false flags"),
    "linktest": ("bench.studies.linktest", "a link routed around: its tests' cost, its recovery"),
    "coordinator_load": ("bench.studies.coordinator_load", "the coordinator under 1,000 members"),
    "membership_scale": (
        "bench.studies.membership_scale",
        "the coordinator machine at 100..10,000 members, virtual time",
    ),
    "hello_flood": ("bench.studies.hello_flood", "a CURVE HELLO flood's cost to a running job"),
    "soak": ("bench.stress.soak", "thousands of mixed checked collectives; nothing may leak"),
    "chaos": ("bench.stress.chaos", "random real faults while survivors train"),
}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] == "--list":
        for name, (module, what) in STUDIES.items():
            print(f"{name:18} {what}  ({module})")
        return
    study = "collectives" if not args or args[0].startswith("-") else args.pop(0)
    if study not in STUDIES:
        sys.exit(f"python -m bench: no study {study!r}; one of: {', '.join(STUDIES)}")
    sys.argv = [f"python -m bench {study}", *args]
    runpy.run_module(STUDIES[study][0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
