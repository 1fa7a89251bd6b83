"""explain's pages in a real browser: headless Chromium (Debian's `chromium` package) loads
the page offline, opens step K from the URL fragment, and is screenshotted.

Invariants:
  * the page declares the step it shows (<body data-step=K>) and the status line names that
    round -- read from the DOM Chromium built after running the page's script;
  * the screenshots follow the step: step 0 draws nothing right of the start column, step K
    draws there (cells and arrows), so the two differ in that region; the same step twice
    gives the same pixels;
  * the failure views (a graph page) step the same way, and so does a recorded run replayed
    (`explain replay --html`, run as a user runs it): rank 1 is drawn alive at the first op
    and dead from the signal on, read from the SVG Chromium built.
Skipped, with the reason, where chromium is not installed; .ci/run installs it and runs these
(`make test-browser`).
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from collectives.teaching import stall
from collectives.teaching.explain import explain_run, html, views

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not installed (apt-get install "
        "chromium); .ci/run installs it for `make test-browser`",
    ),
]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-extensions",
    "--window-size=1000,700",
]


def chromium(*args, tmp_path):
    run = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def shot(url, path, tmp_path):
    chromium(f"--screenshot={path}", url, tmp_path=tmp_path)
    from PIL import Image

    return np.asarray(Image.open(path).convert("L"), dtype=np.int16)


def test_ring_page_steps_in_chromium(tmp_path):
    x = explain_run("ring", 4, 8)
    page = html.write(html.grid_model(x), str(tmp_path / "ring.html"))
    url = f"file://{page}"
    dom = chromium("--dump-dom", f"{url}#step=3", tmp_path=tmp_path)
    assert 'data-step="3"' in dom and f'data-steps="{x.rounds + 1}"' in dom
    assert "step 3 of 6: round 3: reduce-scatter step 2" in dom
    a = shot(f"{url}#step=0", tmp_path / "s0.png", tmp_path)
    b = shot(f"{url}#step=3", tmp_path / "s3.png", tmp_path)
    again = shot(f"{url}#step=3", tmp_path / "s3b.png", tmp_path)
    # the svg starts below the controls; right of the start column, inside the border
    region = (slice(110, 380), slice(260, 970))
    assert (a[region] < 250).mean() < 0.002, "step 0 draws nothing past the start column"
    assert (b[region] < 250).mean() > 0.02, "step 3 draws its rounds"
    assert np.abs(b.astype(int) - again).max() == 0, "a step renders the same every time"


def test_failure_view_page_steps_in_chromium(tmp_path):
    m = views.stall_model(stall.run_stall(3, 1))
    page = html.write(m, str(tmp_path / "stall.html"))
    last = len(m["frames"]) - 1
    dom = chromium("--dump-dom", f"file://{page}#step={last}", tmp_path=tmp_path)
    assert f'data-step="{last}"' in dom and "verdict: rank 1 blamed" in dom
    a = shot(f"file://{page}#step=0", tmp_path / "g0.png", tmp_path)
    b = shot(f"file://{page}#step={last}", tmp_path / "g1.png", tmp_path)
    assert np.abs(a - b).max() > 100 and (np.abs(a - b) > 30).mean() > 0.002


def test_halving_doubling_page_steps_in_chromium(tmp_path):
    """Round 1 of halving-doubling on 8 ranks: partners 4 apart swap halves."""
    x = explain_run("halving_doubling", 8, 8)
    page = html.write(html.grid_model(x), str(tmp_path / "hd.html"))
    url = f"file://{page}"
    dom = chromium("--dump-dom", f"{url}#step=1", tmp_path=tmp_path)
    assert 'data-step="1"' in dom and f'data-steps="{x.rounds + 1}"' in dom
    assert "round 1: reduce-scatter step 0" in dom and "rank 0 -&gt; rank 4" in dom
    a = shot(f"{url}#step=0", tmp_path / "h0.png", tmp_path)
    b = shot(f"{url}#step={x.rounds}", tmp_path / "h6.png", tmp_path)
    region = (slice(110, 380), slice(260, 970))
    assert (a[region] < 250).mean() < 0.002, "step 0 draws nothing past the start column"
    assert (b[region] < 250).mean() > 0.02, "the last step draws its rounds"


def test_slow_link_lesson_page_steps_in_chromium(tmp_path):
    """The slow-link lesson's page: the moment the slow link paces the ring, then the
    schedule change; each step shows its own caption and picture."""
    from collectives.teaching.explain.slow_link_view import slow_link, slow_link_model

    m = slow_link_model(slow_link())
    page = html.write(m, str(tmp_path / "slow.html"))
    last = len(m["frames"]) - 1
    dom = chromium("--dump-dom", f"file://{page}#step=1", tmp_path=tmp_path)
    assert 'data-step="1"' in dom and "it paces the whole ring" in dom
    dom = chromium("--dump-dom", f"file://{page}#step={last}", tmp_path=tmp_path)
    assert f'data-step="{last}"' in dom and "change the schedule" in dom
    a = shot(f"file://{page}#step=1", tmp_path / "s1.png", tmp_path)
    b = shot(f"file://{page}#step={last}", tmp_path / "s4.png", tmp_path)
    assert np.abs(a - b).max() > 100 and (np.abs(a - b) > 30).mean() > 0.002


def test_replay_of_a_recorded_run_steps_in_chromium(tmp_path):
    """`python -m collectives.explain replay --html` as a user runs it: a real job of 3
    processes, rank 1 SIGKILLed, every process's messages merged; the page steps from the
    first all_reduce to the signal (rank 1 drawn dead) and on to the new generations."""
    import json
    import re
    import sys

    from support.procs import clean_env
    from support.timing import scaled

    page = tmp_path / "replay.html"
    run = subprocess.run(
        [sys.executable, "-m", "collectives.explain", "replay", "--html", str(page)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=scaled(90),
    )
    assert run.returncode == 0 and page.exists(), run.stderr[-2000:]
    titles = [
        json.loads(f'"{t}"') for t in re.findall(r'"title": "((?:[^"\\]|\\.)*)"', page.read_text())
    ]
    frames = titles[1:]  # the first is the page's own title
    signal = frames.index("SIGKILL to rank 1")
    assert 0 < signal < len(frames) - 1 and any("generation 1" in t for t in frames[signal:]), (
        frames
    )
    url = f"file://{page}"

    def rank1_fill(dom: str) -> str:
        """The fill of the circle drawn under rank 1's label, in the DOM Chromium built."""
        found = re.search(r'<circle [^>]*fill="([^"]+)"[^>]*></circle><text[^>]*>rank 1\b', dom)
        assert found, dom[-3000:]
        return found.group(1).lower()

    before = chromium("--dump-dom", f"{url}#step=0", tmp_path=tmp_path)
    dom = chromium("--dump-dom", f"{url}#step={signal}", tmp_path=tmp_path)
    assert f'data-step="{signal}"' in dom and f'data-steps="{len(frames)}"' in dom
    assert f"step {signal} of {len(frames) - 1}: SIGKILL to rank 1" in dom
    assert rank1_fill(before) == views.ALIVE.lower(), "rank 1 is alive at the first op"
    assert rank1_fill(dom) == views.DEAD.lower(), "rank 1 is drawn dead from the signal on"
    a = shot(f"{url}#step=0", tmp_path / "r0.png", tmp_path)
    b = shot(f"{url}#step={signal}", tmp_path / "r1.png", tmp_path)
    assert np.abs(a - b).max() > 100 and (np.abs(a - b) > 30).mean() > 0.002
