"""One self-contained page that plays, steps and scrubs through an explanation
(`python -m collectives.explain ALG ... --html FILE`).

The page holds a model -- plain JSON built here from the same run the PNGs are drawn from
(run.py's and exchange.py's replay of the trace; the failure stories' own records) -- and a
small script that draws it as SVG. Nothing is fetched: no CDN, no font, no image; it works
offline. Two kinds of model:

  grid   ranks as rows, rounds as columns, as drawing.py draws them: each buffer a row of
         cells coloured by chunk (or by sender), arrows the messages of each round. Step k
         shows the columns up to round k, round k's arrows bold.
  graph  ranks on a circle (the failure views): nodes coloured by their state, arrows the
         links or requests of that moment, and a caption per step.

The page reads `#step=K` (and writes it as you move), so a link or a headless browser can
open any step; the step shown is declared on <body data-step=K data-steps=N>. Keys: left /
right step, space plays, Home / End.
"""

from __future__ import annotations

import html as _html
import json
from typing import Any

import numpy as np

# matplotlib's tab10, so that the page's chunk colours are the PNGs'
TAB10 = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]


def _message_line(s: dict, rcv: dict, name: str) -> str:
    what = "added in" if rcv["kind"] == "reduce" else "copied in"
    return f"rank {s['src']} -> rank {s['dst']}  {name}  {s['nbytes']} B  {what}"


