"""How buffers are cut: into one chunk per rank, and chunks into pipelined segments."""

from __future__ import annotations

from collections.abc import Callable

from ..common.channel import Channel

Bounds = list[tuple[int, int]]  # [start, end) element ranges, one per chunk
OnPiece = Callable[[int, int], None]  # called with a piece's [start, end) (ring.py's hooks)


def chunk_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """Split range(count) into `parts` contiguous chunks whose sizes differ by at most one.

    >>> chunk_bounds(7, 3)
    [(0, 3), (3, 5), (5, 7)]
    """
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def weighted_bounds(count: int, weights: tuple[float, ...] | list[float]) -> Bounds:
    """Split range(count) into len(weights) contiguous chunks, chunk i about weights[i] / sum
    of them (the cut points rounded down; the last chunk ends at count).

    >>> weighted_bounds(10, [0.0, 0.25, 0.75])
    [(0, 0), (0, 2), (2, 10)]
    """
    total = sum(weights)
    bounds, start, acc = [], 0, 0.0
    for i, w in enumerate(weights):
        acc += w
        end = count if i == len(weights) - 1 else min(count, int(count * acc / total))
        bounds.append((start, max(start, end)))
        start = max(start, end)
    return bounds


def segments(start: int, end: int, seg_elems: int) -> list[tuple[int, int]]:
    """Cut [start, end) into pieces of at most seg_elems elements. An empty range still gives
    one empty piece, so every step of a schedule sends a message and headers always flow."""
    if end <= start:
        return [(start, start)]
    return [(a, min(a + seg_elems, end)) for a in range(start, end, seg_elems)]


def segment_elems(ch: Channel, itemsize: int) -> int:
    return max(1, ch.segment_bytes // max(1, itemsize))
