"""Writes docs/tutorial.ipynb (the tutorial as cells) and executes it, so that it is
committed with its outputs: `python tools/make_tutorial_notebook.py` from the repository root
after changing a cell here or a picture's code (tests/system/test_notebook.py executes the notebook
again and checks that every picture comes out the same). Cells tagged `varies` start a real
job; their pictures hold timings, and the test only checks that they draw."""

import subprocess
import sys
import tempfile

import nbclient
import nbformat as nbf


def md(text):
    return nbf.v4.new_markdown_cell(text)


def code(text, tags=None):
    cell = nbf.v4.new_code_cell(text)
    if tags:
        cell.metadata["tags"] = tags
    return cell


nb = nbf.v4.new_notebook()
nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
nb.cells = [
    md(
        "# collectives: all_reduce, step by step\n\nThe tutorial of `docs/tutorial.md` as cells you can run. Most of it runs on threads in this process (`cl.simulate`): the very algorithms that run across processes over ZeroMQ, with no sockets. The failures chapter at the end also starts a small real job (a coordinator here, worker processes). The notebook is committed with its outputs; `tests/system/test_notebook.py` executes it again and checks that every picture comes out the same (the real job's timings vary, so its cells, tagged `varies`, are only checked to draw)."
    ),
    code(
        "import numpy as np\nimport collectives as cl\nfrom IPython.display import Image, display\nfrom collectives.teaching import explain, failures, stall\nfrom collectives.teaching.explain import io, views"
    ),
    md(
        "## Ring and tree on threads\n\nRank r contributes r + 1 in every element; on n ranks every element of the result is n(n+1)/2 on every rank, whichever algorithm ran."
    ),
    code(
        "def job(algorithm):\n    def fn(pg):\n        x = np.full(6, pg.rank + 1, np.float32)\n        pg.all_reduce(x, algorithm=algorithm)\n        return x\n    return fn\n\nfor algorithm in ('ring', 'tree'):\n    results = cl.simulate(4, job(algorithm))\n    print(algorithm, results[0])\n    assert all((r == 10).all() for r in results)"
    ),
    md(
        "## What each collective takes and gives\n\nEach collective run for real on 4 threads; every element named by its letter and the rank it came from (`b2`), `Σb` the sum of element b over every rank. Here all_reduce, reduce_scatter and all_to_all; `io.COLLECTIVES` lists all ten pictures (send and recv share one)."
    ),
    code(
        "for name in ('all_reduce', 'reduce_scatter', 'all_to_all'):\n    x = io.run_io(name, 4)\n    print(io.text(x))\n    display(Image(io.draw(x, f'io_{name}.png')))"
    ),
    md(
        "## A buffer that tells its story\n\n`explain_run` gives rank r the value 2^r, so any partial sum is a set of ranks written in binary (5 = 0b101: ranks 0 and 2). Here is the ring, round by round: reduce-scatter, then all-gather."
    ),
    code(
        "x = explain.explain_run('ring', 3, 6)\nprint(explain.text(x))\ndisplay(Image(explain.draw(x, 'ring_3x6.png')))"
    ),
    code("x = explain.explain_run('tree', 4, 4)\ndisplay(Image(explain.draw(x, 'tree_4x4.png')))"),
    md(
        "## Step through a ring\n\nWith `step=True` every rank pauses before each send and receive; `step()` lets one event happen. Nothing moves until you say so, so the run is deterministic."
    ),
    code(
        "s = cl.simulate(3, job('ring'), step=True)\nprint(s.pending())\nfor _ in range(4):\n    e = s.step()\n    print(e['rank'], e['kind'], 'peer', e['peer'], e['phase'], 'step', e['step'])\nprint([r[0] for r in s.results()])\ns.close()"
    ),
    md(
        "## The model: ring, tree, halving-doubling\n\nIn the alpha-beta model (a message of m bytes costs alpha + m beta, and holds its sender's and its receiver's port that long), the tree (2 ceil(log2 n) rounds) wins for small buffers from n = 4 on (at n = 2 and 3 it takes as many rounds as the ring and moves more bytes: the ring is never slower) and the ring (2(n-1)/n of the buffer per rank) for large ones; halving-doubling has the tree's rounds and the ring's bytes when n is a power of two. `crossover` runs them on emulated links (a virtual clock per rank) beside the model's closed forms."
    ),
    code(
        "alpha, beta, n = 50e-6, 1e-9, 8\nrows = explain.crossover(alpha, beta, n, [256, 4096, 65536, 1 << 20])\nprint(explain.crossover_text(rows, alpha, beta, n))\ndisplay(Image(explain.crossover_plot(rows, alpha, beta, n, 'crossover.png')))"
    ),
    code(
        "x = explain.explain_run('halving_doubling', 8, 8)\nprint(x.report)\ndisplay(Image(explain.draw(x, 'halving_doubling_8x8.png')))"
    ),
    md(
        "## A slow link\n\nOne link ten times slower (alpha and beta): on the ring's path it paces every step; a tree pays only where the link is one of its edges; the library reorders the ring to leave it out."
    ),
    code(
        "from collectives.teaching.explain.slow_link_view import slow_link, slow_link_model\nlesson = slow_link_model(slow_link())\nprint(views.text(lesson))\ndisplay(Image(views.draw_panels(lesson, 'slow_link.png')))"
    ),
    md(
        "## When things fail: a stall diagnosed\n\nLinks 0->1 and 1->2 hold back every message; the op passes its deadline, and the diagnosis finds who waits on whom, which links are stalled (sent but not taken), and blames the fewest ranks that between them touch every stalled link. `story.evidence` is what decided (timed probes where the verdict carries them)."
    ),
    code(
        "story = stall.run_stall(3, culprit=1)\nprint(stall.text(story))\nprint(story.evidence)\ndisplay(Image(stall.draw(story, 'stall_3.png')))"
    ),
    md(
        "When the op's own picture ties (one stalled link, two ends), every link is probed and the probes decide. Hold back 2->0 and 1->0: the ring only shows 2->0 stalled, the probes find 1->0 silent too, and rank 0 is on both."
    ),
    code(
        "story = stall.run_stall(3, culprit=1, links=[(2, 0), (1, 0)])\nprint(stall.text(story))\nfor p in story.evidence['probes']:\n    print(p)\ndisplay(Image(stall.draw(story, 'stall_probes.png')))"
    ),
    md(
        "## Commit or drop, stepped\n\nRank 1 stops in the middle of a ring all_reduce; the others run until they cannot move. The op counts only if every survivor holds its result (membership/diagnose.py `outcome`), so survivors never disagree on which operations counted."
    ),
    code(
        "early = failures.stepped_crash(3, victim=1, after=2)\nlate = failures.stepped_crash(3, victim=1, after=7)\nprint('stops early:', early.held, '->', early.outcome)\nprint('stops late: ', late.held, '->', late.outcome)\nprint('who waits on what when it stopped early:')\nfor r, p in early.pending.items():\n    print(' rank', r, 'nothing' if p is None else f\"{p['kind']} {p['phase']} with rank {p['peer']}\")"
    ),
    md(
        "## A real job: SIGKILL, reconstruction, a joiner\n\nThree worker processes train a toy model (each committed training step adds the number of ranks that took part; \"step\" here is a training step, not a step of an algorithm). Rank 1 is SIGKILLed in training step 3; the survivors learn it from a kernel's witness (the coordinator's pidfd of the process, or their closed connections: the errors name which); step 3 is dropped and redone in generation 1, where old rank 2 is rank 1; then a joiner is admitted as rank 2 of generation 2 and given the model. A few seconds; the timings vary from run to run."
    ),
    code(
        "job = failures.run_story('KILL')\nprint(views.text(views.crash_model(job, early)))\nprint(f'found {job.detection:.2f} s after the signal; renumbered {job.renumbering()}')\ndisplay(Image(views.draw_panels(views.crash_model(job, early), 'crash.png')))",
        tags=["varies"],
    ),
    code(
        "print(views.text(views.reconstruct_model(job)))\ndisplay(Image(views.draw_panels(views.reconstruct_model(job), 'reconstruct.png')))",
        tags=["varies"],
    ),
    code(
        "print(views.text(views.join_model(job)))\ndisplay(Image(views.draw_panels(views.join_model(job), 'join.png')))\nfinals = job.finals()\nassert len({tuple(e['model']) for e in finals.values()}) == 1, finals\nprint('every rank ends with model', next(iter(finals.values()))['model'])",
        tags=["varies"],
    ),
]

with tempfile.TemporaryDirectory() as where:  # the pictures the cells write go here
    nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": where}}
    ).execute()
for cell in nb.cells:
    cell.metadata.pop("execution", None)
nbf.write(nb, "docs/tutorial.ipynb")
# the cells' code in the house style (make lint checks the notebook too)
subprocess.run([sys.executable, "-m", "ruff", "format", "-q", "docs/tutorial.ipynb"], check=True)
print("wrote docs/tutorial.ipynb with its outputs")