def grid_model(x: Any) -> dict:
    """The model of an explained all_reduce / reduce / broadcast (run.Explained) or exchange
    (exchange.ExplainedExchange): every column's cells and every round's arrows."""
    from . import exchange
    from .text import _chunk_name, _round_title, _steps_vary

    n = x.n
    frames = []
    scratch: list = []  # the ranks that sum into a scratch copy (an Explained's)
    if isinstance(x, exchange.ExplainedExchange):
        blocks = n if x.algorithm != "scatter" else 1
        title = f"{exchange.DESCRIPTION[x.algorithm]}, {n} ranks"
        legend = (
            "each rank's output, one cell per block, coloured by the rank that sent it "
            "(s>d: from s to d); dashed arrow = copied in"
        )

        def cells(buf):
            if buf is None:
                return None
            out = []
            for i in range(blocks):
                v = int(buf[i * x.count])
                out.append(
                    [
                        TAB10[((v - 1) // 64) % 10] if v else "#ffffff",
                        0.8 if v else 0.0,
                        exchange.block_label(v) if v else "",
                        False,
                    ]
                )
            return out

        def arrow(s, rcv):
            slot = s["src"] if blocks > 1 else 0
            return {
                "src": s["src"],
                "dst": s["dst"],
                "a": 1.0,
                "b": (slot + 0.5) / blocks,
                "color": TAB10[s["src"] % 10],
                "dashed": True,
            }

        def line(s, rcv):
            label = exchange.block_label(rcv["data"][0]) if rcv.get("data") else "(empty)"
            return f"rank {s['src']} -> rank {s['dst']}  {label}  {s['nbytes']} B"

        titles = [f"round {k}" for k in range(x.rounds + 1)]
    else:
        from .run import DESCRIPTION

        count, bounds = x.count, x.bounds
        scratch = x.scratch
        chunk_of = np.zeros(count, dtype=int)
        for i, (a, b) in enumerate(bounds):
            chunk_of[a:b] = i
        full = (1 << n) - 1
        title = f"{DESCRIPTION[x.algorithm]}, {n} ranks, {count} elements"
        legend = (
            ("cell colour = chunk; " if x.chunked else "arrow colour = sender; ")
            + "fill = share of ranks summed in (number shown); thick "
            "edge = final; solid arrow = received and added, dashed = copied"
            + (
                "; a rank marked (scratch) sums into a copy and returns its own buffer unchanged"
                if x.scratch
                else ""
            )
        )

        from .drawing import _uniform_chunks

        # as drawing.py: past 8 elements one cell per chunk
        spans = (
            list(bounds) if count > 8 and _uniform_chunks(x) else [(i, i + 1) for i in range(count)]
        )

        def frac(elem):
            for i, (a, b) in enumerate(spans):
                if elem < b or i == len(spans) - 1:
                    return (i + (elem - a) / max(b - a, 1)) / len(spans)
            return 0.0

        def cells(buf):
            out = []
            for a, b in spans:
                v = int(buf[a]) if b > a else 0
                k = bin(v).count("1")
                out.append(
                    [
                        TAB10[chunk_of[min(a, count - 1)] % 10 if x.chunked else 0],
                        0.0 if k == 0 else 0.18 + 0.82 * k / n,
                        str(k) if len(spans) <= 12 and n > 1 else "",
                        v == full,
                    ]
                )
            return out

        wrap = x.algorithm == "ring" and n > 3  # as drawing.py: the ring closes off the edge

        def arrow(s, rcv):
            a, c = s["offset"], s["count"]
            mid = frac(a + c / 2) if c else 0.0
            return {
                "src": s["src"],
                "dst": s["dst"],
                "a": mid,
                "b": mid,
                "color": (
                    TAB10[s["src"] % 10]
                    if not x.chunked
                    else TAB10[chunk_of[min(a, count - 1)] % 10]
                    if c
                    else "#808080"
                ),
                "dashed": rcv["kind"] != "reduce",
                "wrap": wrap and s["src"] == n - 1 and s["dst"] == 0,
            }

        def line(s, rcv):
            return _message_line(s, rcv, _chunk_name(s["offset"], s["offset"] + s["count"], bounds))

        vary = _steps_vary(x.events)
        titles = ["start"] + [
            f"round {k}: {_round_title(x.messages[k], vary)}" for k in range(1, x.rounds + 1)
        ]
    for k in range(x.rounds + 1):
        msgs = x.messages[k] if k else []
        frames.append(
            {
                "title": titles[k] if k else "start",
                "cells": [cells(b) for b in x.states[k]],
                "arrows": [arrow(s, r) for s, r in msgs],
                "text": [line(s, r) for s, r in msgs],
            }
        )
    hosts = getattr(x, "hosts", None)
    rows = [
        f"rank {r}"
        + (f" (host {hosts[r]})" if hosts is not None else "")
        + (" (scratch)" if r in scratch else "")
        for r in range(n)
    ]
    return {
        "kind": "grid",
        "title": title,
        "legend": legend,
        "rows": rows,
        "frames": frames,
        "summary": str(x.report),
    }


def page(model: dict) -> str:
    """The HTML page for a model: everything inline."""
    data = json.dumps(model).replace("</", "<\\/")
    return (
        _TEMPLATE.replace("@TITLE@", _html.escape(model["title"]))
        .replace("@MODEL@", data)
        .replace("@SCRIPT@", _SCRIPT)
    )


def write(model: dict, path: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(page(model))
    return path


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>@TITLE@</title>
<style>
body { font-family: sans-serif; margin: 12px; color: #222; background: #fff; }
h1 { font-size: 15px; margin: 0 0 6px 0; }
#bar { display: flex; gap: 8px; align-items: center; margin: 6px 0; }
#bar button { font-size: 13px; min-width: 34px; }
#scrub { flex: 1; max-width: 520px; }
#status { font-size: 13px; font-weight: bold; margin: 4px 0; }
#legend { font-size: 11px; color: #555; margin: 2px 0 6px 0; }
#text { font-size: 12px; background: #f6f6f6; padding: 6px; margin: 6px 0; white-space: pre; }
svg { border: 1px solid #ddd; background: #fff; max-width: 100%; height: auto; }
</style></head>
<body data-step="0" data-steps="0">
<h1>@TITLE@</h1>
<div id="legend"></div>
<div id="bar"><button id="first" title="Home">|&lt;</button><button id="prev" title="left">&lt;</button>
<button id="play" title="space">play</button><button id="next" title="right">&gt;</button>
<button id="last" title="End">&gt;|</button><input id="scrub" type="range" min="0" value="0">
</div>
<div id="status"></div>
<svg id="view" xmlns="http://www.w3.org/2000/svg"></svg>
<pre id="text"></pre>
<script type="application/json" id="model">@MODEL@</script>
<script>@SCRIPT@</script>
</body></html>
"""

_SCRIPT = r"""
(function () {
  var M = JSON.parse(document.getElementById('model').textContent);
  var last = M.frames.length - 1, step = 0, timer = null;
  var svg = document.getElementById('view'), scrub = document.getElementById('scrub');
  scrub.max = last;
  document.body.dataset.steps = String(last + 1);
  document.getElementById('legend').textContent = M.legend || '';
  function esc(s) { return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;'); }
  function head(x0, y0, x1, y1, color) {      // a filled arrowhead at (x1, y1)
    var a = Math.atan2(y1 - y0, x1 - x0), L = 8, W = 4;
    var p = [[x1, y1], [x1 - L * Math.cos(a) + W * Math.sin(a), y1 - L * Math.sin(a) - W * Math.cos(a)],
             [x1 - L * Math.cos(a) - W * Math.sin(a), y1 - L * Math.sin(a) + W * Math.cos(a)]];
    return '<polygon points="' + p.map(function (q) { return q[0].toFixed(1) + ',' + q[1].toFixed(1); }).join(' ') +
           '" fill="' + color + '"/>';
  }
  function curve(x0, y0, x1, y1, bend, color, width, dashed, opacity) {
    var mx = (x0 + x1) / 2, my = (y0 + y1) / 2, dx = x1 - x0, dy = y1 - y0;
    var cx = mx + bend * dy, cy = my - bend * dx;
    return '<g opacity="' + opacity + '"><path d="M' + x0 + ',' + y0 + ' Q' + cx + ',' + cy + ' ' + x1 + ',' + y1 +
      '" fill="none" stroke="' + color + '" stroke-width="' + width + '"' +
      (dashed ? ' stroke-dasharray="5,3"' : '') + '/>' + head(cx, cy, x1, y1, color) + '</g>';
  }
  function grid(k) {
    var n = M.rows.length, cols = M.frames.length, CW = 150, BW = 93, RH = 62, BH = 26, L = 120, T = 62;
    var w = L + cols * CW, h = T + n * RH + 40, out = [];
    function cx(c) { return L + c * CW + CW / 2; }
    function cy(r) { return T + r * RH + RH / 2; }
    for (var r = 0; r < n; r++)
      out.push('<text x="' + (L - 12) + '" y="' + (cy(r) + 4) + '" text-anchor="end" font-size="13">' + esc(M.rows[r]) + '</text>');
    for (var c = 0; c <= k; c++) {
      var f = M.frames[c], now = c === k;
      var t = c === 0 ? 'start' : 'round ' + c;
      out.push('<text x="' + cx(c) + '" y="' + (T - 30) + '" text-anchor="middle" font-size="12"' +
               (now ? ' font-weight="bold"' : '') + '>' + t + '</text>');
      for (var r2 = 0; r2 < n; r2++) {
        var cells = f.cells[r2], y = cy(r2) - BH / 2, x0 = cx(c) - BW / 2;
        if (cells === null) {
          out.push('<text x="' + cx(c) + '" y="' + (cy(r2) + 4) + '" text-anchor="middle" font-size="10" fill="#888">no output</text>');
          continue;
        }
        var cw = BW / cells.length;
        for (var i = 0; i < cells.length; i++) {
          var e = cells[i], xi = x0 + i * cw;
          out.push('<rect x="' + xi.toFixed(1) + '" y="' + y + '" width="' + cw.toFixed(1) + '" height="' + BH +
                   '" fill="' + e[0] + '" fill-opacity="' + e[1].toFixed(3) + '" stroke="#000" stroke-width="' + (e[3] ? 2.2 : 0.5) + '"/>');
          if (e[2]) out.push('<text x="' + (xi + cw / 2).toFixed(1) + '" y="' + (cy(r2) + 4) +
                             '" text-anchor="middle" font-size="' + (cw < 14 ? 8 : 10) + '">' + esc(e[2]) + '</text>');
        }
      }
    }
    for (var c2 = 1; c2 <= k; c2++) {
      M.frames[c2].arrows.forEach(function (a) {
        var x0 = cx(c2 - 1) - BW / 2 + a.a * BW, x1 = cx(c2) - BW / 2 + a.b * BW;
        var y0 = cy(a.src), y1 = cy(a.dst);
        if (y1 > y0) { y0 += BH / 2; y1 -= BH / 2; } else if (y1 < y0) { y0 -= BH / 2; y1 += BH / 2; }
        var now = c2 === k, lw = now ? 2.4 : 1.2, op = now ? 1 : 0.35;
        if (a.wrap) {     // the last rank to the first: off the bottom, in at the top
          var yb = cy(n - 1) + BH / 2, xm = (x0 + x1) / 2;
          out.push(curve(x0, yb, xm, yb + 22, 0, a.color, lw, a.dashed, op));
          out.push(curve(xm, cy(0) - BH / 2 - 22, x1, cy(0) - BH / 2, 0, a.color, lw, a.dashed, op));
          out.push('<text x="' + xm + '" y="' + (yb + 34) + '" text-anchor="middle" font-size="9" fill="' +
                   a.color + '" opacity="' + op + '">to ' + a.dst + '</text>');
          return;
        }
        out.push(curve(x0, y0, x1, y1, 0.08, a.color, lw, a.dashed, op));
      });
    }
    svg.setAttribute('width', w); svg.setAttribute('height', h);
    svg.setAttribute('viewBox', '0 0 ' + w + ' ' + h);
    svg.innerHTML = out.join('');
  }
  function graph(k) {
    var f = M.frames[k], n = f.nodes.length, R = 170, X = 300, Y = 230, NR = 38, out = [];
    if (f.note) out.push('<text x="300" y="460" text-anchor="middle" font-size="12" fill="#333">' + esc(f.note) + '</text>');
    var pos = [];
    for (var r = 0; r < n; r++) {
      var ang = Math.PI / 2 - 2 * Math.PI * r / n, nd0 = f.nodes[r];
      pos.push(nd0.x !== undefined ? [nd0.x, nd0.y] : [X + R * Math.cos(ang), Y - R * Math.sin(ang)]);
    }
    (f.arrows || []).forEach(function (a) {
      var p = pos[a.src], q = pos[a.dst], dx = q[0] - p[0], dy = q[1] - p[1], d = Math.sqrt(dx * dx + dy * dy) || 1;
      var x0 = p[0] + dx / d * NR, y0 = p[1] + dy / d * NR, x1 = q[0] - dx / d * (NR + 2), y1 = q[1] - dy / d * (NR + 2);
      var bend = a.bend === undefined ? 0.15 : a.bend;
      out.push(curve(x0, y0, x1, y1, bend, a.color, a.dashed ? 1.6 : 2.8, a.dashed, 1));
      if (a.label) {
        var mx = (x0 + x1) / 2 + bend * 0.75 * (y1 - y0), my = (y0 + y1) / 2 - bend * 0.75 * (x1 - x0);
        out.push('<text x="' + mx.toFixed(1) + '" y="' + my.toFixed(1) + '" text-anchor="middle" font-size="11" fill="' +
                 a.color + '" stroke="#fff" stroke-width="3" paint-order="stroke">' + esc(a.label) + '</text>');
      }
    });
    f.nodes.forEach(function (nd, r) {
      var p = pos[r];
      if (nd.hidden) return;
      out.push('<circle cx="' + p[0].toFixed(1) + '" cy="' + p[1].toFixed(1) + '" r="' + NR + '" fill="' + nd.color +
               '" stroke="#333" stroke-width="' + (nd.bold ? 3 : 1) + '"' + (nd.dashed ? ' stroke-dasharray="4,3"' : '') + '/>');
      out.push('<text x="' + p[0].toFixed(1) + '" y="' + (p[1] - 2).toFixed(1) + '" text-anchor="middle" font-size="13" font-weight="bold" fill="' +
               (nd.text || '#000') + '">' + esc(nd.label) + '</text>');
      if (nd.sub) out.push('<text x="' + p[0].toFixed(1) + '" y="' + (p[1] + 14).toFixed(1) +
                           '" text-anchor="middle" font-size="10" fill="' + (nd.text || '#000') + '">' + esc(nd.sub) + '</text>');
    });
    svg.setAttribute('width', 600); svg.setAttribute('height', 470);
    svg.setAttribute('viewBox', '0 0 600 470');
    svg.innerHTML = out.join('');
  }
  function render() {
    var f = M.frames[step];
    document.body.dataset.step = String(step);
    scrub.value = step;
    document.getElementById('status').textContent = 'step ' + step + ' of ' + last + ': ' + f.title;
    document.getElementById('text').textContent = (f.text || []).join('\n') +
      (step === last && M.summary ? (f.text && f.text.length ? '\n\n' : '') + M.summary : '');
    (M.kind === 'graph' ? graph : grid)(step);
  }
  function go(k) {
    step = Math.max(0, Math.min(last, k | 0));
    if (history.replaceState) history.replaceState(null, '', '#step=' + step);
    render();
  }
  function fromHash() {
    var m = /step=(\d+)/.exec(location.hash);
    step = m ? Math.max(0, Math.min(last, parseInt(m[1], 10))) : 0;
    render();
  }
  function play() {
    if (timer) { clearInterval(timer); timer = null; document.getElementById('play').textContent = 'play'; return; }
    if (step === last) go(0);
    document.getElementById('play').textContent = 'pause';
    timer = setInterval(function () { if (step >= last) play(); else go(step + 1); }, 900);
  }
  document.getElementById('first').onclick = function () { go(0); };
  document.getElementById('prev').onclick = function () { go(step - 1); };
  document.getElementById('next').onclick = function () { go(step + 1); };
  document.getElementById('last').onclick = function () { go(last); };
  document.getElementById('play').onclick = play;
  scrub.oninput = function () { go(parseInt(scrub.value, 10)); };
  document.addEventListener('keydown', function (e) {
    if (e.key === 'ArrowRight') go(step + 1);
    else if (e.key === 'ArrowLeft') go(step - 1);
    else if (e.key === 'Home') go(0);
    else if (e.key === 'End') go(last);
    else if (e.key === ' ') { play(); e.preventDefault(); }
  });
  window.addEventListener('hashchange', fromHash);
  fromHash();
})();
"""
