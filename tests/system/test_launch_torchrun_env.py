"""The launcher's habits are torchrun's (python -m collectives.launch against
python -m torch.distributed.run, both run here on the same script).

Invariants:
  * every variable torchrun gives a worker, our launcher gives too, with the same value where
    the value is not the job's own (address and ports, run id; TORCHELASTIC_USE_AGENT_STORE
    is "False" here because no agent hosts a store, TORCHELASTIC_SIGNALS_TO_HANDLE names the
    signals this launcher forwards, see collectives/launch/__main__.py); only
    TORCHELASTIC_ERROR_FILE (torchrun's file for @record's error reports) is torchrun's alone;
  * OMP_NUM_THREADS: unset and 2 workers on the host -> 1 in every worker, and torchrun's
    notice once on the launcher's stderr; set by the user -> kept, no notice; 1 worker ->
    left unset, as torchrun does.
"""

from __future__ import annotations

import json
import sys

import pytest

from support.procs import clean_env

SCRIPT = r"""
import json, os, sys
keep = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
env = {k: v for k, v in os.environ.items() if k in keep or k.startswith(("TORCHELASTIC_",
                                                                        "TORCH_NCCL_"))}
# a file each: two workers' lines on a launcher's shared stdout interleave under load
out = os.path.join(sys.argv[1], "env%s.json" % os.environ["RANK"])
with open(out + ".tmp", "w") as f:
    json.dump(env, f, sort_keys=True)
os.replace(out + ".tmp", out)
"""


def _run(procs, tmp_path, cmd, name, **extra):
    script = tmp_path / "show_env.py"
    script.write_text(SCRIPT)
    env = clean_env(**extra)
    if "OMP_NUM_THREADS" not in extra:
        env.pop("OMP_NUM_THREADS", None)
    outdir = tmp_path / name
    outdir.mkdir()
    procs.spawn(name, [*cmd, script, outdir], env)
    res = procs.wait(name, timeout=50)[0]
    assert res.code == 0, res.err[-3000:]
    envs = [json.loads(f.read_text()) for f in sorted(outdir.glob("env*.json"))]
    return sorted(envs, key=lambda e: int(e["RANK"])), res.err


OURS = [sys.executable, "-m", "collectives.launch", "--nproc"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
OWN = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
}


@pytest.mark.timeout(90)
def test_worker_environment_and_omp_match_torchrun(procs, tmp_path):
    pytest.importorskip("torch")
    ours, err = _run(procs, tmp_path, OURS + ["2"], "ours")
    theirs, _ = _run(procs, tmp_path, TORCHRUN + ["2"], "torchrun")
    assert len(ours) == len(theirs) == 2, (ours, theirs)
    for mine, ref in zip(ours, theirs):
        assert set(ref) - {"TORCHELASTIC_ERROR_FILE"} <= set(mine), set(ref) - set(mine)
        for k, v in ref.items():
            if k not in OWN:
                assert mine[k] == v, (k, mine[k], v)
        assert mine["OMP_NUM_THREADS"] == "1"
        assert mine["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert ours[0]["TORCHELASTIC_RUN_ID"] == ours[1]["TORCHELASTIC_RUN_ID"] != "none"
    assert (
        err.count("Setting OMP_NUM_THREADS environment variable for each process to be 1") == 1
    ), err[-2000:]


@pytest.mark.timeout(60)
def test_omp_set_by_user_is_kept_and_one_worker_gets_none(procs, tmp_path):
    kept, err = _run(procs, tmp_path, OURS + ["2"], "kept", OMP_NUM_THREADS="3")
    assert [e["OMP_NUM_THREADS"] for e in kept] == ["3", "3"]
    assert "Setting OMP_NUM_THREADS" not in err
    alone, err = _run(procs, tmp_path, OURS + ["1"], "alone")
    assert "OMP_NUM_THREADS" not in alone[0] and "Setting OMP_NUM_THREADS" not in err
