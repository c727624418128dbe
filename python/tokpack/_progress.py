"""Progress bars for long Rust work. The work runs in a helper thread with the GIL released;
the calling thread polls its counters, draws a bar on stderr, and turns Ctrl-C into a cancel
request the Rust side honours between units of work (so OUT_DIR is never left half-written)."""

from __future__ import annotations

import queue
import sys
import threading
import time
from typing import Any, Callable, Optional, TextIO

from . import _tokpack

__all__ = ["run_with_progress"]

_UNITS = {"reading": "units", "planning": "", "writing": "rows"}


def _fmt_eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60:d}:{seconds % 60:02d}"


class _Bar:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.phase = ""
        self.started = time.perf_counter()
        self.width = 0

    def draw(self, phase: str, done: int, total: int, samples: int) -> None:
        if phase != self.phase:
            if self.phase:
                self.stream.write("\n")
            self.phase, self.started = phase, time.perf_counter()
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        frac = done / total if total else 0.0
        bar = "#" * int(frac * 24)
        rate = done / elapsed
        eta = _fmt_eta((total - done) / rate) if rate > 0 and total else "?"
        extra = f" {samples:,} samples" if phase == "reading" else ""
        line = (
            f"{phase:>8} [{bar:<24}] {done:,}/{total:,} {_UNITS.get(phase, '')} "
            f"{rate:,.1f}/s ETA {eta}{extra}"
        )
        self.stream.write("\r" + line.ljust(self.width))
        self.width = len(line)
        self.stream.flush()

    def close(self) -> None:
        if self.phase:
            self.stream.write("\n")
            self.stream.flush()


def run_with_progress(
    work: Callable[[Any], Any], show: bool, stream: Optional[TextIO] = None
) -> Any:
    """Runs ``work(progress)`` in a thread; draws bars when ``show`` and the stream is a TTY."""
    stream = stream or sys.stderr
    progress = _tokpack.Progress()
    result: dict = {}
    began, done = _Flag(), _Flag()

    def target() -> None:
        began.set()
        try:
            result["value"] = work(progress)
        except BaseException as exc:  # re-raised in the calling thread
            result["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=target, name="tokpack-work", daemon=True)
    bar = _Bar(stream) if show and stream.isatty() else None
    try:
        thread.start()
        while not done.wait(0.1):
            if bar is not None:
                phase, done_units, total, samples = progress.snapshot()
                if phase in _UNITS:
                    bar.draw(phase, done_units, total, samples)
    except KeyboardInterrupt:
        progress.cancel()
        # A Ctrl-C inside thread.start() may land before the thread exists; once it exists it
        # begins at once, sees the cancel and stops.
        if _wait_uninterrupted(began, 1.0):
            _wait_uninterrupted(done, None)
        raise
    finally:
        if bar is not None:
            bar.close()
    if "error" in result:
        raise result["error"]
    return result["value"]


class _Flag:
    """A one-way flag set by the worker thread and awaited by the calling thread, which a Ctrl-C
    cannot break.

    Not ``threading.Event``: its Condition is Python code, and a KeyboardInterrupt that lands
    between taking its lock and entering the ``with`` block leaks the lock, so the worker's
    ``set()`` and every later wait block forever (seen: a Ctrl-C'd ``pack`` hung). Not
    ``Thread.join`` either: on CPython <= 3.12 a join interrupted by KeyboardInterrupt marks the
    still-running thread as stopped (bpo-45274). ``SimpleQueue`` is C code that signals cannot
    leave half-done; the boolean is the truth, the queue only wakes the waiter.
    """

    def __init__(self) -> None:
        self._set = False
        self._wake: "queue.SimpleQueue[None]" = queue.SimpleQueue()

    def set(self) -> None:
        self._set = True
        self._wake.put(None)

    def wait(self, timeout: float) -> bool:
        if not self._set:
            try:
                self._wake.get(timeout=timeout)
            except queue.Empty:
                pass
        return self._set


def _wait_uninterrupted(event: _Flag, timeout: Optional[float]) -> bool:
    """Waits for ``event`` (at most ``timeout`` seconds when given); further Ctrl-C presses do
    not cut the wait short (the output directory must not be removed while Rust threads still
    write into it)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            if event.wait(0.1):
                return True
        except KeyboardInterrupt:
            continue
        if deadline is not None and time.monotonic() >= deadline:
            return False
