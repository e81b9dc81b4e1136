"""Progress of a long diagnosis on stderr: bytes read and lines per second, once it has taken more than a second.

On a terminal one line is rewritten in place (``\\r``); otherwise a line is printed every few seconds. Nothing is
printed for a log read in under a second, with ``--quiet``, or under ``--json`` (the command decides)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

AFTER_S = 1.0


class Progress:
    def __init__(self, total_bytes: int | None = None, stream: TextIO | None = None, after_s: float | None = None,
                 clock=time.monotonic) -> None:
        self.total = total_bytes
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = 0.25 if self.tty else 5.0
        self.after = AFTER_S if after_s is None else after_s
        self.clock = clock
        self.t0 = clock()
        self.next = self.t0 + self.after
        self.shown = False

    def line(self, bytes_read: int, lines: int) -> str:
        dt = max(self.clock() - self.t0, 1e-9)
        of = f" of {self.total / 1e6:,.0f} MB" if self.total else ""
        return (f"oomdoctor: {bytes_read / 1e6:,.0f} MB{of} read, {lines:,} lines matched through, "
                f"{lines / dt / 1e6:,.2f}M lines/s")

    def update(self, bytes_read: int, lines: int) -> None:
        """``bytes_read``: of the file so far; ``lines``: the line the matcher has reached."""
        now = self.clock()
        if now < self.next:
            return
        self.next = now + self.every
        self.shown = True
        self.stream.write(("\r" if self.tty else "") + self.line(bytes_read, lines) + ("" if self.tty else "\n"))
        self.stream.flush()

    def done(self, bytes_read: int, lines: int) -> None:
        if self.shown:
            self.stream.write(("\r" if self.tty else "") + self.line(bytes_read, lines) + " (done)\n")
            self.stream.flush()
