"""Fault injection for the Ray tests, installed in every Ray worker process at start-up
(``worker_process_setup_hook``): once ``$TOKPACK_TEST_FAULTS/armed`` exists, the first shard
write of the cluster completes and its worker is then killed (SIGKILL) before the task returns,
so Ray must retry a task whose files are already half in place."""

import os
import signal
from pathlib import Path


def install() -> None:
    faults = os.environ.get("TOKPACK_TEST_FAULTS")
    if not faults:
        return
    from tokpack import _tokpack

    real = _tokpack.write_held_shard

    def write_then_die(**kwargs):
        info = real(**kwargs)
        if (Path(faults) / "armed").exists():
            try:
                os.close(os.open(Path(faults) / "fired", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return info
            os.kill(os.getpid(), signal.SIGKILL)
        return info

    _tokpack.write_held_shard = write_then_die
