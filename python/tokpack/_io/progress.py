"""The one progress display, for the Rust phases and the tokenize byte counter. Long Rust work
runs in a helper thread with the GIL released; the calling thread polls its counters, draws
them, and turns Ctrl-C into a cancel request the Rust side honours between units of work (so
OUT_DIR is never left half-written)."""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from typing import Any, Callable, Optional, TextIO

from .. import _tokpack
from .objects import shown_message

# Phase -> what its counts count ("bytes" are shown in MB).
_UNITS = {"tokenize": "bytes", "reading": "units", "planning": "", "writing": "rows"}
_WIDTH = 24


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _amount(n: float, unit: str) -> str:
    return f"{n / 1e6:,.1f}" if unit == "bytes" else f"{n:,.0f}"


class Progress:
    """``phase [####    ]  42.0% done/total unit rate/s ETA m:ss N samples``, redrawn in place
    at most every 0.1 s, one line per phase, when ``show`` and the stream (default stderr) is a
    terminal. The tokenize phase counts ``total_bytes`` of input, as
    :class:`tokpack.tokenize.TokenStream` reports them (:meth:`advance`, :meth:`add_samples`)."""

    def __init__(self, show: bool, stream: Optional[TextIO] = None, total_bytes: int = 0) -> None:
        stream = stream if stream is not None else sys.stderr
        self.stream = stream if show and stream.isatty() else None
        self.phase = ""
        self.width = 0
        self._started = self._drawn = 0.0
        self._done, self._total, self._samples = 0, total_bytes, 0

    def draw(self, phase: str, done: int, total: int, samples: Optional[int] = None) -> None:
        if self.stream is None:
            return
        now = time.perf_counter()
        if phase != self.phase:
            if self.phase:
                self.stream.write("\n")
            self.phase, self._started, self.width = phase, now, 0
        elif now - self._drawn < 0.1 and done < total:
            return
        self._drawn = now
        unit = _UNITS.get(phase, "")
        elapsed = max(now - self._started, 1e-9)
        share = min(done / total, 1.0) if total else 0.0
        rate = done / elapsed
        eta = _clock((total - done) / rate) if rate > 0 and total else "?"
        line = (
            f"{phase:>8} [{'#' * int(share * _WIDTH):<{_WIDTH}}] {share:6.1%} "
            f"{_amount(done, unit)}/{_amount(total, unit)} {unit.replace('bytes', 'MB')} "
            f"{_amount(rate, unit)}/s ETA {eta}"
            + ("" if samples is None else f" {samples:,} samples")
        )
        self.stream.write("\r" + line.ljust(self.width))
        self.width = len(line)
        self.stream.flush()

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        self.draw("tokenize", self._done, self._total, self._samples)

    def add_samples(self, n: int) -> None:
        self._samples += n
        self.draw("tokenize", self._done, self._total, self._samples)

    def close(self) -> None:
        """Ends the current line (a byte-counted phase is shown complete first)."""
        if self.stream is None or not self.phase:
            return
        if self._total:
            self.draw("tokenize", self._total, self._total, self._samples)
        self.stream.write("\n")
        self.stream.flush()
        self.phase = ""


def run_with_progress(
    work: Callable[[Any], Any], show: bool, stream: Optional[TextIO] = None
) -> Any:
    """Runs ``work(progress)`` in a thread; draws its phases when ``show`` and the stream
    (default stderr) is a terminal."""
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
    display = Progress(show, stream)
    try:
        thread.start()
        while not done.wait(0.1):
            if display.stream is not None:
                phase, done_units, total, samples = progress.snapshot()
                if phase in _UNITS:
                    display.draw(phase, done_units, total, samples if phase == "reading" else None)
    except KeyboardInterrupt:
        progress.cancel()
        # A Ctrl-C inside thread.start() may land before the thread exists; once it exists it
        # begins at once, sees the cancel and stops.
        if _wait_uninterrupted(began, 1.0):
            _wait_uninterrupted(done, None)
        raise
    finally:
        display.close()
    if "error" in result:
        error = result["error"]
        if error.args and isinstance(error.args[0], str):  # name objects, not their copies
            error.args = (shown_message(error.args[0]), *error.args[1:])
        raise error
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
            with contextlib.suppress(queue.Empty):
                self._wake.get(timeout=timeout)
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
