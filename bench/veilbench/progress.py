"""A dependency-free progress bar (one line, redrawn in place on a TTY;
one line per step otherwise, so logs of CI runs stay readable)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, stream=sys.stderr, width: int = 28) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.width = width
        self.start = time.monotonic()
        self.tty = stream.isatty()

    def step(self, label: str) -> None:
        """Announce the step about to run."""
        self._draw(label)

    def advance(self, label: str = "") -> None:
        self.done += 1
        self._draw(label)

    def message(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, label: str) -> None:
        frac = self.done / self.total
        filled = int(frac * self.width)
        elapsed = time.monotonic() - self.start
        eta = ""
        if self.done:
            eta = f" eta {_hms(elapsed / self.done * (self.total - self.done))}"
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done}/{self.total} {_hms(elapsed)}{eta}  {label}"
        if self.tty:
            self.stream.write("\r\033[K" + line[:160])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
