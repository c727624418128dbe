"""Fault injection for the Ray tests, installed in every Ray worker process at start-up
(``worker_process_setup_hook``): once ``$TOKPACK_TEST_FAULTS/armed`` exists, the first shard
write of the cluster completes and its worker is then killed (SIGKILL) before the task returns,
so Ray must retry a task whose files are already half in place. Likewise, in a worker started
once ``armed-encode`` exists, the first chunk a ``tokpack tokenize --ray`` task encodes is done
and its worker then killed, so Ray must run the chunk again."""

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
            _die_once(Path(faults) / "fired")
        return info

    _tokpack.write_held_shard = write_then_die
    if (Path(faults) / "armed-encode").exists():  # (the tokenizing stack is slow to import)
        from tokpack.tokenize import pipeline

        real_run = pipeline.run_packed

        def run_then_die(encoding, packed):
            out = real_run(encoding, packed)
            _die_once(Path(faults) / "fired-encode")
            return out

        pipeline.run_packed = run_then_die


def _die_once(marker: Path) -> None:
    """SIGKILL of this process, the first time any process of the cluster gets here."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)
