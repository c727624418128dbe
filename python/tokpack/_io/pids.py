"""Whether a process is alive: the one test of "the run that left this died" (temporaries of
output directories and downloads, shared-memory batches and row groups of dead workers)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from typing import Union


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def remove_dead_temporaries(parent: Union[str, os.PathLike], pattern: "re.Pattern[str]") -> None:
    """Removes the entries of ``parent`` whose name ``pattern`` matches with the pid of a run
    that died (its first group): a run's temporary files and directories."""
    with contextlib.suppress(OSError), os.scandir(str(parent)) as entries:
        for entry in list(entries):
            found = pattern.fullmatch(entry.name)
            if found is None or pid_alive(int(found[1])):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
