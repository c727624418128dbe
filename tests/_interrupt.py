"""Ctrl-C in the middle of a CLI run: start it, wait until its temporary output holds a first
shard (work is under way, most of it still ahead), send SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Tuple


def interrupt_after_first_shard(args: List[str], out: Path) -> Tuple[int, str]:
    """Runs ``python -m tokpack *args`` writing to ``out``; returns (exit code, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokpack", *args], stderr=subprocess.PIPE, text=True
    )
    prefix = f".{out.name}.tmp-"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        tmps = [p for p in out.parent.iterdir() if p.name.startswith(prefix)]
        if any(any(t.glob("part-*.parquet")) for t in tmps):
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err
