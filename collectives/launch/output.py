"""The launcher's output: each worker's stdout and stderr copied to the launcher's, a
"[rank N] " prefix on every line, whole lines only (collectives.launch)."""

from __future__ import annotations

import os
import re
import threading

_END = re.compile(rb"[\r\n]")  # what ends a line


class Prefixer:
    """Copies a worker's pipe to our stream as it comes, each line prefixed with its rank.

    A line ends at "\n" or at "\r": a progress bar redraws its line with carriage returns,
    and each redraw is forwarded at once with its "\r", so the bar moves live in a terminal
    (tqdm's output, "\rtrain 10%...\rtrain 11%...", arrives as one endless line otherwise).
    A line that grows past MAX_LINE bytes is cut there, so no line is without bound."""

    lock = threading.Lock()  # one line at a time across all workers, never interleaved
    MAX_LINE = 16 << 10

    def __init__(self, pipe, out, prefix: bytes):
        self.pipe, self.out, self.prefix = pipe, out, prefix
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _copy(self):
        fd, pending = self.pipe.fileno(), b""
        try:
            while True:
                chunk = os.read(fd, 65536)  # returns what is there: no wait for a newline
                if not chunk:
                    break
                pending = self._emit(pending + chunk)
            if pending:
                self._write(pending + b"\n")  # a last line without a newline
        except OSError:
            pass
        finally:
            self.pipe.close()

    def _emit(self, data: bytes) -> bytes:
        """Write every complete line of `data`; return the unfinished rest."""
        start = 0
        for m in _END.finditer(data):  # linear: one pass over the terminators
            end = m.end()
            if end - start > 1 or m.group() == b"\n":  # a lone \r: a bar's reset
                self._write_cut(data[start : end - 1], data[end - 1 : end])
            start = end
        rest = data[start:]
        cut = len(rest) - len(rest) % self.MAX_LINE
        if cut:  # an endless line: write whole pieces now
            self._write_cut(rest[:cut], b"")
        return rest[cut:]

    def _write_cut(self, text: bytes, end: bytes):
        """`text` + `end` as lines of at most MAX_LINE bytes (the pieces end with \n)."""
        while len(text) > self.MAX_LINE:
            self._write(text[: self.MAX_LINE] + b"\n")
            text = text[self.MAX_LINE :]
        if text or end:
            self._write(text + (end or b"\n"))

    def _write(self, line: bytes):
        with self.lock:
            try:
                self.out.write(self.prefix + line)
                self.out.flush()
            except (BrokenPipeError, ValueError):
                pass  # our reader went away; keep draining
