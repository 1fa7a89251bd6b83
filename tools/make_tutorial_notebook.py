"""Writes docs/tutorial.ipynb (the tutorial as cells): python tools/make_tutorial_notebook.py
(run from the repository root after changing a cell here; tests/system/test_notebook.py executes it)."""
import nbformat as nbf

nb = nbf.v4.new_notebook()
md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
nb.cells = [
    md("# collectives: all_reduce, step by step\n\n"
       "The tutorial of `docs/tutorial.md` as cells you can run. Everything here runs on "
       "threads in this process (`cl.simulate`): the very algorithms that run across "
       "processes over ZeroMQ, with no sockets. `make test` executes this notebook "
       "(tests/system/test_notebook.py), so every cell works."),
    code("import numpy as np\n"
         "import collectives as cl\n"
         "from IPython.display import Image, display\n"
         "from collectives.teaching import explain"),
    md("## Ring and tree on threads\n\n"
       "Rank r contributes r + 1 in every element; on n ranks every element of the result is "
       "n(n+1)/2 on every rank, whichever algorithm ran."),
    code("def job(algorithm):\n"
         "    def fn(pg):\n"
         "        x = np.full(6, pg.rank + 1, np.float32)\n"
         "        pg.all_reduce(x, algorithm=algorithm)\n"
         "        return x\n"
         "    return fn\n\n"
         "for algorithm in ('ring', 'tree'):\n"
         "    results = cl.simulate(4, job(algorithm))\n"
         "    print(algorithm, results[0])\n"
         "    assert all((r == 10).all() for r in results)"),
    md("## A buffer that tells its story\n\n"
       "`explain_run` gives rank r the value 2^r, so any partial sum is a set of ranks written "
       "in binary (5 = 0b101: ranks 0 and 2). Here is the ring, round by round: "
       "reduce-scatter, then all-gather."),
    code("x = explain.explain_run('ring', 3, 6)\n"
         "print(explain.text(x))\n"
         "display(Image(explain.draw(x, 'ring_3x6.png')))"),
    code("x = explain.explain_run('tree', 4, 4)\n"
         "display(Image(explain.draw(x, 'tree_4x4.png')))"),
    md("## Step through a ring\n\n"
       "With `step=True` every rank pauses before each send and receive; `step()` lets one "
       "event happen. Nothing moves until you say so, so the run is deterministic."),
    code("s = cl.simulate(3, job('ring'), step=True)\n"
         "print(s.pending())\n"
         "for _ in range(4):\n"
         "    e = s.step()\n"
         "    print(e['rank'], e['kind'], 'peer', e['peer'], e['phase'], 'step', e['step'])\n"
         "print([r[0] for r in s.results()])\n"
         "s.close()"),
    md("## The ring/tree crossover\n\n"
       "The alpha-beta model says the tree (2 log2 n rounds) wins for small buffers and the "
       "ring (2(n-1)/n of the buffer per rank) for large ones. `crossover` runs both on "
       "emulated links (a latency alpha and a bandwidth beta on a virtual clock) beside the "
       "model's prediction."),
    code("alpha, beta, n = 50e-6, 1e-9, 8\n"
         "rows = explain.crossover(alpha, beta, n, [256, 4096, 65536, 1 << 20])\n"
         "print(explain.crossover_text(rows, alpha, beta, n))\n"
         "display(Image(explain.crossover_plot(rows, alpha, beta, n, 'crossover.png')))"),
]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                             "language": "python"}
nbf.write(nb, "docs/tutorial.ipynb")
