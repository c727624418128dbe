"""A one-line progress bar on stderr (share of input bytes read, samples, rate, ETA), shown only
on a terminal; tokpack keeps no dependency for it."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

__all__ = ["Progress"]


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Progress of a run over ``total_bytes`` of input; redraws at most every 0.2 s."""

    def __init__(
        self, total_bytes: int, label: str, enabled: bool, stream: Optional[TextIO] = None
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.total = max(total_bytes, 1)
        self.label = label
        self.done = 0
        self.samples = 0
        self.start = time.monotonic()
        self._last_draw = 0.0

    @classmethod
    def for_terminal(cls, total_bytes: int, label: str, quiet: bool) -> "Progress":
        """Enabled unless ``quiet`` or stderr is not a terminal."""
        return cls(total_bytes, label, enabled=not quiet and sys.stderr.isatty())

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        self._maybe_draw()

    def add_samples(self, n: int) -> None:
        self.samples += n
        self._maybe_draw()

    def _maybe_draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.2:
            return
        self._last_draw = now
        elapsed = max(now - self.start, 1e-9)
        share = min(self.done / self.total, 1.0)
        eta = _clock(elapsed * (1 - share) / share) if share > 0 else "?"
        width = 24
        filled = int(share * width)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(
            f"\r{self.label} [{bar}] {share:6.1%}  {self.samples:,} samples  "
            f"{self.samples / elapsed:,.0f}/s  elapsed {_clock(elapsed)}  ETA {eta} "
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.done = self.total
            self._maybe_draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
