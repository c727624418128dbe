"""Whether a process is alive: the one test of "the run that left this died" (temporaries of
output directories and downloads, shared-memory batches and row groups of dead workers)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True
