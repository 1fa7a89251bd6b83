"""The frameworks people train with, unchanged apart from the backend name (and the one setup
line a framework gives no other way for, documented in its script): each script trains the
digits MLP (tests/integrations/scripts/digits.py) on 2-3 CPU processes over Gloo and over
"collectives", same seed and data order.

Invariant of every test: both runs exit 0 and end with parameters within 1e-6 of each other
(the two backends may add the ranks' gradients in another order: the last bits may differ,
nothing more). Each script also checks its own framework's promise (DCP's load restores what
save and async_save wrote, the group is the one asked for, ...).

`make test-integrations` runs these (its own install, the `integrations` extra); `make test`
leaves them out.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

from support.procs import clean_env

# under CI=true a skip of these is a failure (tests/conftest.py)
pytestmark = pytest.mark.ci_must_run
# set by `make test-integrations`, whose only job is to run these: there a framework that does
# not import is a failure, never a skip
REQUIRED = os.environ.get("TEST_INTEGRATIONS") == "1"


def framework(name: str):
    """The module `name`: imported (an ImportError fails the test) where the frameworks are
    required, else skipped without it (a `pytest tests` where they were never installed)."""
    if REQUIRED:
        return importlib.import_module(name)
    return pytest.importorskip(name)


framework("torch")
framework("sklearn")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
PY = sys.executable
LAUNCH = [PY, "-m", "collectives.launch", "--timeout", "240", "--nproc"]
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
TOLERANCE = 1e-6


def run(procs, name, argv, timeout=270, **env):
    """Run argv (cwd: the repository) to its end; its output. Fails on a non-zero exit."""
    procs.spawn(name, argv, clean_env(PYTHONWARNINGS="ignore", **env), merge_stderr=True)
    (res,) = procs.wait(name, timeout)
    assert res.code == 0, f"{name} exited with {res.code}:\n{res.output[-5000:]}"
    return res.output


def params(path):
    return np.load(path)


def assert_close(tmp_path, ref="gloo.npy", others=("collectives.npy",)):
    want = params(tmp_path / ref)
    for other in others:
        got = params(tmp_path / other)
        assert got.shape == want.shape and np.isfinite(got).all()
        diff = float(np.max(np.abs(got - want)))
        assert diff <= TOLERANCE, f"{other}: parameters differ from {ref} by up to {diff:g}"
        assert not np.array_equal(got, params_start()), f"{other}: nothing was trained"


def params_start():
    sys.path.insert(0, SCRIPTS)
    try:
        import digits
    finally:
        sys.path.remove(SCRIPTS)
    return np.concatenate(
        [p.detach().reshape(-1).double().numpy() for p in digits.model().parameters()]
    )


def script(name):
    return os.path.join(SCRIPTS, name)


def both(procs, tmp_path, cmd, name, extra=()):
    """cmd + [script args] once per backend; the outputs."""
    out = {}
    for backend in ("gloo", "collectives"):
        out[backend] = run(
            procs,
            f"{name}_{backend}",
            [*cmd, "--backend", backend, "--out", tmp_path / f"{backend}.npy", *extra],
        )
    return out


@pytest.mark.timeout(600)
def test_ddp_tutorial_under_our_launcher(procs, tmp_path):
    """DistributedSampler, DDP, a rank-0 checkpoint the others load after a barrier,
    all_gather_object and broadcast_object_list; 3 processes."""
    out = both(procs, tmp_path, [*LAUNCH, "3", script("ddp_tutorial.py")], "ddp")
    assert out["collectives"].count("19 steps") == 3, out["collectives"][-3000:]
    assert_close(tmp_path)


@pytest.mark.timeout(600)
def test_dcp_save_load_and_async_save(procs, tmp_path):
    out = both(procs, tmp_path, [*LAUNCH, "2", script("dcp_digits.py")], "dcp")
    assert out["collectives"].count("save, load and async_save over collectives ok") == 2
    assert_close(tmp_path)


@pytest.mark.timeout(600)
def test_accelerate_with_the_group_made_first(procs, tmp_path):
    framework("accelerate")
    out = both(procs, tmp_path, [*LAUNCH, "2", script("accelerate_digits.py")], "accelerate")
    assert out["collectives"].count("20 steps over collectives") == 2, out["collectives"]
    assert_close(tmp_path)


@pytest.mark.timeout(900)
def test_lightning_sync_dist_under_three_launchers(procs, tmp_path):
    """Lightning's DDPStrategy(process_group_backend="collectives") with sync_dist=True
    metrics (Lightning asks this backend for AVG, on an int64 counter too), under
    Lightning's own launcher, torchrun and ours, each against Lightning's own run over Gloo."""
    framework("lightning")
    lightning = script("lightning_digits.py")
    runs = {
        "gloo.npy": [PY, lightning, "--devices", "2", "--backend", "gloo"],
        "own.npy": [PY, lightning, "--devices", "2", "--backend", "collectives"],
        "torchrun.npy": [*TORCHRUN, "2", lightning, "--backend", "collectives"],
        "ours.npy": [*LAUNCH, "2", lightning, "--backend", "collectives"],
    }
    for out, argv in runs.items():
        text = run(procs, out[:-4], [*argv, "--out", tmp_path / out])
        assert "20 steps over" in text, text[-3000:]
    assert_close(tmp_path, others=("own.npy", "torchrun.npy", "ours.npy"))


@pytest.mark.timeout(900)
def test_ray_train_two_workers(procs, tmp_path):
    """TorchTrainer, 2 CPU workers, TorchConfig(backend=...), Gloo then collectives in one
    Ray session; the backend registered in Ray's workers by worker_process_setup_hook."""
    framework("ray.train")
    out = run(
        procs,
        "ray",
        [
            PY,
            script("ray_digits.py"),
            "--out-gloo",
            tmp_path / "gloo.npy",
            "--out",
            tmp_path / "collectives.npy",
        ],
        timeout=840,
        RAY_USAGE_STATS_ENABLED="0",
        RAY_DEDUP_LOGS="0",
    )
    assert "RAY_DONE collectives" in out, out[-5000:]
    # Ray sets its workers' root logger to INFO: no per-op line of ours may show.
    assert " -> direct" not in out and " -> ring" not in out, out[-3000:]
    assert_close(tmp_path)
