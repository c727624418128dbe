"""Signals in the middle of a CLI run: start it, wait until work is under way (its temporary
output holds a first shard, or its worker processes exist), send the signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple


def _start(args: List[str]) -> Tuple[subprocess.Popen, "tempfile._TemporaryFileWrapper"]:
    # Its own session: a signal sent to it reaches no other process (pytest, the workers).
    # stderr goes to a file, not a pipe: a surviving worker would hold a pipe open forever.
    err = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokpack", *args], stderr=err, text=True, start_new_session=True
    )
    return proc, err


def _finish(proc: subprocess.Popen, err: "tempfile._TemporaryFileWrapper") -> Tuple[int, str]:
    proc.wait(timeout=60)
    with err:
        err.seek(0)
        return proc.returncode, err.read()


def interrupt_after_first_shard(
    args: List[str], out: Path, sig: int = signal.SIGINT
) -> Tuple[int, str]:
    """Runs ``python -m tokpack *args`` writing to ``out``; returns (exit code, stderr)."""
    proc, err = _start(args)
    prefix = f".{out.name}.tmp-"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        tmps = [p for p in out.parent.iterdir() if p.name.startswith(prefix)]
        if any(any(t.glob("part-*.parquet")) for t in tmps):
            break
        time.sleep(0.01)
    proc.send_signal(sig)
    return _finish(proc, err)


def signal_with_workers(args: List[str], sig: int, workers: int) -> Tuple[int, str, list]:
    """Runs ``python -m tokpack *args``, sends ``sig`` once it has ``workers`` child processes;
    returns (exit code, stderr, the children as ``psutil.Process``)."""
    import psutil

    proc, err = _start(args)
    parent = psutil.Process(proc.pid)
    children: list = []
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and len(children) < workers:
        children = parent.children(recursive=True)
        time.sleep(0.01)
    assert len(children) >= workers, "the workers never started"
    proc.send_signal(sig)
    return (*_finish(proc, err), children)


def survivors(processes: list, timeout: float = 30.0) -> list:
    """The processes still alive (zombies count as gone: nobody may reap an orphan) after at
    most ``timeout`` seconds."""
    import psutil

    def alive(p: "psutil.Process") -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + timeout
    left = [p for p in processes if alive(p)]
    while left and time.time() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    return left
